"""The Snakemake workflow on config/ci.yaml: end to end, incremental reruns, config errors, MLflow.

The workflow files and the library source are copied into a temporary folder, so the tests can edit
config values and library modules and ask Snakemake (dry runs) what it would rerun.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def snakemake(
    workdir: Path, *args: str, check: bool = True, tracking_uri: str | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    done = subprocess.run(
        [str(BIN / "snakemake"), *args], cwd=workdir, env=env, capture_output=True, text=True, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(done.stdout[-3000:] + done.stderr[-3000:])
    return done


def planned(output: str) -> dict[str, int]:
    """The dry run's 'Job stats' table as {rule: count}."""
    if "Nothing to be done" in output:
        return {}
    table = output.split("Job stats:")[1].split("Reasons:")[0]
    return {m[0]: int(m[1]) for m in re.findall(r"^(\w+)\s+(\d+)$", table, re.MULTILINE) if m[0] != "total"}


def write_config(workdir: Path, name: str, edit) -> str:
    config = yaml.safe_load((workdir / "config" / "ci.yaml").read_text())
    edit(config)
    path = workdir / "config" / name
    path.write_text(yaml.safe_dump(config))
    return f"config/{name}"


def copy_workflow(root: Path) -> Path:
    for item in ("Snakefile", "workflow", "config", "profiles", "diversed"):
        source = REPO / item
        (shutil.copytree if source.is_dir() else shutil.copy)(source, root / item)
    return root


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = copy_workflow(tmp_path_factory.mktemp("wf"))
    snakemake(root, "--configfile", "config/ci.yaml")
    return root


def test_whole_dag_produces_tables_plots_and_report(workdir):
    for path in ("results/tables/main.md", "results/tables/main.csv", "results/tables/main.tex"):
        assert (workdir / path).stat().st_size > 0
    for name in ("quality_vs_acceptance", "quality_vs_time", "speedup_vs_draft_length"):
        assert (workdir / "results" / "plots" / f"{name}.png").exists()
        assert (workdir / "results" / "plots" / f"{name}.svg").exists()
    table = (workdir / "results/tables/main.md").read_text()
    for method in ("auto", "sd", "lossy", "static w=0.5", "cascade"):
        assert method in table
    assert "95% bootstrap interval" in table and "humaneval n = 2" in table and " [" in table
    paired = (workdir / "results/tables/paired_vs_sd.md").read_text()
    assert "delta pass@1" in paired and "delta acceptance" in paired and "lossy" in paired
    snakemake(workdir, "--configfile", "config/ci.yaml", "--report", "results/report.html")
    assert (workdir / "results/report.html").stat().st_size > 100_000


def test_head_rounds_chain_and_the_diversed_cell_uses_the_last(workdir):
    if not os.environ.get("DIVERSED_DATA_DIR"):
        pytest.skip("HumanEval's head trains on MBPP train: set DIVERSED_DATA_DIR (.ci/run does)")
    heads = workdir / "results" / "heads" / "mbpp"
    card = json.loads((heads / "r2" / "head.json").read_text())
    assert card["init"] == "results/heads/mbpp/r1" and len(card["traces"]) == 2
    assert card["selection"]["chosen"] in card["selection"]["candidates"]
    assert {"w_mean", "w_std", "w_below_0.1", "w_above_0.9"} <= set(card["metrics"])
    assert (heads / "r2" / "w_histogram.png").stat().st_size > 0
    second = json.loads((workdir / "results" / "traces" / "mbpp" / "r2" / "manifest.json").read_text())
    assert second["settings"]["head"] == "results/heads/mbpp/r1"  # round 2 sampled from round 1's head
    decoded = json.loads((workdir / "results" / "scores" / "humaneval" / "diversed-k3-T0.json").read_text())
    assert decoded["settings"]["head"] == "results/heads/mbpp/r2"
    assert "diversed k=3 T=0 (head: mbpp)" in (workdir / "results/tables/main.md").read_text()


def test_second_run_has_nothing_to_do(workdir):
    done = snakemake(workdir, "-n", "--configfile", "config/ci.yaml")
    assert "Nothing to be done" in done.stdout + done.stderr


def test_changed_setting_reruns_only_its_jobs(workdir):
    def more_lenient(config):
        config["decode"]["grid"][2] = {"method": "lossy", "lenience": 0.7}

    done = snakemake(workdir, "-n", "--configfile", write_config(workdir, "lenient.yaml", more_lenient))
    assert planned(done.stdout) == {"decode": 1, "score": 1, "tables_and_plots": 1, "all": 1}


def test_changed_param_reruns_dependents_only(workdir):
    def fewer_tokens(config):
        config["decode"]["max_new_tokens"] = 7

    done = snakemake(workdir, "-n", "--configfile", write_config(workdir, "tokens.yaml", fewer_tokens))
    jobs = planned(done.stdout)
    assert jobs["decode"] == jobs["score"] > 1
    assert "prepare_models" not in jobs and "collect_traces" not in jobs and "train_head" not in jobs


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("report.py", {"tables_and_plots": 1, "all": 1}),
        ("metrics.py", {"score": None, "tables_and_plots": 1, "all": 1}),
    ],
)
def test_library_change_reruns_the_rules_that_use_it(workdir, module, expected):
    path = workdir / "diversed" / module
    original = path.read_text()
    try:
        path.write_text(original + "\n# an edit\n")
        jobs = planned(snakemake(workdir, "-n", "--configfile", "config/ci.yaml").stdout)
    finally:
        path.write_text(original)
    assert set(jobs) == set(expected)
    assert all(jobs[k] == v for k, v in expected.items() if v is not None)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["decode"]["grid"].append({"method": "static", "target_weight": 1.5}), "target_weight"),
        (lambda c: c["data"].update(datasets=["humaneval"], n_exemples=3), "n_exemples"),
        (lambda c: c["decode"]["grid"].append({"method": "medusa"}), "medusa"),
    ],
)
def test_bad_config_stops_naming_the_key(workdir, edit, message):
    done = snakemake(workdir, "-n", "--configfile", write_config(workdir, "bad.yaml", edit), check=False)
    assert done.returncode != 0
    assert message in done.stdout + done.stderr


def test_every_job_is_an_mlflow_child_run(workdir):
    with sqlite3.connect(workdir / "results/mlflow/mlruns.db") as db:
        runs = dict(db.execute("select run_uuid, name from runs").fetchall())
        parents = dict(
            db.execute("select run_uuid, value from tags where key = 'mlflow.parentRunId'").fetchall()
        )
        statuses = {status for (status,) in db.execute("select status from runs")}
    invocations = [r for r, name in runs.items() if name == "snakemake-invocation"]
    assert len(invocations) >= 1
    children = [r for r in runs if parents.get(r) in invocations]
    assert {runs[c] for c in children} >= {"decode", "score", "report"}
    assert statuses == {"FINISHED"}


def test_a_job_that_could_not_log_is_counted_and_printed(tmp_path, monkeypatch):
    from diversed import tracking

    root = tmp_path / "mlflow"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store.db'}")
    assert tracking.start_invocation(root) is not None
    with tracking.job_run("decode", root) as run:
        run.mlflow = None  # a job that logs fine
    with tracking.job_run("score", root) as run, pytest.warns(UserWarning, match="logging failed for score"):
        run.metrics({"bad name!": 1.0})  # MLflow rejects the metric name
    assert tracking.end_invocation("FINISHED", root) == 1
