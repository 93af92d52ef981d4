"""Does a model whose packed weights are mapped from the store decode as fast as one packed in
memory? Loads the embedded 1.5B target both ways, alternately in fresh processes, and times
1-token steps after a 64-token prefill (same seeded prompt, greedy tokens compared).

    python benchmarks/packed_store_step.py --out benchmarks/results/packed-store-step.json [--pairs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = "embedded:qwen2.5-coder-1.5b"


def one(steps: int) -> dict:
    """Load, then time ``steps`` 1-token steps; runs in the child process."""
    start = time.perf_counter()
    import torch
    from transformers import DynamicCache

    from diversed.devices import choose_dtype
    from diversed.loading.models import load_model

    dtype = choose_dtype("auto")[0]
    imported = time.perf_counter()
    model = load_model(TARGET, dtype)
    loaded = time.perf_counter()
    torch.manual_seed(0)
    ids = torch.randint(100, 1000, (1, 64))
    times, tokens = [], []
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        token = model(ids, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        for _ in range(steps):
            begin = time.perf_counter()
            token = model(token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            times.append(time.perf_counter() - begin)
            tokens.append(token.item())
    return {
        "dtype": dtype,
        "load_seconds": loaded - imported,
        "imports_seconds": imported - start,
        "median_step_ms": statistics.median(times) * 1e3,
        "step_ms": [round(t * 1e3, 2) for t in times],
        "tokens": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.steps)))
        return
    store = tempfile.mkdtemp(prefix="diversed-packed-")
    runs = []
    for pair in range(args.pairs + 1):  # pair 0 writes the store and is not kept
        for route, setting in (("packed in memory", "off"), ("mapped from the store", store)):
            env = {**os.environ, "DIVERSED_PACKED_CACHE": setting, "TRANSFORMERS_VERBOSITY": "error"}
            child = [sys.executable, __file__, "--child", "--steps", str(args.steps)]
            out = subprocess.run(child, env=env, capture_output=True, text=True, check=True).stdout
            row = {"route": route, "pair": pair, **json.loads(out.strip().splitlines()[-1])}
            print(f"{route} #{pair}: load {row['load_seconds']:.2f} s, step {row['median_step_ms']:.1f} ms")
            if pair:
                runs.append(row)
    from diversed.jobs.bench import provenance

    tokens = {json.dumps(r["tokens"]) for r in runs}
    record = {"runs": runs, "same_tokens": len(tokens) == 1, **provenance()}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
