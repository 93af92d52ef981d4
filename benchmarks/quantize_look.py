"""A measured look at smaller weights for CPU linears: how much faster, exact per row, how lossy,
and whether the model stays a continuous function of its inputs.

Bytes per weight are the lever for single-stream CPU speed (``../shared/reference/cpu-speed.md``:
llama.cpp streams ~1.1 GB of Q4_K weights per token where our fp32 path streams 6 GB). Stock torch
offers these routes, compared here with the oneDNN-packed fp32 linear the engine uses by default:

* ``fp16``: fp16 weights, fp32 activations and sums, fbgemm's "dynamic fp16" linear: what
  ``--quantize fp16`` (:mod:`diversed.backends.cpu.quantize`) runs;

* ``w8``: weight-only int8 with per-output-row scales, ``aten._weight_int8pack_mm`` (bf16
  activations; its fp32 path is scalar);
* ``w8a7``: weights and activations in int8 through fbgemm, with one activation scale *per row*
  (token), 7-bit so that AVX2's pairwise u8 x s8 products cannot saturate. The integer products are
  exact, so a row's output never depends on its batch-mates: batched decoding would still equal
  batch-1 decoding, and a k-token verification the 1-token steps, which fbgemm's own dynamic
  linear (one scale per tensor) would break;
* ``w8a7-smooth``: the same after SmoothQuant's per-channel migration (alpha 0.5), calibrated on
  the benchmark's built-in prompts, none of them a HumanEval prompt.

Part 1 times one Qwen2.5-1.5B-shaped projection at the row counts decoding uses (1: a step at
batch 1; 4: a draft step at batch 4; 5: a k = 4 verification at batch 1; 20: at batch 4) and checks
row exactness. Part 2 puts each route into every linear of the real model and reads, teacher-forced
on fp32 greedy continuations of HumanEval prompts, the top-1 agreement with fp32 and the first
position where greedy decoding would leave fp32 (as ``bf16_agreement.py`` does for bf16). Part 3,
per route and prompt, runs the first ``k + 1`` of those tokens as one verification forward and as
``k + 1`` one-token steps on the same cache: speculative decoding is the target's own decoding only
if the two agree (fp32 differs there by summation order alone, ~1e-5 in the logits).

    python benchmarks/quantize_look.py --prompts 20 --tokens 32 --routes fp16 w8a7 --repeats 20 \
        --out benchmarks/results/quantize-look.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
import types
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from bf16_agreement import compare, greedy, summarise, teacher_forced
from torch import nn
from transformers import DynamicCache

from diversed.backends.cpu.onednn import use_onednn_linear
from diversed.backends.cpu.quantize import fp16_linear, pack_fp16
from diversed.data import load_examples
from diversed.devices import native_bf16
from diversed.jobs.bench import DEFAULT_PROMPTS
from diversed.loading.models import load_model, load_tokenizer

ACTIVATION_LEVELS = 63  # 7 bits, zero point 64: |x / scale| <= 63 keeps u8 x s8 pairs below 2**15
ROUTES = ("fp32", "fp16", "w8", "w8a7", "w8a7-smooth")
VERIFY_TOKENS = 5  # k + 1 with the engine's k = 4
SMOOTH_ALPHA = 0.5  # SmoothQuant's default migration strength


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale per output row: (int8 [N, K], scales [N])."""
    scale = weight.abs().amax(1).clamp_min(1e-12) / 127
    return torch.round(weight / scale[:, None]).to(torch.int8), scale


class WeightOnly:
    """``w8``: int8 weights, bf16 activations, ``aten._weight_int8pack_mm``."""

    def __init__(self, linear: nn.Linear) -> None:
        quantized, scale = int8_rows(linear.weight.detach().float())
        self.weight, self.scale = quantized, scale.bfloat16()
        self.bias = None if linear.bias is None else linear.bias.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).bfloat16()
        y = torch.ops.aten._weight_int8pack_mm(rows, self.weight, self.scale).float()
        y = y.reshape(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


class HalfWeights:
    """``fp16``: fbgemm's fp16-weight linear, fp32 activations (``diversed.backends.cpu.quantize``)."""

    def __init__(self, linear: nn.Linear) -> None:
        self.packed = pack_fp16(linear.weight, linear.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return fp16_linear(x, self.packed)


class PerRow:
    """``w8a7``: int8 weights and 7-bit activations with one scale per row, through fbgemm.

    ``smooth`` (per input channel, SmoothQuant's migration) divides the activations and multiplies
    the weight's columns: the product is unchanged, but an outlier channel no longer takes a
    row's whole 7-bit range.
    """

    def __init__(self, linear: nn.Linear, smooth: torch.Tensor | None = None) -> None:
        weight = linear.weight.detach().float()
        self.smooth = smooth
        quantized, scale = int8_rows(weight if smooth is None else weight * smooth)
        self.bias = None if linear.bias is None else linear.bias.detach()
        with warnings.catch_warnings():  # torch marks its quantized tensors deprecated, not yet gone
            warnings.simplefilter("ignore")
            per_channel = torch._make_per_channel_quantized_tensor(
                quantized, scale.double(), torch.zeros(len(scale), dtype=torch.long), 0
            )
            self.packed = torch.ops.quantized.linear_prepack(per_channel, None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.smooth is not None:
            x = x / self.smooth
        scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / ACTIVATION_LEVELS
        op = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32
        y = op(x / scale, 1.0, ACTIVATION_LEVELS + 1, self.packed) * scale
        return y if self.bias is None else y + self.bias


def median_ms(fn, x: torch.Tensor, repeats: int) -> float:
    for _ in range(3):
        fn(x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


@torch.inference_mode()
def kernels(rows: list[int], repeats: int) -> list[dict]:
    """Milliseconds per call of one 1536 -> 8960 projection (Qwen2.5-1.5B's gate/up) per route."""
    torch.manual_seed(0)
    linear = nn.Linear(1536, 8960, bias=False)
    nn.init.normal_(linear.weight, std=0.02)
    routes = {"fp16": HalfWeights(linear), "w8": WeightOnly(linear), "w8a7": PerRow(linear)}
    routes["fp32"] = nn.Sequential(linear)
    use_onednn_linear(routes["fp32"])
    out = []
    for m in rows:
        x = torch.randn(m, 1536)
        record = {"rows": m}
        for name, fn in routes.items():
            record[f"{name}_ms"] = round(median_ms(fn, x, repeats), 3)
            alone = torch.cat([fn(x[i : i + 1]) for i in range(m)])
            record[f"{name}_rows_exact"] = bool(torch.equal(alone, fn(x)))
        out.append(record)
        print(record, flush=True)
    return out


@torch.inference_mode()
def channel_maxima(model: nn.Module, prompts: list[list[int]]) -> dict[nn.Linear, torch.Tensor]:
    """Per linear, the largest |activation| of each input channel over the calibration prompts."""
    maxima: dict[nn.Linear, torch.Tensor] = {}

    def record(module: nn.Linear, args: tuple[torch.Tensor, ...]) -> None:
        seen = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0)
        maxima[module] = torch.maximum(maxima[module], seen) if module in maxima else seen

    hooks = [m.register_forward_pre_hook(record) for m in model.modules() if type(m) is nn.Linear]
    for prompt in prompts:
        model(input_ids=torch.tensor([prompt]))
    for hook in hooks:
        hook.remove()
    return maxima


def smoothing(module: nn.Linear, activation_max: torch.Tensor) -> torch.Tensor:
    """SmoothQuant's per-input-channel factors for one linear."""
    weight_max = module.weight.detach().abs().amax(0).clamp_min(1e-5)
    return (activation_max.clamp_min(1e-5) ** SMOOTH_ALPHA) / weight_max ** (1 - SMOOTH_ALPHA)


def switchable(model: nn.Module, calibration: list[list[int]], routes: list[str]) -> dict[str, str]:
    """Give every linear a forward that follows ``state["route"]``; return that state."""
    maxima = channel_maxima(model, calibration) if "w8a7-smooth" in routes else {}
    state = {"route": "fp32"}
    for module in list(model.modules()):
        if type(module) is not nn.Linear:
            continue
        builders = {
            "fp16": HalfWeights,
            "w8": WeightOnly,
            "w8a7": PerRow,
            "w8a7-smooth": lambda m: PerRow(m, smoothing(m, maxima[m])),
        }
        forwards = {"fp32": lambda x, m=module: F.linear(x, m.weight, m.bias)}
        forwards |= {route: builders[route](module) for route in routes}
        module.forward = types.MethodType(lambda self, x, f=forwards: f[state["route"]](x), module)
    return state


@torch.inference_mode()
def block_vs_steps(model: nn.Module, prompt: list[int], tokens: list[int]) -> dict:
    """Logits of ``tokens`` fed as one forward after a cached prompt against fed one at a time."""
    block_cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([prompt]), cache=block_cache, use_cache=True, logits_to_keep=1)
    step_cache = copy.deepcopy(block_cache)
    block = model(input_ids=torch.tensor([tokens]), cache=block_cache, use_cache=True).logits[0]
    steps = torch.cat(
        [model(input_ids=torch.tensor([[t]]), cache=step_cache, use_cache=True).logits[0] for t in tokens]
    )
    return {
        "max_abs_logit_diff": float((block - steps).abs().max()),
        "top1_same": bool(torch.equal(block.argmax(-1), steps.argmax(-1))),
    }


def agreement(model_name: str, n_prompts: int, tokens: int, routes: list[str]) -> dict:
    tokenizer = load_tokenizer(model_name)
    model = load_model(model_name, "float32", onednn=False)
    state = switchable(model, [tokenizer(p).input_ids for p in DEFAULT_PROMPTS], routes)
    prompts = [tokenizer(e.prompt).input_ids for e in load_examples("humaneval", "test", n_prompts)]
    per_route: dict[str, list[dict]] = {route: [] for route in routes}
    verification: dict[str, list[dict]] = {route: [] for route in ["fp32", *routes]}
    for i, prompt in enumerate(prompts):
        state["route"] = "fp32"
        reference, ref_logits = greedy(model, prompt, tokens)
        for route in verification:
            state["route"] = route
            if route in per_route:
                forced = teacher_forced(model, prompt, reference)
                per_route[route].append(compare(reference, ref_logits, forced))
            verification[route].append(block_vs_steps(model, prompt, reference[:VERIFY_TOKENS]))
        print(i, {r: v[-1]["identical_prefix"] for r, v in per_route.items()}, flush=True)
    summary = {route: {**summarise(rows, tokens), "per_prompt": rows} for route, rows in per_route.items()}
    checks = {
        route: {
            "max_abs_logit_diff": max(r["max_abs_logit_diff"] for r in rows),
            "median_max_abs_logit_diff": statistics.median(r["max_abs_logit_diff"] for r in rows),
            "prompts_top1_same": sum(r["top1_same"] for r in rows),
        }
        for route, rows in verification.items()
    }
    return {
        "model": model_name,
        "prompts": n_prompts,
        "tokens": tokens,
        "routes": summary,
        f"verification_{VERIFY_TOKENS}_tokens_vs_steps": checks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:qwen2.5-coder-1.5b")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 5, 20])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument(
        "--routes", nargs="+", default=list(ROUTES[1:]), choices=ROUTES[1:], help="routes compared with fp32"
    )
    parser.add_argument("--skip-agreement", action="store_true", help="kernel timings only")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.time()
    record = {
        "command": " ".join(sys.argv),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
        },
        "native_bf16": native_bf16(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "kernels": kernels(args.rows, args.repeats),
    }
    if not args.skip_agreement:
        record["agreement"] = agreement(args.model, args.prompts, args.tokens, args.routes)
    record["wall_seconds"] = round(time.time() - started, 1)
    text = json.dumps(record, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    for route, figures in record.get("agreement", {}).get("routes", {}).items():
        print(route, {k: v for k, v in figures.items() if k != "per_prompt"})
    for route, figures in (
        record.get("agreement", {}).get(f"verification_{VERIFY_TOKENS}_tokens_vs_steps", {}).items()
    ):
        print(route, "verification vs steps", figures)


if __name__ == "__main__":
    main()
