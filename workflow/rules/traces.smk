# Stage 3: roll out train prompts and store traces for head training: round 1 from the behaviour
# mixtures, round r > 1 from round r - 1's head on a freshly seeded subset of prompts. The trace
# folder is not a declared output, so an interrupted collection resumes instead of restarting;
# traces made with other settings or from another head (a retrained round r - 1) are replaced.


rule collect_traces:
    input:
        models="results/models/ready.json",
        data="results/data/status.json",
        head=previous_head,
    output:
        "results/traces/{train_dataset}/r{round}.done",
    params:
        run=run_flags(),
        offline=OFFLINE,
        sandbox=SANDBOX,
        models=model_flags(),
        n=lambda w: trace_prompts(HEAD, head_source(w.train_dataset)[0]),
        dataset=lambda w: head_source(w.train_dataset)[0],
        split=lambda w: head_source(w.train_dataset)[1],
        max_new_tokens=HEAD["max_new_tokens"],
        temperature=HEAD["temperature"],
        behaviour=lambda w, input: (
            f"--head {input.head[0]}"
            if input.head
            else "--behaviour-weights " + " ".join(str(x) for x in HEAD["behaviour_weights"])
        ),
        seed=lambda w: HEAD["seed"] + int(w.round) - 1,
        folder=lambda w, output: output[0].removesuffix(".done"),
        flags=data_flags(),
        batch_size=HEAD["batch_size"],
        rollouts=HEAD["rollouts"],
        partial="--partial-credit" if HEAD["partial_credit"] else "",
        draft_length=HEAD["draft_length"],
        src=code_hash("diversed.jobs.traces"),
    threads: 2
    resources:
        gpu=GPU,
    log:
        "results/logs/traces/{train_dataset}/r{round}.log",
    conda:
        SOFTWARE
    shell:
        "({params.offline} diversed --track 'collect_traces {wildcards.train_dataset} r{wildcards.round}' collect-traces --dataset {params.dataset} --split {params.split}"
        " --n-examples {params.n} --max-new-tokens {params.max_new_tokens} --temperature {params.temperature}"
        " {params.behaviour} --seed {params.seed} {params.models} --batch-size {params.batch_size} {params.run}"
        " --rollouts {params.rollouts} {params.partial} --draft-length {params.draft_length} --sandbox {params.sandbox}"
        " {params.flags} --quiet --replace-stale --out {params.folder}"
        " && cp {params.folder}/manifest.json {output}) > {log} 2>&1"
