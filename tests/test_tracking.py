"""MLflow tracking: a broken store warns and never fails the job; every job's run ends with the
job's fate (FINISHED, FAILED, KILLED) and starts when the job did."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from diversed import tracking
from diversed.cli import main


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
        [sys.executable, "-m", "diversed.tracking", "traces", str(root), str(before)],
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
