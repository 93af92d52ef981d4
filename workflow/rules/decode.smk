# Stage 5: decode each dataset with each method setting. The job writes to a .partial file that is not a
# declared output, so an interrupted job continues from its own JSONL when snakemake runs again.


rule decode:
    input:
        unpack(decode_inputs),
    output:
        "results/decode/{dataset}/{setting}.jsonl",
    params:
        offline=OFFLINE,
        models=model_flags(),
        n=lambda w: SETTINGS[w.setting].get("n_examples", DATA["n_examples"]),
        split=DATA["split"],
        setting=lambda w: cli_flags(SETTINGS[w.setting]),
        max_new_tokens=DECODE["max_new_tokens"],
        head=head_flag,
        matched=lambda w, input: f"--target-weight-from {input.matched}" if "matched" in input.keys() else "",
        flags=data_flags(),
        batch_size=DECODE["batch_size"],
        step=DECODE["step"],
        latency_examples=DECODE["latency_examples"],
        src=src_hash("engine", "backends/cpu", "decode_dataset.py", "data/tasks.py", "control.py"),
    threads: 2
    resources:
        gpu=GPU,
    log:
        "results/logs/decode/{dataset}/{setting}.log",
    conda:
        SOFTWARE
    shell:
        "({params.offline} diversed --track decode decode --dataset {wildcards.dataset} --split {params.split}"
        " --n-examples {params.n} {params.models} {params.setting} {params.matched} --max-new-tokens {params.max_new_tokens} {params.head} {params.flags}"
        " --batch-size {params.batch_size} --step {params.step} --latency-examples {params.latency_examples}"
        " --quiet --out {output}.partial && mv {output}.partial {output}) > {log} 2>&1"
