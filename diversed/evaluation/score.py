"""Scoring a decode JSONL: the task's quality metrics and pooled efficiency figures."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from diversed.data import DataError, get_task, load_records
from diversed.engine.stats import GenerationStats
from diversed.evaluation import bootstrap
from diversed.evaluation.metrics import QUALITY, accuracy, bleu, pass_at_1, rouge, rouge2_per_example
from diversed.evaluation.weights import weight_statistics
from diversed.files import read_jsonl, require
from diversed.provenance import commit
from diversed.sandbox import require_isolation, run_program

DECODE_KEYS = ("id", "prediction", "reference", "stats")  # what scoring reads of every record


def read_records(path: str | Path, dataset: str | None = None) -> list[dict[str, Any]]:
    """A decode file's records; a bad line is named, and records of another dataset are refused."""
    records = read_jsonl(path)
    if not records:
        raise DataError(f"{path} holds no decoded examples")
    for number, record in enumerate(records, 1):
        require(record, DECODE_KEYS, f"{path}:{number}", "a decode record (`diversed decode` writes them)")
    if dataset is not None:
        for number, record in enumerate(records, 1):
            if record.get("dataset", dataset) != dataset:
                raise DataError(f"{path}:{number} is a {record['dataset']} record, not {dataset}")
    return records


def batches(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """A decode file's batches, each once (every record of a batch carries the same ``batch``)."""
    return list({r["batch"]["id"]: r["batch"] for r in records if "batch" in r}.values())


def batch_seconds(records: list[dict[str, Any]]) -> float:
    """The summed wall time of a decode file's batches."""
    return sum(b["seconds"] for b in batches(records) if b.get("seconds") is not None)


def cpu_share(records: list[dict[str, Any]]) -> float | None:
    """The share of its threads' CPU time a CPU job's batches got over their wall time: near 1
    alone, lower where another job shared the cores (its throughput is then not the method's).
    None on GPUs, whose host thread mostly waits, and for records that predate it."""
    timed = [b for b in batches(r for r in records if r.get("device") == "cpu") if "cpu_seconds" in b]
    capacity = sum(b["seconds"] * b["threads"] for b in timed)
    return sum(b["cpu_seconds"] for b in timed) / capacity if capacity else None


def efficiency(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """Pooled over examples: rates are ratios of sums, not means of ratios.

    Latency figures (seconds per example, step times) come from the examples decoded at batch 1
    only, as the paper measures them; ``latency_examples`` says how many. Throughput is all
    generated tokens over the summed wall time of the batches, at ``batch_size`` (the largest).
    """
    stats = [GenerationStats.from_dict(r["stats"]) for r in records]
    total = GenerationStats.total(stats)
    single = GenerationStats.total(s for s in stats if s.batch_size == 1)
    n_single = sum(s.batch_size == 1 for s in stats)
    wall = batch_seconds(records)
    ended = [r.get("finish_reason") in ("eos", "stop") for r in records]
    return {
        "ended_share": sum(ended) / len(ended),  # completions that ended on their own, not by budget
        "acceptance_rate": total.acceptance_rate,
        "mean_accepted_length": total.mean_accepted_length,
        "seconds_per_example": single.seconds / n_single if n_single else None,
        "latency_examples": n_single,
        "tokens_per_second": total.new_tokens / wall if wall else total.tokens_per_second,
        "cpu_share": cpu_share(records),
        "batch_size": total.batch_size,
        "target_forwards_per_token": total.target_forwards / total.new_tokens if total.new_tokens else None,
        "target_step_seconds": single.target_seconds / single.target_forwards
        if single.target_forwards
        else None,
        "draft_step_seconds": single.draft_seconds / single.draft_forwards if single.draft_forwards else None,
        "new_tokens": total.new_tokens,
        "drafted": total.drafted,
        "accepted": total.accepted,
        "blocks": total.blocks,
    }


def quality(
    dataset: str,
    records: list[dict[str, Any]],
    data_dir: str | Path | None = None,
    allow_hub: bool = True,
    sandbox: str = "isolated",
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The task's metrics, and per-example outcomes (pass/fail reasons for code).

    Generated code runs in :mod:`diversed.sandbox`: in mode ``isolated`` only where every fence
    holds (else ``SandboxError``); in mode ``rlimits`` with what this machine gives, printed once
    and stated in every outcome.
    """
    task = get_task(dataset)
    if task.metric == "specbench":
        raise DataError(
            "specbench is scored per category, beside its speed-ups: `diversed specbench` (its workflow:"
            " config/specbench.yaml)"
        )
    predictions = [r["prediction"] for r in records]
    references = [r["reference"] for r in records]
    if task.metric == "rouge":
        return rouge(predictions, references), []
    if task.metric == "bleu":
        return bleu(predictions, references), []
    if task.metric == "accuracy":
        return accuracy(predictions, references), []
    require_isolation(sandbox, f"score {dataset}")
    split = records[0].get("split", "test")
    source, _ = load_records(task, split, data_dir, allow_hub)
    by_id = {task.example_id(rec, i): rec for i, rec in enumerate(source)}
    outcomes = []
    for r in records:
        if r["id"] not in by_id:
            raise DataError(f"{dataset}/{split} has no example {r['id']!r} to test the prediction against")
        result = run_program(task.program(r["prediction"], by_id[r["id"]]), strict=sandbox == "isolated")
        if result.missing and not outcomes:
            print(
                "sandbox rlimits: not enforced on this machine: " + "; ".join(result.missing), file=sys.stderr
            )
        outcome = {"id": r["id"], "passed": result.passed, "status": result.status, "reason": result.reason}
        if sandbox == "rlimits":
            outcome["sandbox"] = "rlimits" + (
                ": missing " + "; ".join(result.missing) if result.missing else ""
            )
        outcomes.append(outcome)
    return pass_at_1([o["passed"] for o in outcomes]), outcomes


def per_example(
    dataset: str, records: list[dict[str, Any]], outcomes: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per example: its quality (on the table's scale; BLEU: sentence n-gram statistics,
    summed into corpus BLEU), its decoding counters and batch-1 time, for intervals and pairing."""
    task = get_task(dataset)
    predictions = [r["prediction"] for r in records]
    references = [r["reference"] for r in records]
    if task.metric == "pass@1":
        quality: list[Any] = [100.0 * o["passed"] for o in outcomes]
    elif task.metric == "accuracy":
        quality = [100.0 * (p == r) for p, r in zip(predictions, references, strict=True)]
    elif task.metric == "rouge":
        quality = [100.0 * rouge2_per_example(p, r) for p, r in zip(predictions, references, strict=True)]
    else:
        from sacrebleu.metrics import BLEU

        quality = [list(row) for row in BLEU()._extract_corpus_statistics(predictions, [references])]
    rows = []
    for record, value, outcome in zip(records, quality, outcomes or [{}] * len(records), strict=True):
        stats = GenerationStats.from_dict(record["stats"])
        rows.append(
            {
                "id": record["id"],
                "quality": value,
                "accepted": stats.accepted,
                "drafted": stats.drafted,
                "blocks": stats.blocks,
                "batch_size": stats.batch_size,
                "seconds": stats.seconds,
                **{k: v for k, v in outcome.items() if k != "id"},
            }
        )
    return rows


def confidence_intervals(dataset: str, examples: list[dict[str, Any]]) -> dict[str, list[float] | None]:
    """95% bootstrap intervals of acceptance, mean accepted length, quality and s/example, keyed
    ``<figure>_ci`` (quality under its metric's name, e.g. ``pass@1_ci``)."""
    task = get_task(dataset)
    corpus = bootstrap.corpus_bleu_quality if task.metric == "bleu" else None
    found = bootstrap.intervals(bootstrap.columns(examples), corpus)
    found[f"{QUALITY[task.metric]}_ci"] = found.pop("quality_ci")
    return found


def score_file(
    dataset: str,
    path: str | Path,
    out: str | Path,
    data_dir: str | Path | None = None,
    allow_hub: bool = True,
    sandbox: str = "isolated",
) -> dict[str, Any]:
    records = read_records(path, dataset)
    metrics, outcomes = quality(dataset, records, data_dir, allow_hub, sandbox)
    examples = per_example(dataset, records, outcomes)
    result = {
        "dataset": dataset,
        "method": records[0]["method"],
        "n_examples": len(records),
        **metrics,
        **efficiency(records),
        **confidence_intervals(dataset, examples),
        **({"w_test": weights} if (weights := weight_statistics(records)) else {}),
        "settings": records[0].get("settings", {}),
        "commit": {"score": commit(), "decode": sorted({r.get("commit", "not recorded") for r in records})},
        **({"head_check": records[0]["head_check"]} if "head_check" in records[0] else {}),
        **({"sandbox": sandbox} if get_task(dataset).metric == "pass@1" else {}),
        "per_example": examples,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result
