"""What the Snakemake workflow and the operator need around the library.

``grid``: the config's decoding grid expanded into named settings and CLI flags;
``workflow_config``: the workflow config validated against its schema, and its reference page;
``tracking``: MLflow runs of workflow jobs, bounded retries; ``doctor``: what this machine will
use and what is missing. May import anything below it (every package but :mod:`diversed.cli`).
"""
