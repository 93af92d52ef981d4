"""MLflow tracking: a broken store warns and never fails the job."""

from __future__ import annotations

import json

import pytest

from diversed.cli import main


def test_broken_tracking_store_only_warns(tmp_path, monkeypatch, canonical_decode_file):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "unknown-scheme://nowhere")
    monkeypatch.chdir(tmp_path)
    canonical_decode_file(1, "in.jsonl")
    with pytest.warns(UserWarning, match="MLflow tracking is off"):
        code = main(
            ["--track", "score", "score", "--dataset", "humaneval", "--in", "in.jsonl", "--out", "m.json"]
        )
    assert code == 0
    assert json.loads((tmp_path / "m.json").read_text())["pass@1"] == 100.0


def test_stage_times_sum_each_stages_finished_jobs(tmp_path, monkeypatch, capsys):
    from diversed import tracking

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
