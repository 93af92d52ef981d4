"""The engine's KV storage side by side: transformers' DynamicCache (grows by cat) vs InPlaceKV.

Same process, same pair, same prompts; the two stores alternate run by run (A B A B ...) so that
load from anything else on the machine falls on both alike. Greedy ``auto`` and ``sd`` at batch 1
and 4; prints median tokens/s per store, their ratio, and whether the outputs are identical.

    .venv/bin/python benchmarks/kv_store.py --out benchmarks/results/kv-store-<machine>.json
    .venv/bin/python benchmarks/kv_store.py --tiny --repeats 1      # a pair built in code, seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from diversed import DecodeConfig, Decoder
from diversed.engine import cache as cache_module
from diversed.engine.kv import InPlaceKV
from diversed.jobs import bench

PROMPTS = [
    "def fibonacci(n):\n    ",
    "Question: A farmer has 12 cows and buys 7 more. How many cows does he have?\nAnswer:",
    "The quick brown fox jumps over the lazy dog. Then the fox",
    "import numpy as np\n\ndef moving_average(x, w):\n    ",
]


def dynamic(model, capacity: int) -> DynamicCache:
    """transformers' own store, grown by cat (what the engine keeps on CPUs)."""
    return DynamicCache()


def in_place(model, capacity: int) -> InPlaceKV:
    """Buffers written in place (what the engine uses on accelerators)."""
    return InPlaceKV(model.config.num_hidden_layers, capacity)


def run(decoder: Decoder, prompts: list[list[int]], batch: int) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    out = []
    for i in range(0, len(prompts), batch):
        out += [g.token_ids for g in decoder.generate_batch(prompts[i : i + batch])]
    return sum(map(len, out)) / (time.perf_counter() - start), out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tiny", action="store_true", help="a pair built in code instead of the embedded one"
    )
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="runs per store and case (3)")
    parser.add_argument("--out", help="JSON record to write")
    args = parser.parse_args(argv)
    if args.tiny:
        target, draft, tokenizer, name, _ = bench._tiny_bench_pair()
    else:
        from diversed.devices import choose_dtype

        dtype = choose_dtype("auto", "cpu")[0]  # bf16 where the CPU has it, as a decode job runs
        embedded = ("embedded:qwen2.5-coder-1.5b", "embedded:qwen2.5-coder-0.5b")
        spec = bench.BenchSpec(out="", target=embedded[0], draft=embedded[1], dtype=dtype)
        target, draft, tokenizer, name, _ = bench.load_bench_pair(spec)
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    stores = {"dynamic_cat": dynamic, "in_place": in_place}
    cases = {}
    original = cache_module.key_value_store
    for method, batch in (("auto", 1), ("sd", 1), ("auto", 4), ("sd", 4)):
        config = DecodeConfig.from_dict(
            {"method": method, "max_new_tokens": args.new_tokens, "num_assistant_tokens": 4}
        )
        decoder = Decoder(target, draft if method == "sd" else None, config)
        rates: dict[str, list[float]] = {s: [] for s in stores}
        outputs = {}
        for _ in range(args.repeats + 1):  # the first round warms up and is dropped
            for store, make in stores.items():
                cache_module.key_value_store = make
                rate, outputs[store] = run(decoder, prompts, batch)
                rates[store].append(rate)
        median = {s: statistics.median(r[1:]) for s, r in rates.items()}
        cases[f"{method}@{batch}"] = {
            "tok_s": median,
            "in_place_over_dynamic": median["in_place"] / median["dynamic_cat"],
            "identical": outputs["in_place"] == outputs["dynamic_cat"],
        }
        print(method, batch, json.dumps(cases[f"{method}@{batch}"]), flush=True)
    cache_module.key_value_store = original
    record = {
        **bench.provenance(),
        "pair": name,
        "dtype": str(target.dtype),
        "threads": torch.get_num_threads(),
        "new_tokens": args.new_tokens,
        "prompts": len(prompts),
        "repeats": args.repeats,
        "cases": cases,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    return record


if __name__ == "__main__":
    main()
