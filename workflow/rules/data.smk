# Stage 2: record where each dataset comes from (package, local folder, hub) and which are skipped.


rule data_status:
    output:
        report(
            "results/data/status.json",
            caption="../report/data.rst",
            category="Data",
        ),
    params:
        datasets=" ".join(DATA["datasets"]),
        split=DATA["split"],
        flags=data_flags(),
    log:
        "results/logs/data_status.log",
    shell:
        "diversed data status --datasets {params.datasets} --split {params.split} {params.flags} --out {output} 2> {log}"
