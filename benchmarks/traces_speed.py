"""Trace collection speed: token-by-token sampling from mu (the old way) against speculative
sampling in the engine's trace mode (batch 1 and batched), on the same prompts, in one process.

The token-by-token baseline runs one target and one draft forward per emitted token, as
collect-traces did before the engine's trace mode. Reported: seconds per emitted token of each and
the ratios. Usage (embedded pair, MBPP train prompts from $DIVERSED_DATA_DIR):

    python benchmarks/traces_speed.py --prompts 4 --out benchmarks/results/traces-speed.json

``--dtype`` (auto: bf16 where the CPU has native bf16) picks what both collections run in.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from diversed.config import DTYPES
from diversed.data import load_examples
from diversed.devices import choose_dtype
from diversed.engine.cache import RaggedCache
from diversed.engine.loop import Decoder
from diversed.engine.sampling import RowRandom, Sampling, draw, probabilities
from diversed.jobs.traces import TraceJob, behaviour_config
from diversed.loading.models import eos_ids, load_pair, load_tokenizer


@torch.inference_mode()
def token_by_token(
    target, draft, prompt: list[int], weight: float, budget: int, eos: set[int], seed: int
) -> int:
    """Sample from mu = w p + (1 - w) q with one forward of each model per token; return tokens."""
    caches = [RaggedCache(model, 1) for model in (target, draft)]
    for cache in caches:
        cache.prefill([prompt[:-1]])
    rng, last, real = RowRandom([seed]), torch.tensor([[prompt[-1]]]), torch.ones(1, 1, dtype=torch.bool)
    sampling = Sampling(temperature=1.0)
    for produced in range(1, budget + 1):
        (p_logits, _), (q_logits, _) = (cache.forward(last, real, hidden=True) for cache in caches)
        p, q = probabilities(p_logits[:, -1], sampling), probabilities(q_logits[:, -1], sampling)
        y = draw(weight * p + (1 - weight) * q, sampling, rng.uniform(1, real[:, 0])[:, 0])
        if int(y) in eos:
            return produced
        last = y.unsqueeze(1)
    return budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="embedded:qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--dataset", default="mbpp")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--weight", type=float, default=0.5)
    parser.add_argument("--draft-length", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help="auto: bf16 where the CPU has it")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    args.dtype, why = choose_dtype(args.dtype)
    print(f"dtype {args.dtype} ({why})", flush=True)
    target, draft = load_pair(args.target, args.draft, args.dtype)
    tokenizer = load_tokenizer(args.target)
    eos = eos_ids(tokenizer, target)
    prompts = [tokenizer(e.prompt).input_ids for e in load_examples(args.dataset, "train", args.prompts)]
    job = TraceJob(args.dataset, max_new_tokens=args.max_new_tokens, draft_length=args.draft_length)
    decoder = Decoder(target, draft, behaviour_config(job, args.weight), eos_token_ids=eos, traces=True)
    seeds = list(range(len(prompts)))
    result = {}
    start = time.perf_counter()
    tokens = sum(
        token_by_token(target, draft, p, args.weight, args.max_new_tokens, eos, s)
        for p, s in zip(prompts, seeds, strict=True)
    )
    result["token_by_token"] = {"tokens": tokens, "seconds": time.perf_counter() - start}
    for batch in (1, args.batch_size):
        start = time.perf_counter()
        tokens = 0
        for i in range(0, len(prompts), batch):
            tokens += sum(
                len(g.token_ids)
                for g in decoder.generate_batch(prompts[i : i + batch], seeds=seeds[i : i + batch])
            )
        result[f"speculative@{batch}"] = {"tokens": tokens, "seconds": time.perf_counter() - start}
    for row in result.values():
        row["seconds_per_token"] = row["seconds"] / row["tokens"]
    base = result["token_by_token"]["seconds_per_token"]
    ratios = {k: base / v["seconds_per_token"] for k, v in result.items() if k != "token_by_token"}
    record = {
        "per_token_speedup_over_token_by_token": ratios,
        "runs": result,
        "args": vars(args),
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
