# Stage 4: train one DIVERSED ensemble head per training dataset and round on the traces so far
# (cheap; no LM runs). Round r starts from round r - 1's head; lambda and the epoch are chosen on
# validation prompts held out of the traces (never the test split), by the validation objective.
# The chosen head is then checked on-policy against the static rule at its own mean w (held-out
# train prompts, the same seeds in both arms) and kept with that verdict in its card
# (diversed/jobs/check.py); the report prints the verdict beside the head.


rule train_head:
    input:
        traces=lambda w: [f"results/traces/{w.train_dataset}/r{r}.done" for r in range(1, int(w.round) + 1)],
        init=previous_head,
    output:
        head=directory("results/candidates/{train_dataset}/s{seed}/r{round}"),
    params:
        traces=lambda w, input: " ".join(t.removesuffix(".done") for t in input.traces),
        init=lambda w, input: f"--init {input.init[0]}" if input.init else "",
        epochs=HEAD["epochs"],
        batch_size=HEAD["train_batch_size"],
        lr=HEAD["lr"],
        signals="--signals" if HEAD["signals"] else "",
        reg_lambda=" ".join(str(x) for x in as_list(HEAD["reg_lambda"])),
        reg_scale=HEAD["reg_scale"],
        baseline=HEAD["baseline"],
        validation_share=HEAD["validation_share"],
        value=HEAD["check_acceptance_value"],
        min_weight_std=HEAD["min_weight_std"],
        confidence=HEAD["select_confidence"],
        seed=lambda w: int(w.seed),
        device=DEVICE,
        src=code_hash("diversed.training"),
    resources:
        gpu=GPU,
    log:
        "results/logs/candidates/{train_dataset}/s{seed}/r{round}.log",
    conda:
        SOFTWARE
    shell:
        "diversed --track 'train_head {wildcards.train_dataset} s{wildcards.seed} r{wildcards.round}' train-head --traces {params.traces} {params.init} --out {output.head}"
        " --device {params.device}"
        " --epochs {params.epochs} --batch-size {params.batch_size} --lr {params.lr} {params.signals}"
        " --reg-lambda {params.reg_lambda} --reg-scale {params.reg_scale} --baseline {params.baseline}"
        " --validation-share {params.validation_share} --acceptance-value {params.value}"
        " --min-weight-std {params.min_weight_std} --confidence {params.confidence}"
        " --seed {params.seed} --quiet > {log} 2>&1"


rule check_head:
    input:
        candidate="results/candidates/{train_dataset}/s{seed}/r{round}",
        traces=lambda w: [f"results/traces/{w.train_dataset}/r{r}.done" for r in range(1, int(w.round) + 1)],
    output:
        head=directory("results/heads/{train_dataset}/s{seed}/r{round}"),
    params:
        offline=OFFLINE,
        sandbox=SANDBOX,
        traces=lambda w, input: " ".join(t.removesuffix(".done") for t in input.traces),
        models=model_flags(),
        dataset=lambda w: head_source(w.train_dataset)[0],
        split=lambda w: head_source(w.train_dataset)[1],
        n=HEAD["check_examples"],
        rollouts=HEAD["check_rollouts"],
        partial="--partial-credit" if HEAD["partial_credit"] else "",
        value=HEAD["check_acceptance_value"],
        max_new_tokens=HEAD["max_new_tokens"],
        temperature=HEAD["temperature"],
        draft_length=HEAD["draft_length"],
        batch_size=HEAD["batch_size"],
        confidence=HEAD["select_confidence"],
        seed=lambda w: int(w.seed) + 1000 + int(w.round),
        flags=data_flags(),
        run=run_flags(),
        src=code_hash("diversed.jobs.check", "diversed.training"),
    threads: 2
    resources:
        gpu=GPU,
    log:
        "results/logs/heads/{train_dataset}/s{seed}/r{round}.log",
    conda:
        SOFTWARE
    shell:
        "({params.offline} diversed --track 'check_head {wildcards.train_dataset} s{wildcards.seed} r{wildcards.round}' check-head --candidate {input.candidate} --traces {params.traces}"
        " --out {output.head} --log results/checks/{wildcards.train_dataset}/s{wildcards.seed}/r{wildcards.round}.jsonl"
        " --dataset {params.dataset} --split {params.split} --n-examples {params.n} --rollouts {params.rollouts}"
        " {params.partial} --max-new-tokens {params.max_new_tokens} --temperature {params.temperature}"
        " --draft-length {params.draft_length} --batch-size {params.batch_size} {params.run}"
        " --confidence {params.confidence} --acceptance-value {params.value} --seed {params.seed}"
        " {params.models} --sandbox {params.sandbox} {params.flags}) > {log} 2>&1"
