"""What stopping GSM8K where lm-evaluation-harness stops it changes, from two decodes of one cell.

The two decode files (``diversed decode`` JSONL) must hold the same setting on the same examples,
decoded with ``--stop paper`` and ``--stop lm-eval``. Stopping must change nothing before the stop:
per example, the stopped completion's token ids are a prefix of the paper one's, and the first
answer (what the GSM8K scorer reads) is the same. What it saves is read from the records: new tokens
and the decode seconds of the batches (each batch's wall once, model loading excluded).

    python benchmarks/stop_compare.py --paper runs/verdict/results/paper-stop/sd-k4-T1.jsonl \
        --stopped runs/verdict/results/decode/gsm8k/sd-k4-T1.jsonl \
        --out benchmarks/results/gsm8k-stop-lm-eval-n200.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from diversed.data.tasks import get_task
from diversed.evaluation.score import batch_seconds, efficiency, read_records


def load(path: Path) -> dict[str, dict[str, Any]]:
    """A decode file's records by example id."""
    return {r["id"]: r for r in read_records(path, "gsm8k")}


def compare(paper: dict[str, dict[str, Any]], stopped: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The record: prefix identity, answers, accuracy (with discordant pairs) and cost."""
    ids = sorted(set(paper) & set(stopped))
    if not ids:
        raise SystemExit("the two files share no example id")
    task = get_task("gsm8k")
    prefix = cut = same_answer = right_paper = right_stopped = only_paper = only_stopped = 0
    for i in ids:
        p, s = paper[i], stopped[i]
        prefix += p["token_ids"][: len(s["token_ids"])] == s["token_ids"]
        cut += len(s["token_ids"]) < len(p["token_ids"])
        answer_p, answer_s = task.extract(p["completion"], p), task.extract(s["completion"], s)
        a_p, a_s = answer_p == p["reference"], answer_s == s["reference"]
        same_answer += answer_p == answer_s
        right_paper += a_p
        right_stopped += a_s
        only_paper += a_p and not a_s
        only_stopped += a_s and not a_p
    rows = {"paper": [paper[i] for i in ids], "lm-eval": [stopped[i] for i in ids]}
    cost = {stop: efficiency(records) for stop, records in rows.items()}
    tokens = {stop: cost[stop]["new_tokens"] for stop in rows}
    seconds = {stop: round(batch_seconds(records)) for stop, records in rows.items()}
    n = len(ids)
    return {
        "n": n,
        "tokens_identical_up_to_the_stop": f"{prefix} of {n}",
        "stopped_earlier": f"{cut} of {n}",
        "same_extracted_answer": f"{same_answer} of {n}",
        "accuracy": {"paper": 100 * right_paper / n, "lm-eval": 100 * right_stopped / n},
        "discordant": {"right only under paper": only_paper, "right only under lm-eval": only_stopped},
        "new_tokens": tokens,
        "new_tokens_ratio": round(tokens["lm-eval"] / tokens["paper"], 3),
        "decode_seconds": seconds,
        "decode_seconds_ratio": round(seconds["lm-eval"] / seconds["paper"], 3),
        "ended_share": {stop: cost[stop]["ended_share"] for stop in rows},
    }


def same_but_stop(paper: dict[str, dict[str, Any]], stopped: dict[str, dict[str, Any]]) -> bool:
    """Whether the two files' decoding settings differ only in the stop."""

    def settings(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
        first = next(iter(rows.values()))["settings"]
        return {k: v for k, v in first.items() if k != "stop"}

    return settings(paper) == settings(stopped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paper", type=Path, required=True, help="decode JSONL made with --stop paper")
    parser.add_argument("--stopped", type=Path, required=True, help="the same cell with --stop lm-eval")
    parser.add_argument("--out", type=Path, help="write the record here as JSON")
    args = parser.parse_args()
    paper, stopped = load(args.paper), load(args.stopped)
    for name, rows in (("--paper", paper), ("--stopped", stopped)):
        stops = {r.get("stop") for r in rows.values()}
        if len(stops) != 1:
            raise SystemExit(f"{name}: records disagree on their stop: {sorted(map(str, stops))}")
    record = {
        "paper": str(args.paper),
        "stopped": str(args.stopped),
        "settings_equal_but_stop": same_but_stop(paper, stopped),
        **compare(paper, stopped),
    }
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
