# diversed reproduction workflow: models -> data -> traces -> heads -> decode -> score -> tables/plots -> report.
# Run `snakemake` (the embedded default in config/config.yaml), `snakemake --configfile config/paper.yaml`,
# or `snakemake --profile profiles/slurm --configfile config/paper.yaml` on a SLURM GPU cluster.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/traces.smk"
include: "workflow/rules/head.smk"
include: "workflow/rules/decode.smk"
include: "workflow/rules/score.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        "results/tables/main.md",
        "results/plots/quality_vs_acceptance.png",
        "results/data/status.json",


onstart:
    start_tracking()


onsuccess:
    end_tracking("FINISHED")


onerror:
    end_tracking("FAILED")
