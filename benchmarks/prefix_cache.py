"""A shared prompt prefix prefilled once per job against every prompt prefilled whole, side by side.

Each case runs the same `diversed` command twice, `--prefix-cache on` and `off`, one after the
other, as the workflow runs its jobs (a fresh process each, models mapped from the packed store),
and reads the records they write: prefill seconds (each batch's prefill counted once), the
seconds the batches took (decoding and prefill, not model loading), examples (or rollouts) per
minute, and whether both wrote the same tokens. Cases (the embedded pair, `--dtype auto`):

* ``gsm8k``: `decode`, sd, T = 1, batch 4, the paper's 4-shot prompt, 128 new tokens;
* ``cnndm``: the same on CNN/DM's 1-shot prompt (the 10 test records of the local copy);
* ``traces``: `collect-traces` on GSM8K train prompts, 8 rollouts of each prompt in one batch;
* ``gsm8k-fp32``, ``cnndm-fp32``: those jobs in fp32, where both runs must write identical tokens
  (in bf16 a prefix prefilled alone rounds differently from one prefilled with its suffix, and a
  sampled completion can take another path after a near-tie).

    python benchmarks/prefix_cache.py --out benchmarks/results/prefix-cache.json

A finished case is kept in ``--out`` and skipped on a rerun, so a killed run resumes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from diversed.devices import choose_dtype
from diversed.jobs.bench import provenance

TARGET, DRAFT = "embedded:qwen2.5-coder-1.5b", "embedded:qwen2.5-coder-0.5b"
CASES: dict[str, list[str]] = {
    "gsm8k": ["decode", "--dataset", "gsm8k", "--n-examples", "20", "--dtype", "auto"],
    "cnndm": ["decode", "--dataset", "cnndm", "--n-examples", "10", "--dtype", "auto"],
    "traces": [
        *("collect-traces", "--dataset", "gsm8k", "--n-examples", "4", "--rollouts", "8"),
        *("--behaviour-weights", "0.5", "--batch-size", "8", "--dtype", "auto"),
    ],
    "gsm8k-fp32": ["decode", "--dataset", "gsm8k", "--n-examples", "12", "--dtype", "float32"],
    "cnndm-fp32": ["decode", "--dataset", "cnndm", "--n-examples", "4", "--dtype", "float32"],
}
DECODE = ["--method", "sd", "--temperature", "1", "--batch-size", "4", "--num-assistant-tokens", "4"]


def command(case: str, mode: str, out: Path) -> list[str]:
    argv = [sys.executable, "-m", "diversed.cli", *CASES[case], "--target", TARGET, "--draft", DRAFT]
    argv += ["--max-new-tokens", "128", "--prefix-cache", mode, "--quiet", "--out", str(out)]
    return argv + (DECODE if CASES[case][0] == "decode" else [])


def records(case: str, out: Path) -> list[dict[str, Any]]:
    """What a run wrote: decode lines, or each trace sequence's JSON (its stats and tokens)."""
    if CASES[case][0] == "decode":
        return [json.loads(line) for line in out.read_text().splitlines()]
    manifest = json.loads((out / "manifest.json").read_text())
    return [json.loads((out / f"{s['file']}.json").read_text()) for s in manifest["sequences"]]


def figures(case: str, rows: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """Prefill and batch seconds, once per batch. A decode record names its batch and carries the
    batch's wall time; a trace sequence carries its batch's prefill time (one value per batch) and
    the time its own row ended, so a batch lasted as long as its last row."""
    batches: dict[Any, dict[str, float]] = {}
    for row in rows:
        stats = row["stats"]
        if "batch" in row:
            key, seconds = row["batch"]["id"], row["batch"]["seconds"]
        else:
            key, seconds = stats["prefill_seconds"], stats["seconds"]
        batch = batches.setdefault(key, {"prefill": stats["prefill_seconds"], "seconds": 0.0})
        batch["seconds"] = max(batch["seconds"], seconds)
    prefill = sum(b["prefill"] for b in batches.values())
    seconds = sum(b["seconds"] for b in batches.values())
    return {
        "items": len(rows),
        "batches": len(batches),
        "prefill_seconds": prefill,
        "decode_seconds": seconds - prefill,
        "batch_seconds": seconds,
        "prefill_seconds_per_item": prefill / len(rows),
        "items_per_minute": 60 * len(rows) / seconds,
        "new_tokens": sum(row["stats"]["new_tokens"] for row in rows),
        "prefix_tokens": max(row["stats"].get("prefix_tokens", 0) for row in rows),
        "process_wall_seconds": wall,
    }


def output_path(case: str, mode: str, work: Path) -> Path:
    return work / f"{case}-{mode}" if CASES[case][0] != "decode" else work / f"{case}-{mode}.jsonl"


def compare(case: str, work: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Each mode's figures from what its run wrote (``result`` holds each run's command and wall),
    whether both wrote the same tokens, and the ratios."""
    outputs = {}
    for mode in ("on", "off"):
        rows = records(case, output_path(case, mode, work))
        measured = figures(case, rows, result[mode]["process_wall_seconds"])
        result[mode] = {"command": result[mode]["command"], **measured}
        outputs[mode] = [(row.get("id"), row.get("token_ids", row.get("completion"))) for row in rows]
    same = sum(a == b for a, b in zip(outputs["on"], outputs["off"], strict=True))
    result["identical_outputs"] = f"{same}/{len(outputs['on'])}"
    result["prefill_ratio"] = (
        result["off"]["prefill_seconds_per_item"] / result["on"]["prefill_seconds_per_item"]
    )
    result["throughput_ratio"] = result["on"]["items_per_minute"] / result["off"]["items_per_minute"]
    return result


def run_case(case: str, work: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for mode in ("on", "off"):
        argv = command(case, mode, output_path(case, mode, work))
        start = time.perf_counter()
        subprocess.run(argv, check=True)
        result[mode] = {"command": " ".join(argv[1:]), "process_wall_seconds": time.perf_counter() - start}
        print(case, mode, f"{result[mode]['process_wall_seconds']:.1f} s", flush=True)
    return compare(case, work, result)


def prefix_memory(tokens: int, dtype_bytes: int) -> dict[str, float]:
    """MiB the prefix's KV holds per model: layers x (K and V) x KV heads x head dim x tokens."""
    from transformers import AutoConfig

    from diversed.loading.models import resolve

    memory = {}
    for name in (TARGET, DRAFT):
        config = AutoConfig.from_pretrained(resolve(name))
        head_dim = config.hidden_size // config.num_attention_heads
        per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * dtype_bytes
        memory[name] = per_token * tokens / 2**20
    return memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON record to write (and resume from)")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--work", default="runs/prefix-cache", help="folder for the runs' outputs")
    parser.add_argument(
        "--recompute", action="store_true", help="recompute the record's figures from the runs' outputs"
    )
    args = parser.parse_args()
    out, work = Path(args.out), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    record = json.loads(out.read_text()) if out.exists() else {"cases": {}}
    if args.recompute:  # the runs keep their provenance; the figures say who recomputed them
        record["recomputed"] = provenance()
    else:
        record.update(provenance())
    record["auto_dtype"] = choose_dtype("auto", "cpu")[0]
    for case in args.cases:
        if case in record["cases"] and args.recompute:
            record["cases"][case] = compare(case, work, record["cases"][case])
        if case in record["cases"]:
            out.write_text(json.dumps(record, indent=1) + "\n")
            continue
        record["cases"][case] = run_case(case, work)
        on = record["cases"][case]["on"]
        dtype_bytes = 4 if "fp32" in case or record["auto_dtype"] == "float32" else 2
        record["cases"][case]["prefix_kv_mib"] = prefix_memory(on["prefix_tokens"], dtype_bytes)
        out.write_text(json.dumps(record, indent=1) + "\n")
    for case, result in record["cases"].items():
        print(
            f"{case}: prefill s/item {result['off']['prefill_seconds_per_item']:.2f} -> "
            f"{result['on']['prefill_seconds_per_item']:.2f} ({result['prefill_ratio']:.1f}x fewer), "
            f"items/min {result['off']['items_per_minute']:.2f} -> {result['on']['items_per_minute']:.2f} "
            f"({result['throughput_ratio']:.2f}x), identical {result['identical_outputs']}"
        )


if __name__ == "__main__":
    main()
