# Stage 3: roll out train prompts from behaviour mixtures and store traces for head training.
# The trace folder is not a declared output, so an interrupted collection resumes instead of restarting.


rule collect_traces:
    input:
        "results/models/ready.json",
    output:
        "results/traces/{train_dataset}.done",
    params:
        target=MODELS["target"],
        draft=MODELS["draft"],
        n=HEAD["n_examples"],
        dataset=lambda w: head_source(w.train_dataset)[0],
        split=lambda w: head_source(w.train_dataset)[1],
        max_new_tokens=HEAD["max_new_tokens"],
        temperature=HEAD["temperature"],
        weights=" ".join(str(w) for w in HEAD["behaviour_weights"]),
        folder=lambda w, output: output[0].removesuffix(".done"),
        flags=data_flags(),
        batch_size=HEAD["batch_size"],
        draft_length=HEAD["draft_length"],
        src=src_hash("traces.py", "engine", "data/tasks.py"),
    threads: 2
    resources:
        gpu=GPU,
    log:
        "results/logs/traces/{train_dataset}.log",
    shell:
        "(diversed --track collect_traces collect-traces --dataset {params.dataset} --split {params.split}"
        " --n-examples {params.n} --max-new-tokens {params.max_new_tokens} --temperature {params.temperature}"
        " --behaviour-weights {params.weights} --target {params.target} --draft {params.draft}"
        " --batch-size {params.batch_size} --draft-length {params.draft_length} {params.flags} --quiet --out {params.folder} && cp {params.folder}/manifest.json {output}) > {log} 2>&1"
