"""Spec-Bench read as the field reads it: answer files, speed-ups and mean accepted tokens.

Spec-Bench (Xia et al., 2024) reports, per category, the speed-up of a method over plain decoding
and "#Mean accepted tokens", from answer files its ``evaluation/speed.py`` reads: one JSON object
per question, ``{"question_id", "category", "choices": [{"turns", "new_tokens", "wall_time",
"accept_lengths"}]}``. :func:`answer_file` writes ours in that format from a decode file, and
:func:`speed` reads answer files exactly as ``speed.py`` does, so the two print the same figures:

- a method's tokens per second is the mean over questions of sum(new_tokens) / sum(wall_time);
- the baseline's is the same mean, but its tokens are counted by re-tokenizing each turn's text
  (``len(tokenizer(turn).input_ids) - 1``: the -1 drops a Llama BOS that Qwen's tokenizer does not
  add, so on Qwen it counts one token short per turn; we keep the rule, to agree with the tool);
- the speed-up is the ratio of those two means (not a mean of per-question ratios);
- #mean accepted tokens is the mean of every ``accept_lengths`` entry (tokens one target forward
  emitted) over all questions; plain decoding's are all 1.

Categories are grouped as ``speed.py`` groups them (MT-bench's eight as one, ``overall`` all).
:func:`lossless` counts, per group, the questions a lossless method decoded token for token as
``auto`` did (every turn), and :func:`quality` scores the categories that have references.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diversed.data.specbench import SPEC_BENCH_GROUPS, SPEC_BENCH_METRICS
from diversed.files import read_jsonl

GROUPS = (*SPEC_BENCH_GROUPS, "overall")  # speed.py's columns, in its order


def in_group(category: str, group: str) -> bool:
    return group == "overall" or category in SPEC_BENCH_GROUPS.get(group, ())


def accept_lengths(stats: dict[str, Any]) -> list[int]:
    """Tokens each target forward emitted, from a turn's counters: a block that kept k drafts
    emitted k + 1; plain decoding (no blocks) emits one token per forward."""
    histogram = stats.get("accepted_histogram") or []
    if not stats.get("blocks"):
        return [1] * int(stats["new_tokens"])
    return [kept + 1 for kept, count in enumerate(histogram) for _ in range(count)]


def record_turns(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A decode record's turns: a chat benchmark's ``turns``, else its one completion, timed by its batch."""
    if record.get("turns"):
        return record["turns"]
    one = {key: record[key] for key in ("completion", "token_ids", "stats")}
    return [{**one, "seconds": record["batch"]["seconds"]}]


def answer(record: dict[str, Any], model_id: str) -> dict[str, Any]:
    """One question's answer in Spec-Bench's format (``evaluation/eval.py`` writes the same keys)."""
    turns = record_turns(record)
    question = int(record["id"]) if str(record["id"]).isdigit() else record["id"]
    return {
        "question_id": question,
        "category": record.get("category", record.get("dataset")),
        "answer_id": f"{record.get('settings_hash', '')[:8]}-{record['id']}",
        "model_id": model_id,
        "choices": [
            {
                "index": 0,
                "turns": [t["completion"] for t in turns],
                "decoding_steps": [t["stats"].get("blocks") or t["stats"]["new_tokens"] for t in turns],
                "new_tokens": [t["stats"]["new_tokens"] for t in turns],
                "wall_time": [t["seconds"] for t in turns],
                "accept_lengths": [n for t in turns for n in accept_lengths(t["stats"])],
            }
        ],
    }


def answer_file(records: Sequence[dict[str, Any]], out: str | Path, model_id: str) -> Path:
    """Write ``records`` (one decode file's) as a Spec-Bench answer file, sorted by question id as
    Spec-Bench's ``reorg_answer_file`` leaves its own."""
    answers = sorted((answer(r, model_id) for r in records), key=lambda a: str(a["question_id"]).zfill(12))
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(a, ensure_ascii=False) + "\n" for a in answers), encoding="utf-8")
    return path


@dataclass(frozen=True)
class GroupSpeed:
    """What ``speed.py`` prints for one group of one method against its baseline."""

    group: str
    questions: int
    tokens_per_second: float
    baseline_tokens_per_second: float
    speedup: float
    mean_accepted_tokens: float


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def speed(
    answers: Iterable[dict[str, Any]],
    baseline: Iterable[dict[str, Any]],
    count_tokens: Callable[[str], int],
    group: str,
) -> GroupSpeed:
    """``speed.py``'s ``speed()`` for one group: ``count_tokens(text)`` is its baseline token count
    (``len(tokenizer(text).input_ids) - 1``)."""
    mine = [a for a in answers if in_group(a["category"], group)]
    base = [a for a in baseline if in_group(a["category"], group)]
    speeds, lengths = [], []
    for a in mine:
        choice = a["choices"][0]
        speeds.append(sum(choice["new_tokens"]) / sum(choice["wall_time"]))
        lengths.extend(choice["accept_lengths"])
    base_speeds = [
        sum(count_tokens(t) for t in a["choices"][0]["turns"]) / sum(a["choices"][0]["wall_time"])
        for a in base
    ]
    ours, theirs = _mean(speeds), _mean(base_speeds)
    return GroupSpeed(group, len(mine), ours, theirs, ours / theirs, _mean(lengths))


def tokenizer_counter(tokenizer: Any) -> Callable[[str], int]:
    """``speed.py``'s count of a baseline turn's tokens."""
    return lambda text: len(tokenizer(text).input_ids) - 1


def lossless(
    records: Sequence[dict[str, Any]], reference: Sequence[dict[str, Any]]
) -> dict[str, tuple[int, int]]:
    """Per group: (questions whose every turn has ``reference``'s tokens, questions in both files)."""
    theirs = {r["id"]: r for r in reference}
    counts: dict[str, list[int]] = {g: [0, 0] for g in GROUPS}
    for record in records:
        other = theirs.get(record["id"])
        if other is None:
            continue
        same = [t["token_ids"] for t in record_turns(record)] == [t["token_ids"] for t in record_turns(other)]
        for group in GROUPS:
            if in_group(record.get("category", ""), group):
                counts[group][0] += same
                counts[group][1] += 1
    return {g: (c[0], c[1]) for g, c in counts.items() if c[1]}


def quality(records: Sequence[dict[str, Any]]) -> dict[str, tuple[str, float]]:
    """Per scored category (SPEC_BENCH_METRICS): its metric's name and value over the category's
    records (sacreBLEU, ROUGE-L F1 x 100, GSM8K accuracy %, rag answer containment %)."""
    from diversed.evaluation.metrics import accuracy, bleu, rouge

    found: dict[str, tuple[str, float]] = {}
    for category, metric in SPEC_BENCH_METRICS.items():
        rows = [r for r in records if r.get("category") == category]
        if not rows:
            continue
        predictions, references = [r["prediction"] for r in rows], [r["reference"] for r in rows]
        if metric == "bleu":
            found[category] = ("sacreBLEU", bleu(predictions, references)["bleu"])
        elif metric == "rouge":
            found[category] = ("ROUGE-L", rouge(predictions, references)["rougeL"])
        elif metric == "accuracy":
            found[category] = ("accuracy %", accuracy(predictions, references)["accuracy"])
        else:
            found[category] = ("answer contained %", containment(predictions, references))
    return found


def containment(predictions: Sequence[str], references: Sequence[str]) -> float:
    """The share (%) of answers that contain one of their acceptable answers (a JSON list), case
    ignored: the rag category's references are lists of short acceptable spans."""
    hits = [
        any(str(ok).lower() in prediction.lower() for ok in json.loads(reference))
        for prediction, reference in zip(predictions, references, strict=True)
    ]
    return 100.0 * sum(hits) / len(hits) if hits else float("nan")


def leaderboard(
    cells: dict[str, Path], baseline: str, count_tokens: Callable[[str], int]
) -> list[dict[str, Any]]:
    """One row per (group, method) of decode files ``cells`` (method label -> file), read as Spec-Bench
    reads their answer files against ``baseline``'s: speed-up, #mean accepted tokens, tokens per
    second, the lossless count against the baseline and the quality of the group's scored categories."""
    records = {label: read_jsonl(path) for label, path in cells.items()}
    answers = {label: [answer(r, label) for r in rows] for label, rows in records.items()}
    same = {label: lossless(rows, records[baseline]) for label, rows in records.items()}
    scores = {label: quality(rows) for label, rows in records.items()}
    count_tokens = functools.cache(count_tokens)  # each baseline turn is re-counted once, not per group
    rows = []
    for group in GROUPS:
        for label in cells:
            found = speed(answers[label], answers[baseline], count_tokens, group)
            if not found.questions:
                continue
            scored = {c: q for c, q in scores[label].items() if in_group(c, group) and group != "overall"}
            rows.append(
                {
                    "group": group,
                    "method": label,
                    "questions": found.questions,
                    "speedup": found.speedup,
                    "mean_accepted_tokens": found.mean_accepted_tokens,
                    "tokens_per_second": found.tokens_per_second,
                    "same_tokens_as_baseline": same[label].get(group),
                    "quality": scored,
                }
            )
    return rows


def markdown(rows: Sequence[dict[str, Any]], baseline: str) -> str:
    """The leaderboard's layout: categories down, methods across, "speed-up / #MAT" in each cell, then
    the lossless counts and the quality of the scored categories."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    groups = list(dict.fromkeys(r["group"] for r in rows))
    cell = {(r["group"], r["method"]): r for r in rows}
    lines = [
        f"Speed-up over `{baseline}` (Spec-Bench's reading: mean tokens per second over questions, "
        "the baseline's tokens re-counted from its text) / #mean accepted tokens; n = questions.",
        "",
        "| category | n | " + " | ".join(methods) + " |",
        "|---|---:|" + "---:|" * len(methods),
    ]
    for group in groups:
        n = max(cell[group, m]["questions"] for m in methods if (group, m) in cell)
        values = [
            f"{cell[group, m]['speedup']:.2f}x / {cell[group, m]['mean_accepted_tokens']:.2f}"
            if (group, m) in cell
            else "--"
            for m in methods
        ]
        lines.append(f"| {group} | {n} | " + " | ".join(values) + " |")
    lines += [
        "",
        f"Questions decoded token for token as `{baseline}` (every turn), and quality where Spec-Bench"
        " has references:",
        "",
    ]
    lines += ["| category | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for group in groups:
        values = []
        for m in methods:
            found = cell.get((group, m))
            if found is None:
                values.append("--")
                continue
            same = found["same_tokens_as_baseline"]
            text = f"{same[0]}/{same[1]} same" if same else "--"
            for category, (metric, value) in found["quality"].items():
                text += f"; {metric} {value:.1f}" + (f" ({category})" if category != group else "")
            values.append(text)
        lines.append(f"| {group} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"
