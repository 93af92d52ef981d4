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
