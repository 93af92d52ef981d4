# Stage 1: make the target and draft loadable, once, where snakemake runs (a local rule): fetch and
# convert embedded models, download hub models into the cache (gated access checked; the hub's message
# kept whole), or build the tiny CI pair. Jobs then load them offline.


rule prepare_models:
    output:
        "results/models/ready.json",
    params:
        target=MODELS["target"],
        draft=MODELS["draft"],
        dtype=MODELS["dtype"],
        tiny=f"diversed models tiny --out {MODELS['tiny_dir']} &&" if MODELS["tiny_dir"] else "",
        src=code_hash("diversed.loading.embedded", "diversed.loading.tiny", "diversed.loading.models"),
    log:
        "results/logs/prepare_models.log",
    conda:
        SOFTWARE
    shell:
        "({params.tiny} diversed models prepare --target {params.target} --draft {params.draft} --dtype {params.dtype} --out {output}) > {log} 2>&1"
