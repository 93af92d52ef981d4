# Stage 4: train one DIVERSED ensemble head per training dataset and round on the traces so far
# (cheap; no LM runs). Round r starts from round r - 1's head; lambda and the epoch are chosen on
# validation prompts held out of the traces (never the test split).


rule train_head:
    input:
        traces=lambda w: [f"results/traces/{w.train_dataset}/r{r}.done" for r in range(1, int(w.round) + 1)],
        init=previous_head,
    output:
        head=directory("results/heads/{train_dataset}/r{round}"),
    params:
        traces=lambda w, input: " ".join(t.removesuffix(".done") for t in input.traces),
        init=lambda w, input: f"--init {input.init[0]}" if input.init else "",
        epochs=HEAD["epochs"],
        batch_size=HEAD["train_batch_size"],
        lr=HEAD["lr"],
        reg_lambda=" ".join(str(x) for x in as_list(HEAD["reg_lambda"])),
        reg_scale=HEAD["reg_scale"],
        baseline=HEAD["baseline"],
        validation_share=HEAD["validation_share"],
        tolerance=HEAD["select_tolerance"],
        confidence=HEAD["select_confidence"],
        seed=HEAD["seed"],
        src=src_hash("head.py", "training", "traces.py"),
    resources:
        gpu=GPU,
    log:
        "results/logs/heads/{train_dataset}/r{round}.log",
    shell:
        "diversed --track train_head train-head --traces {params.traces} {params.init} --out {output.head}"
        " --epochs {params.epochs} --batch-size {params.batch_size} --lr {params.lr}"
        " --reg-lambda {params.reg_lambda} --reg-scale {params.reg_scale} --baseline {params.baseline}"
        " --validation-share {params.validation_share} --tolerance {params.tolerance}"
        " --confidence {params.confidence}"
        " --seed {params.seed} --quiet > {log} 2>&1"
