"""Side-by-side benchmark: HF autoregressive ``generate``, HF assisted generation, and ours.

All three run in one process, on the same prompts, greedy, with the same draft length k, and must
produce the same tokens. Besides throughput it measures the inputs of Leviathan et al.'s speedup
formula, so a slow result can be told apart from a slow implementation:

* ``alpha``: acceptance rate of our run (accepted / drafted);
* ``c``: one draft forward / one target forward (1 token, warm cache);
* ``verify_cost``: the target forward that verifies a block (k + 1 tokens) / a 1-token forward;
* ``predicted_speedup`` = E[tokens per block] / (k c + verify_cost), with
  E = (1 - alpha^(k+1)) / (1 - alpha) (Leviathan's i.i.d. acceptance);
* ``predicted_speedup_from_mal``: the same with E = the measured mean accepted length, which
  holds when acceptances are not i.i.d. (real text: runs of easy tokens, then hard ones);
* ``measured_speedup`` = ours tok/s / autoregressive tok/s.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import DynamicCache

from diversed.config import DecodeConfig
from diversed.cpu import use_onednn_linear
from diversed.decoding import Decoder, _crop, _forward
from diversed.stats import GenerationStats, leviathan_speedup

DEFAULT_PROMPTS = [
    "def fibonacci(n):\n    ",
    "The quick brown fox jumps over the lazy dog. ",
    "Question: What is 12 times 7?\nAnswer: ",
]


def _tiny_bench_pair():
    """A target several times costlier per token than its 1-layer draft (greedy agreement ~0.74)."""
    from diversed.tiny import tiny_pair, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    target, draft = tiny_pair(
        vocab_size=len(tokenizer), hidden=512, target_layers=8, draft_layers=1, layer_scale=2e-4
    )
    return target, draft, tokenizer, "tiny-llama-8L-512 (built in code)", "its first layer"


def _load_pair(args: argparse.Namespace):
    from diversed.models import load_pair, load_tokenizer

    target, draft = load_pair(args.target, args.draft, args.dtype, onednn=not args.no_onednn)
    return target, draft, load_tokenizer(args.target), args.target, args.draft


def step_seconds(model, prompt: list[int], new_tokens: int, repeats: int = 5) -> float:
    """Median time of one forward over ``new_tokens`` tokens on top of a cached prompt."""
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        _forward(model, prompt, cache)
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            _forward(model, [prompt[-1]] * new_tokens, cache)
            times.append(time.perf_counter() - start)
            _crop(cache, len(prompt))
    return statistics.median(times[1:])  # the first one warms up


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.target and not args.draft:
        raise ValueError("--target needs --draft")
    target, draft, tokenizer, target_name, draft_name = (
        _load_pair(args) if args.target else _tiny_bench_pair()
    )
    if not args.no_onednn:
        use_onednn_linear(target)
        use_onednn_linear(draft)
    k, budget = args.num_assistant_tokens, args.max_new_tokens
    prompts = [tokenizer(p).input_ids for p in (args.prompts or DEFAULT_PROMPTS)]
    eos = tokenizer.eos_token_id
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    hf_kwargs = {"do_sample": False, "max_new_tokens": budget, "eos_token_id": eos, "pad_token_id": eos}
    config = DecodeConfig.from_dict({"method": "sd", "num_assistant_tokens": k, "max_new_tokens": budget})
    ours = Decoder(target, draft, config, eos_token_ids=[eos] if eos is not None else [])

    def hf(prompt: list[int], assisted: bool) -> list[int]:
        extra = {"assistant_model": draft} if assisted else {}
        out = target.generate(torch.tensor([prompt]), **hf_kwargs, **extra)
        return out[0, len(prompt) :].tolist()

    systems = {
        "auto": lambda p: hf(p, assisted=False),
        "hf_assisted": lambda p: hf(p, assisted=True),
        "ours": lambda p: ours.generate(p).token_ids,
    }
    outputs: dict[str, list[list[int]]] = {}
    rates: dict[str, list[float]] = {name: [] for name in systems}
    for name, run in systems.items():  # warm-up, and the outputs compared for identity
        outputs[name] = [run(p) for p in prompts]
    for _ in range(args.repeats):
        for name, run in systems.items():  # interleaved, so drifts in machine load hit all three
            start = time.perf_counter()
            produced = sum(len(run(p)) for p in prompts)
            rates[name].append(produced / (time.perf_counter() - start))
    stats = GenerationStats.total(ours.generate(p).stats for p in prompts)
    alpha = stats.acceptance_rate or 0.0
    probe = prompts[0]
    t1 = step_seconds(target, probe, 1)
    c = step_seconds(draft, probe, 1) / t1
    verify_cost = step_seconds(target, probe, k + 1) / t1
    tok_s = {name: statistics.median(r) for name, r in rates.items()}
    predicted = leviathan_speedup(alpha, k, c, verify_cost)
    result = {
        "auto_tok_s": tok_s["auto"],
        "hf_assisted_tok_s": tok_s["hf_assisted"],
        "ours_tok_s": tok_s["ours"],
        "identical": outputs["ours"] == outputs["auto"] == outputs["hf_assisted"],
        "alpha": alpha,
        "mean_accepted_length": stats.mean_accepted_length,
        "c": c,
        "verify_cost": verify_cost,
        "verify_tokens": k + 1,
        "predicted_speedup": predicted,
        "predicted_speedup_from_mal": (stats.mean_accepted_length or 1.0) / (k * c + verify_cost),
        "measured_speedup": tok_s["ours"] / tok_s["auto"],
        "ours_vs_hf_assisted": tok_s["ours"] / tok_s["hf_assisted"],
        "k": k,
        "max_new_tokens": budget,
        "prompts": len(prompts),
        "repeats": args.repeats,
        "tok_s_all_repeats": rates,
        "target": target_name,
        "draft": draft_name,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "onednn_linear": not args.no_onednn,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": platform.processor() or platform.machine(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    return result


def format_table(r: dict[str, Any]) -> str:
    hf_ratio = r["hf_assisted_tok_s"] / r["auto_tok_s"]
    lines = [
        f"target {r['target']} | draft {r['draft']} | k={r['k']}"
        f" | {r['max_new_tokens']} tokens x {r['prompts']} prompts"
        f" | {r['threads']} threads | median of {r['repeats']}",
        f"{'system':<14}{'tok/s':>10}{'vs auto':>10}",
        f"{'auto (HF)':<14}{r['auto_tok_s']:>10.2f}{1.0:>10.2f}",
        f"{'HF assisted':<14}{r['hf_assisted_tok_s']:>10.2f}{hf_ratio:>10.2f}",
        f"{'ours (sd)':<14}{r['ours_tok_s']:>10.2f}{r['measured_speedup']:>10.2f}",
        f"identical: {r['identical']} | alpha {r['alpha']:.3f} | c {r['c']:.3f}"
        f" | verify cost ({r['verify_tokens']} tokens) {r['verify_cost']:.2f}x"
        f" | mean accepted length {r['mean_accepted_length']:.2f}",
        f"speedup over auto: predicted {r['predicted_speedup']:.2f}x (i.i.d. alpha),"
        f" {r['predicted_speedup_from_mal']:.2f}x (measured accepted length);"
        f" measured {r['measured_speedup']:.2f}x"
        f" = {r['measured_speedup'] / r['predicted_speedup']:.0%} of the i.i.d. prediction",
    ]
    return "\n".join(lines)
