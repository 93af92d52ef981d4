"""Every decode and score record names the commit of the code that wrote it, and a trained head's
bytes are part of the decode settings: retraining a head into the same folder is another setting."""

from __future__ import annotations

import json
import re

import torch

from diversed.config import DecodeConfig
from diversed.head import EnsembleHead, save_head
from diversed.jobs.decode import DecodeJob
from diversed.provenance import commit, head_sha256


def job(head: str | None, method: str = "diversed") -> DecodeJob:
    return DecodeJob("humaneval", "test", 4, "t", "d", DecodeConfig.from_dict({"method": method}), head=head)


def test_a_changed_head_file_changes_the_settings_hash(tmp_path):
    head = EnsembleHead(8, 8, 0, seed=1)
    save_head(head, tmp_path / "h", {})
    before = job(str(tmp_path / "h"))
    assert before.settings()["head_sha256"] == head_sha256(str(tmp_path / "h"))
    old = before.settings_hash()
    with torch.no_grad():
        head.out.bias += 0.5
    save_head(head, tmp_path / "h", {})  # the same folder, other weights
    assert job(str(tmp_path / "h")).settings_hash() != old
    assert "head_sha256" not in job(None, "sd").settings()  # named only where a head file is used


def test_decode_and_score_records_name_the_commit(model_dirs, tmp_path, capsys):
    from diversed.cli import main

    target, draft = model_dirs
    out = tmp_path / "d.jsonl"
    argv = [
        "decode",
        "--dataset",
        "humaneval",
        "--n-examples",
        "2",
        "--method",
        "sd",
        "--target",
        str(target),
    ]
    argv += ["--draft", str(draft), "--max-new-tokens", "4", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["commit"] for r in records} == {commit()}
    assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?|diversed .*", commit())
    assert main(["score", "--dataset", "humaneval", "--in", str(out), "--out", str(tmp_path / "s.json")]) == 0
    score = json.loads((tmp_path / "s.json").read_text())
    assert score["commit"] == {"score": commit(), "decode": [commit()]}
