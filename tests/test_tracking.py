"""MLflow tracking: a broken store warns and never fails the job; every job's run ends with the
job's fate (FINISHED, FAILED, KILLED) and starts when the job did."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from diversed.cli import main
from diversed.pipeline import tracking


def test_broken_tracking_store_only_warns(tmp_path, monkeypatch, capfd, canonical_decode_file):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "unknown-scheme://nowhere")
    monkeypatch.chdir(tmp_path)
    canonical_decode_file(1, "in.jsonl")
    code = main(
        ["--track", "score", "score", "--dataset", "humaneval", "--in", "in.jsonl", "--out", "m.json"]
    )
    assert code == 0
    assert json.loads((tmp_path / "m.json").read_text())["pass@1"] == 100.0
    assert "MLflow tracking is off for this job" in capfd.readouterr().err  # the tracking process's warning


def test_a_tracking_process_that_cannot_start_only_warns(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking.sys, "executable", str(tmp_path / "no-python-here"))
    with pytest.warns(UserWarning, match="tracking is off"), tracking.job_run("decode", tmp_path) as run:
        run.params({"method": "sd"})
        run.metrics({"acceptance": 0.5})


def test_job_runs_end_finished_failed_or_killed_and_start_when_the_job_did(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = tmp_path / "mlflow"
    tracking.start_invocation(root)
    before = int(time.time() * 1000)
    with tracking.job_run("decode", root) as run:
        entered = int(time.time() * 1000)
        run.params({"method": "sd", "out": tmp_path / "x.jsonl"})
        run.metrics({"acceptance": 0.5, "acceptance_ci": [0.4, 0.6], "note": "words are not metrics"})
    with pytest.raises(RuntimeError), tracking.job_run("score", root):
        raise RuntimeError("the job failed")
    # a job killed outright: its pipe closes without an end
    process = subprocess.Popen(
        [sys.executable, "-m", "diversed.pipeline.tracking", "traces", str(root), str(before)],
        stdin=subprocess.PIPE,
        text=True,
    )
    process.stdin.write(json.dumps(["params", {"rows": 4}]) + "\n")
    process.stdin.close()
    assert process.wait() == 0
    client = tracking._mlflow(root).MlflowClient()
    experiment = client.get_experiment_by_name(tracking.EXPERIMENT).experiment_id
    runs = {r.data.tags["stage"]: r for r in client.search_runs([experiment]) if "stage" in r.data.tags}
    assert {stage: r.info.status for stage, r in runs.items()} == {
        "decode": "FINISHED",
        "score": "FAILED",
        "traces": "KILLED",
    }
    decode = runs["decode"]
    assert before <= decode.info.start_time <= entered  # not when the tracking process got there
    assert decode.data.params == {"method": "sd", "out": str(tmp_path / "x.jsonl")}
    assert decode.data.metrics == {"acceptance": 0.5, "acceptance_ci_low": 0.4, "acceptance_ci_high": 0.6}
    parent = (root / "parent_run_id").read_text()
    assert all(r.data.tags["mlflow.parentRunId"] == parent for r in runs.values())


def test_stage_times_sum_each_stages_finished_jobs(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = tmp_path / "mlflow"
    tracking.start_invocation(root)
    for stage in ("decode", "decode", "score"):
        with tracking.job_run(stage, root):
            pass
    times = tracking.stage_times(root)
    assert {k: v["jobs"] for k, v in times.items()} == {"decode": 2, "score": 1}
    assert all(v["seconds"] >= 0 for v in times.values())
    monkeypatch.chdir(tmp_path)
    assert main(["stage-times", "--store", "mlflow"]) == 0
    assert json.loads(capsys.readouterr().out)["decode"]["jobs"] == 2


def test_a_refused_tracking_server_costs_a_job_seconds_not_minutes(tmp_path, canonical_decode_file):
    """MLflow's own retry defaults held a 2-example decode 251 s before the warning; bounded now."""
    canonical_decode_file(1, tmp_path / "in.jsonl")
    env = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "diversed.cli", "--track", "score", "score", "--dataset", "humaneval"]
        + ["--in", "in.jsonl", "--out", "m.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MLflow tracking is off for this job" in done.stderr
    assert time.monotonic() - start < 60  # generous: the bound is ~5 s of retries, before it was 251


class BrokenMetrics:
    """An MLflow stand-in whose metrics call fails: the store took the run, then refused a write."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def log_params(self, values):
        self.calls.append(("params", values))

    def log_metrics(self, values, step=None):
        raise ConnectionError("tracking server went away")

    def set_tag(self, key, value):
        self.calls.append(("tag", key, value))

    def end_run(self, status):
        self.calls.append(("end", status))


def test_a_run_whose_logging_failed_part_way_says_so_in_its_status(tmp_path):
    store = BrokenMetrics()
    run = tracking.JobRun(store, "decode", tmp_path)
    run.params({"method": "sd"})
    with pytest.warns(UserWarning, match="MLflow logging failed for decode: tracking server went away"):
        run.metrics({"acceptance": 0.5})
    run.end("FINISHED")
    assert ("end", "FAILED") in store.calls
    assert ("tag", "diversed.logging", "incomplete: tracking server went away") in store.calls
    assert "decode: tracking server went away" in (tmp_path / tracking.FAILED_LOGS).read_text()
