"""Spec-Bench (Xia et al., 2024), the field's speed benchmark, as a task: 480 questions in 13
categories asked as they are, in the chat template, over one or two turns; its categories grouped
as its ``evaluation/speed.py`` groups them, the metric of each category that has references, and
the stratified subset a CPU can run.
"""

from __future__ import annotations

import json
from collections import Counter

from diversed.data.sources import DataError
from diversed.data.tasks import GSM8K, Record, Task, normalise_number

# Spec-Bench's categories as its evaluation/speed.py groups them: MT-bench's eight are one column.
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_GROUPS: dict[str, tuple[str, ...]] = {
    "mt_bench": MT_BENCH,
    **{c: (c,) for c in ("translation", "summarization", "qa", "math_reasoning", "rag")},
}
# Quality where Spec-Bench has a reference: the metric each category is scored by.
SPEC_BENCH_METRICS = {
    "translation": "bleu",
    "summarization": "rouge",
    "math_reasoning": "accuracy",
    "rag": "containment",
}


class SpecBench(Task):
    """Spec-Bench (Xia et al., 2024): 480 questions in 13 categories, asked in the chat template.

    MT-bench's questions have a second turn, asked after the model's own first answer, as
    Spec-Bench's ``evaluation/eval.py`` does. The file is Spec-Bench's own ``question.jsonl`` (the
    shared data's ``spec_bench/question.jsonl``), kept in question-id order; a subset is the first k
    questions of each category by id (:func:`stratified`). Its answers stop at the model's end of
    turn, within Spec-Bench's 1024 new tokens.
    """

    name = "specbench"
    metric = "specbench"  # per category: SPEC_BENCH_METRICS
    chat = True
    shuffle = False
    max_new_tokens = 1024
    categorised = True

    def local_file(self, split: str) -> str:
        if split != "test":
            raise DataError(f"specbench has only a 'test' split (its 480 questions), not {split!r}")
        return "spec_bench/question.jsonl"

    def example_id(self, record: Record, index: int) -> str:
        return str(record["question_id"])

    def query(self, record: Record) -> str:
        return record["turns"][0]

    def followups(self, record: Record) -> list[str]:
        return list(record["turns"][1:])

    def category(self, record: Record) -> str:
        return record["category"]

    def reference(self, record: Record) -> str:
        """The reference of the categories scored (SPEC_BENCH_METRICS), as their metric reads it: a
        text, GSM8K's final number, or rag's acceptable answers as a JSON list; else empty."""
        metric = SPEC_BENCH_METRICS.get(record["category"])
        given = record.get("reference") or [""]
        if metric == "accuracy":
            return normalise_number(given[0].split("####")[-1])
        if metric == "containment":
            return json.dumps(given[0], ensure_ascii=False)
        return given[0] if metric else ""

    def extract(self, completion: str, record: Record) -> str:
        if SPEC_BENCH_METRICS.get(record["category"]) == "accuracy":
            return GSM8K().extract(completion, record)
        return completion.strip()


def stratified(
    records: list[Record], task: Task, per_category: int | None, categories: tuple[str, ...] = ()
) -> list[int]:
    """Positions of the records kept: those of ``categories`` (all when empty), and of each category
    its first ``per_category`` by position (all when None), in the split's order. Categories not in
    the split are refused by name."""
    found = [task.category(r) for r in records]
    unknown = sorted(set(categories) - set(found))
    if unknown:
        raise DataError(
            f"{task.name} has no category {', '.join(unknown)}; it has {', '.join(sorted(set(found)))}"
        )
    kept, seen = [], Counter()
    for position, category in enumerate(found):
        if categories and category not in categories:
            continue
        if per_category is None or seen[category] < per_category:
            kept.append(position)
            seen[category] += 1
    return kept
