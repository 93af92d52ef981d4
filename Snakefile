# diversed reproduction workflow: models -> data -> traces -> heads -> decode -> score -> tables/plots -> report.
# Run from the repository root (Snakemake finds this file there): `snakemake` (the embedded default in
# config/config.yaml), `snakemake --configfile config/paper.yaml`, or
# `snakemake --profile profiles/slurm --configfile config/paper.yaml` on a SLURM GPU cluster.
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")


# The laptop default, unless a config file is given: then that file stands alone, the schema's
# defaults filling what it leaves out (no laptop setting leaks into config/paper.yaml).
if not workflow.overwrite_configfiles:

    configfile: Path(workflow.basedir) / "config" / "config.yaml"



report: "workflow/report/workflow.rst"



include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/traces.smk"
include: "workflow/rules/head.smk"
include: "workflow/rules/decode.smk"
include: "workflow/rules/score.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/specbench.smk"


# Bookkeeping and downloads run where snakemake runs (the login node on a cluster: it has the
# internet); every job after them reads only local files.
localrules:
    all,
    prepare_models,
    data_status,
    tables_and_plots,
    specbench_table,


rule all:
    input:
        final_targets(),


onstart:
    start_tracking()


onsuccess:
    end_tracking("FINISHED")


onerror:
    end_tracking("FAILED")
