# Stage 2: resolve every dataset once for the whole run, and fetch what only the hub has into the
# local cache (a local rule: it runs where snakemake runs, with the internet); say whether generated
# code can be isolated here. Every job reads the status file's world, never the hub.


rule data_status:
    output:
        report(
            "results/data/status.json",
            caption="../report/data.rst",
            category="Data",
        ),
    params:
        sandbox=SANDBOX,
        datasets=" ".join(DATASETS + head_sources()),
        split=DATA["split"],
        missing=DATA["missing"],
        flags=data_flags(),
        draws=data_draws(),
        src=code_hash("diversed.data.sizes", "diversed.sandbox"),
    log:
        "results/logs/data_status.log",
    conda:
        SOFTWARE
    shell:
        "diversed data status --datasets {params.datasets} --split {params.split} --fetch"
        " --missing {params.missing} --draws {params.draws} --sandbox {params.sandbox} {params.flags} --out {output} 2> {log}"
