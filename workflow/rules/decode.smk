# Stage 5: decode each dataset with each method setting. The job appends to its row file,
# results/rows/{dataset}/{setting}.jsonl, which is not a declared output (snakemake never deletes
# it): an interrupted job continues from its rows, and a cell whose n_examples grows decodes only
# its new examples (another setting's rows start the file over). The declared output is a hard link
# to the finished rows (a copy where the filesystem has no links).


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
        first=DATA["first_example"],
        setting=lambda w: cli_flags(SETTINGS[w.setting]),
        max_new_tokens=DECODE["max_new_tokens"],
        head=head_flag,
        matched=lambda w, input: f"--target-weight-from {input.matched}" if "matched" in input.keys() else "",
        flags=data_flags() + subset_flags(),
        batch_size=DECODE["batch_size"],
        run=run_flags(),
        latency_examples=DECODE["latency_examples"],
        rows=lambda w: f"results/rows/{w.dataset}/{w.setting}.jsonl",
        src=code_hash("diversed.jobs.decode"),
    threads: 2
    resources:
        gpu=GPU,
    log:
        "results/logs/decode/{dataset}/{setting}.log",
    conda:
        SOFTWARE
    shell:
        "({params.offline} diversed --track 'decode {wildcards.dataset} {wildcards.setting}' decode --dataset {wildcards.dataset} --split {params.split}"
        " --n-examples {params.n} --first-example {params.first} {params.models} {params.setting} {params.matched} --max-new-tokens {params.max_new_tokens} {params.head} {params.flags}"
        " --batch-size {params.batch_size} {params.run} --latency-examples {params.latency_examples}"
        " --quiet --replace-stale --out {params.rows} && (ln -f {params.rows} {output} || cp {params.rows} {output}))"
        " > {log} 2>&1"
