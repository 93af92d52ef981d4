"""What running the target in bf16 changes against fp32: logits, greedy tokens and step times.

For each prompt the fp32 model decodes ``--tokens`` greedy tokens (its logits at every step kept);
the bf16 model then reads the prompt and those tokens in one teacher-forced forward. Because every
earlier token is the fp32 one, the first position where the bf16 argmax differs is exactly where a
free-running bf16 greedy decode would leave the fp32 one; the per-position top-1 agreement and the
largest |logit difference| come from the same forward. Step times (1 and k + 1 tokens on a cached
prompt) and weight bytes per second against the read bandwidth are measured in the same process.
On a CPU without native bf16 (``diversed.devices.native_bf16``) oneDNN emulates the bf16 kernels:
the numerics are the same up to summation order, the bf16 times are not representative.

    python benchmarks/bf16_agreement.py --prompts 20 --out benchmarks/results/bf16-agreement.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from diversed.data import load_examples
from diversed.devices import native_bf16
from diversed.jobs.bench import read_bandwidth, step_seconds, weight_bytes
from diversed.loading.models import load_model, load_tokenizer


@torch.inference_mode()
def greedy(model, prompt: list[int], tokens: int) -> tuple[list[int], torch.Tensor]:
    """``tokens`` greedy tokens after ``prompt`` and the fp32 logits that chose each [tokens, V]."""
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True).logits[0, -1]
    chosen, rows = [], []
    for _ in range(tokens):
        rows.append(logits.float())
        chosen.append(int(logits.argmax()))
        step = torch.tensor([[chosen[-1]]])
        logits = model(input_ids=step, cache=cache, use_cache=True).logits[0, -1]
    return chosen, torch.stack(rows)


@torch.inference_mode()
def teacher_forced(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The logits [len(tokens), V] that predicted each of ``tokens`` after ``prompt``, in fp32."""
    ids = torch.tensor([prompt + tokens[:-1]])
    return model(input_ids=ids, logits_to_keep=len(tokens)).logits[0].float()


def compare(reference: list[int], ref_logits: torch.Tensor, other_logits: torch.Tensor) -> dict:
    picks = other_logits.argmax(-1).tolist()
    same = [a == b for a, b in zip(reference, picks, strict=True)]
    return {
        "identical_prefix": same.index(False) if False in same else len(same),
        "top1_agreement": sum(same) / len(same),
        "max_abs_logit_diff": float((ref_logits - other_logits).abs().max()),
        "logit_scale": float(ref_logits.abs().max()),
    }


def summarise(per_prompt: list[dict], tokens: int) -> dict:
    """The agreement figures over prompts of :func:`compare` records, ``tokens`` greedy tokens each."""
    identical = sum(p["identical_prefix"] for p in per_prompt)
    return {
        "identical_greedy_tokens": identical,
        "identical_greedy_share": identical / (len(per_prompt) * tokens),
        "prompts_fully_identical": sum(p["identical_prefix"] == tokens for p in per_prompt),
        "top1_agreement": statistics.mean(p["top1_agreement"] for p in per_prompt),
        "max_abs_logit_diff": max(p["max_abs_logit_diff"] for p in per_prompt),
        "median_max_abs_logit_diff": statistics.median(p["max_abs_logit_diff"] for p in per_prompt),
    }


def step_figures(model, prompt: list[int], k: int, bandwidth: float) -> dict:
    one, size = step_seconds(model, prompt, 1, repeats=3), weight_bytes(model)
    return {
        "step_1_s": one,
        f"step_{k + 1}_s": step_seconds(model, prompt, k + 1, repeats=3),
        "weight_bytes": size,
        "weight_bytes_per_s": size / one,
        "share_of_bandwidth": size / one / bandwidth,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:qwen2.5-coder-1.5b")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    started = time.time()
    tokenizer = load_tokenizer(args.model)
    examples = load_examples(args.dataset, "test", args.prompts)
    prompts = [tokenizer(e.prompt).input_ids for e in examples]
    bandwidth = read_bandwidth()

    fp32 = load_model(args.model, "float32")
    steps = {"float32": step_figures(fp32, prompts[0], args.k, bandwidth)}
    references = [greedy(fp32, prompt, args.tokens) for prompt in prompts]
    del fp32

    bf16 = load_model(args.model, "bfloat16")
    steps["bfloat16"] = step_figures(bf16, prompts[0], args.k, bandwidth)
    per_prompt = [
        compare(tokens, logits, teacher_forced(bf16, prompt, tokens))
        for prompt, (tokens, logits) in zip(prompts, references, strict=True)
    ]
    record = {
        "command": " ".join(["python", *sys.argv]),
        "machine": {"cpu": platform.processor() or platform.machine(), "native_bf16": native_bf16()},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model": args.model,
        "dataset": args.dataset,
        "prompts": args.prompts,
        "tokens_per_prompt": args.tokens,
        "read_bandwidth_bytes_per_s": bandwidth,
        "steps": steps,
        "bf16_over_fp32_step_1": steps["bfloat16"]["step_1_s"] / steps["float32"]["step_1_s"],
        **summarise(per_prompt, args.tokens),
        "per_prompt": per_prompt,
        "wall_s": time.time() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "per_prompt"}, indent=2))


if __name__ == "__main__":
    main()
