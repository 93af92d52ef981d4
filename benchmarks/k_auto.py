"""k auto against fixed k and plain decoding, by batch size, in one interleaved run (issue 50, item 5).

For each batch size B in 1, 2, 4, 8, 16, greedy, the same prompts (HumanEval's seeded first 16),
each system decodes them B at a time: ``auto``, ``sd`` at fixed k = 2, 4, 6, and ``sd`` with
``--num-assistant-tokens auto`` (its cost profile measured first, once, and named in the record).
Repeats run interleaved, the systems' order rotating; each figure is the median tokens per second.
The record gives, per B, k auto over the faster of ``auto`` and the best fixed k (asked: >= 0.95),
and checks every system's tokens against ``auto``'s (greedy lossless: identical).

    python benchmarks/k_auto.py --out benchmarks/results/k-auto-<cpu>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from diversed.config import DecodeConfig
from diversed.data import load_examples
from diversed.devices import choose_dtype
from diversed.jobs.bench import provenance, read_bandwidth
from diversed.loading.stack import load_stack

FIXED = (2, 4, 6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--target", default="embedded:qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantize", default="auto")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    dtype = choose_dtype(args.dtype, "cpu")[0]
    stack = load_stack(args.target, args.draft, dtype, "cpu", args.quantize)
    prompts = [stack.tokenizer(e.prompt).input_ids for e in load_examples("humaneval", n=args.prompts)]
    start = time.perf_counter()
    profile = stack.cost_profile(6)
    profile_seconds = time.perf_counter() - start
    settings = {
        "auto": {"method": "auto"},
        **{f"sd k={k}": {"method": "sd", "num_assistant_tokens": k} for k in FIXED},
    }
    settings["sd k=auto"] = {"method": "sd", "num_assistant_tokens": 6, "schedule": "cost"}
    decoders = {
        name: stack.decoder(DecodeConfig.from_dict({**values, "max_new_tokens": args.max_new_tokens}))
        for name, values in settings.items()
    }
    names = list(decoders)
    rates: dict[str, list[float]] = {f"{n}@{b}": [] for b in args.batch_sizes for n in names}
    outputs: dict[str, list[list[int]]] = {}
    chosen: dict[str, dict[str, float]] = {}
    for repeat in range(args.repeats):
        for b in args.batch_sizes:
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in order:
                produced, stats = [], []
                begin = time.perf_counter()
                for i in range(0, len(prompts), b):
                    results = decoders[name].generate_batch(prompts[i : i + b])
                    produced += [g.token_ids for g in results]
                    stats += [g.stats for g in results]
                seconds = time.perf_counter() - begin
                rates[f"{name}@{b}"].append(sum(map(len, produced)) / seconds)
                outputs.setdefault(f"{name}@{b}", produced)
                if name == "sd k=auto":
                    blocks = sum(s.blocks for s in stats)
                    chosen[str(b)] = {"drafts_per_block": sum(s.drafted for s in stats) / blocks}
            print(
                f"repeat {repeat + 1} B={b}: " + ", ".join(f"{n} {rates[f'{n}@{b}'][-1]:.2f}" for n in names),
                flush=True,
            )
    tok_s = {key: statistics.median(v) for key, v in rates.items()}
    reference = outputs[f"auto@{args.batch_sizes[0]}"]
    identical = {
        key: sum(a == b for a, b in zip(rows, reference, strict=True)) for key, rows in outputs.items()
    }
    by_batch = {}
    for b in args.batch_sizes:
        best_fixed = max(FIXED, key=lambda k: tok_s[f"sd k={k}@{b}"])
        faster = max(tok_s[f"auto@{b}"], tok_s[f"sd k={best_fixed}@{b}"])
        by_batch[str(b)] = {
            "auto": tok_s[f"auto@{b}"],
            "best_fixed_k": best_fixed,
            "best_fixed": tok_s[f"sd k={best_fixed}@{b}"],
            "k_auto": tok_s[f"sd k=auto@{b}"],
            "k_auto_vs_faster": tok_s[f"sd k=auto@{b}"] / faster,
            **chosen[str(b)],
        }
    record = {
        **provenance(),
        "what": "sd with k auto vs auto and fixed-k sd, greedy, by batch size, interleaved repeats",
        "by_batch": by_batch,
        "tok_s": tok_s,
        "tok_s_all_repeats": rates,
        "identical_to_auto": identical,
        "prompts": len(prompts),
        "prompt_source": "humaneval test, seeded subset",
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "cost_profile": {
            "digest": profile.digest(),
            "measured_in_seconds": profile_seconds,
            **profile.to_dict(),
        },
        "target": args.target,
        "draft": args.draft,
        "dtype": dtype,
        "quantize": args.quantize,
        "threads": torch.get_num_threads(),
        "read_bandwidth_bytes_per_second": read_bandwidth(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print("| B | auto | best fixed k | k auto | k auto / faster | drafts per block |")
    for b, row in by_batch.items():
        print(
            f"| {b} | {row['auto']:.2f} | {row['best_fixed']:.2f} (k={row['best_fixed_k']})"
            f" | {row['k_auto']:.2f} | {row['k_auto_vs_faster']:.2f} | {row['drafts_per_block']:.2f} |"
        )


if __name__ == "__main__":
    main()
