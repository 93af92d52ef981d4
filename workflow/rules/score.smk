# Stage 6: quality metrics (generated code runs in the sandbox) and pooled efficiency figures.


rule score:
    input:
        "results/decode/{dataset}/{setting}.jsonl",
    output:
        "results/scores/{dataset}/{setting}.json",
    params:
        offline=OFFLINE,
        flags=data_flags() + f" --sandbox {SANDBOX}",
        src=code_hash("diversed.evaluation.score", "diversed.sandbox"),
    log:
        "results/logs/score/{dataset}/{setting}.log",
    conda:
        SOFTWARE
    shell:
        "{params.offline} diversed --track 'score {wildcards.dataset} {wildcards.setting}' score --dataset {wildcards.dataset} --in {input} --out {output} {params.flags} > {log} 2>&1"
