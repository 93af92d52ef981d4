# Stage 7: the paper's table layout and Pareto plots, embedded in `snakemake --report`.


rule tables_and_plots:
    input:
        decode_targets(),
    output:
        table=report("results/tables/main.md", caption="../report/table.rst", category="Tables"),
        csv="results/tables/main.csv",
        tex="results/tables/main.tex",
        paired=report("results/tables/paired_vs_sd.md", caption="../report/paired.rst", category="Tables"),
        paired_csv="results/tables/paired_vs_sd.csv",
        frontier=report("results/tables/frontier.md", caption="../report/frontier.rst", category="Tables"),
        weights=report("results/tables/weights.md", caption="../report/weights.rst", category="Tables"),
        acceptance=report(
            "results/plots/quality_vs_acceptance.png", caption="../report/quality_vs_acceptance.rst", category="Plots"
        ),
        time=report("results/plots/quality_vs_time.png", caption="../report/quality_vs_time.rst", category="Plots"),
        speedup=report(
            "results/plots/speedup_vs_draft_length.png", caption="../report/speedup.rst", category="Plots"
        ),
    params:
        src=code_hash("diversed.evaluation.report", "diversed.evaluation.tables", "diversed.evaluation.plots"),
    log:
        "results/logs/report.log",
    conda:
        SOFTWARE
    shell:
        "diversed --track report report --scores {input} --tables results/tables/main --plots results/plots > {log} 2>&1"
