# Stage 6: quality metrics (generated code runs in the sandbox) and pooled efficiency figures.


rule score:
    input:
        "results/decode/{dataset}/{setting}.jsonl",
    output:
        "results/scores/{dataset}/{setting}.json",
    params:
        offline=OFFLINE,
        flags=data_flags() + f" --sandbox {SANDBOX}",
        src=src_hash(
            "evaluation/score.py",
            "evaluation/metrics.py",
            "evaluation/bootstrap.py",
            "evaluation/weights.py",
            "sandbox",
            "data/tasks.py",
        ),
    log:
        "results/logs/score/{dataset}/{setting}.log",
    conda:
        SOFTWARE
    shell:
        "{params.offline} diversed --track score score --dataset {wildcards.dataset} --in {input} --out {output} {params.flags} > {log} 2>&1"
