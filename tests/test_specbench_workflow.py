"""config/specbench-cpu.yaml as a user runs it, on the tiny pair: the repository's own config (the
models swapped for the tiny pair), Spec-Bench-shaped questions, decode jobs, the leaderboard
table and the answer files Spec-Bench's speed.py reads."""

from __future__ import annotations

import json

import yaml
from test_specbench import write_questions
from test_workflow import REPO, copy_workflow, snakemake


def test_the_specbench_config_builds_its_leaderboard(tmp_path):
    (tmp_path / "run").mkdir()
    root = copy_workflow(tmp_path / "run")
    config = yaml.safe_load((REPO / "config" / "specbench-cpu.yaml").read_text())
    config["models"].update(
        target="results/models/tiny/target", draft="results/models/tiny/draft", tiny_dir="results/models/tiny"
    )
    config["data"].update(
        dir=str(write_questions(tmp_path / "data")), allow_hub=False, per_category=1, n_examples=5
    )
    config["decode"]["max_new_tokens"] = 6
    (root / "config" / "tiny-specbench.yaml").write_text(yaml.safe_dump(config))
    snakemake(root, "--configfile", "config/tiny-specbench.yaml", "--cores", "2")
    table = (root / "results" / "tables" / "specbench.md").read_text()
    assert "| mt_bench | 1 |" in table and "| overall | 3 |" in table
    rows = json.loads((root / "results" / "tables" / "specbench.json").read_text())
    sd = {r["group"]: r for r in rows if r["method"] == "sd-k4-T0"}
    assert sd["overall"]["same_tokens_as_baseline"] == [3, 3]  # greedy sd is auto, every turn
    answers = root / "results" / "specbench" / "answers" / "sd-k4-T0.jsonl"
    first = json.loads(answers.read_text().splitlines()[0])
    assert first["question_id"] == 81 and len(first["choices"][0]["turns"]) == 2
    assert not (root / "results" / "tables" / "main.md").exists()  # Spec-Bench has its own table only
