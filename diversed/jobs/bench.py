"""Side-by-side throughput benchmark: ours against Hugging Face, per batch size, in one process.

For every batch size B, on the same prompts, greedy, with the same draft length k:

* ``ours_sd``: our speculative loop, B prompts per ``generate_batch`` call;
* ``ours_auto``: our autoregressive loop (the same engine with no draft), B prompts per call;
* ``hf_generate``: ``model.generate`` on B left-padded prompts;
* ``hf_assisted``: HF assisted generation, which supports only B = 1, on the same models (our
  pre-packed CPU linears), so it and ours differ only in the decoding loop;
* ``hf_assisted_stock``: the same on models loaded as a user loads them (``from_pretrained`` in the
  same dtype, torch's own linears): what our package is measured against in practice.

Throughput is the dataset's: all generated tokens over the wall time of all calls, the median of
the repeats, which run interleaved (every system and batch size once per repeat) so machine-load
drifts hit all alike. Every row must equal our batch-1 autoregressive output; the record says which
do not and where they first differ. It also measures the inputs of Leviathan et al.'s speed-up
formula at B = 1 (acceptance alpha, draft/target step ratio c, verification cost) and, as the
physical limit, the weight bytes a 1-token target step streams per second against a memory read
bandwidth measured in the same process. No test asserts on time; the JSON records are the result.
"""

from __future__ import annotations

import copy
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers

from diversed.backends.cost_profile import forward_seconds
from diversed.config import DecodeConfig
from diversed.devices import device_name, timed
from diversed.engine.cache import RaggedCache
from diversed.engine.loop import Decoder
from diversed.engine.stats import GenerationStats, leviathan_speedup

DEFAULT_PROMPTS = [
    "def fibonacci(n):\n    ",
    "The quick brown fox jumps over the lazy dog. ",
    "Question: What is 12 times 7?\nAnswer: ",
    "import os\nimport sys\n\ndef main():\n",
    "class Stack:\n    def __init__(self):\n",
    "Once upon a time, ",
    "SELECT name FROM users WHERE ",
    "for i in range(10):\n    ",
]

Runner = Callable[[list[list[int]]], list[list[int]]]


@dataclass(frozen=True)
class BenchSpec:
    """What `diversed bench` compares: the pair (None: a tiny one built in code), the prompts, the
    batch sizes and repeats, and where the record goes."""

    out: str
    target: str | None = None
    draft: str | None = None
    dtype: str = "auto"
    quantize: str = "none"
    prompts: tuple[str, ...] = ()
    dataset: str | None = None
    n_prompts: int = 8
    data_dir: str | None = None
    batch_sizes: tuple[int, ...] = (1, 4)
    max_new_tokens: int = 64
    num_assistant_tokens: int = 5
    repeats: int = 3
    threads: int | None = None
    onednn: bool = True
    device: str = "cpu"


def _tiny_bench_pair():
    """A target several times costlier per token than its 1-layer draft (greedy agreement ~0.74)."""
    from diversed.loading.tiny import tiny_pair, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    target, draft = tiny_pair(
        vocab_size=len(tokenizer), hidden=512, target_layers=8, draft_layers=1, layer_scale=2e-4
    )
    return target, draft, tokenizer, "tiny-llama-8L-512 (built in code)", "its first layer"


def load_bench_pair(spec: BenchSpec):
    from diversed.loading.models import load_pair, load_tokenizer

    target, draft = load_pair(
        spec.target, spec.draft, spec.dtype, spec.device, onednn=spec.onednn, quantize=spec.quantize
    )
    return target, draft, load_tokenizer(spec.target), spec.target, spec.draft


def stock_pair(spec: BenchSpec, target, draft):
    """The pair as a user of transformers loads it: same weights and dtype, torch's own linears."""
    if not spec.target:
        return copy.deepcopy(target), copy.deepcopy(draft)  # taken before our linears are installed
    from diversed.loading.models import load_pair

    return load_pair(spec.target, spec.draft, spec.dtype, spec.device, onednn=False)


def _prompts(spec: BenchSpec, tokenizer) -> tuple[list[list[int]], str]:
    if spec.prompts:
        return [tokenizer(p).input_ids for p in spec.prompts], "--prompts"
    if spec.dataset:
        from diversed.data import load_examples

        examples = load_examples(spec.dataset, "test", spec.n_prompts, directory=spec.data_dir)
        return [tokenizer(e.prompt).input_ids for e in examples], f"{spec.dataset} test, seeded subset"
    return [tokenizer(p).input_ids for p in DEFAULT_PROMPTS], "built-in"


def step_seconds(model, prompt: list[int], new_tokens: int, rows: int = 1, repeats: int = 5) -> float:
    """Median time of one forward over ``new_tokens`` tokens per row on top of a cached prompt."""
    with torch.inference_mode():
        cache = RaggedCache(model, rows)
        ids = torch.tensor([prompt] * rows, device=model.device)
        cache.forward(ids, torch.ones_like(ids, dtype=torch.bool), logits_to_keep=1)
        return forward_seconds(cache, new_tokens, repeats)


def configure_assistant(draft, k: int) -> None:
    """HF assisted generation with a constant draft length k and no confidence stop, as ours."""
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0


def provenance() -> dict[str, Any]:
    """Where and from what a benchmark record came: the machine, the date, the commit and the
    command line, so a committed record can be rerun and compared."""
    import os
    import sys

    from diversed.provenance import commit

    return {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit(),
        "command": " ".join(sys.argv),
    }


def read_bandwidth(gib: float = 2.0, repeats: int = 5, device: str = "cpu") -> float:
    """Memory read bandwidth of ``device`` in bytes/s: a sum over ``gib`` GiB of touched fp32, best
    of ``repeats``. The buffer is filled first (untouched pages all map to one zero page and read
    at fantasy speed); on a GPU the timer waits for the kernel."""
    buffer = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32, device=device)
    times: list[float] = []
    for _ in range(repeats):
        with timed(device, times):
            buffer.sum()
    return buffer.numel() * 4 / min(times)


def weight_bytes(model) -> int:
    """Bytes of weights one forward streams: every linear's weight in the form its kernel reads
    (oneDNN-packed, fbgemm fp16 or dense) and every other parameter, each once. Embedding tables
    are left out: a forward gathers one row per token from them (a tied output layer still counts,
    as a linear)."""
    seen, total = set(), 0
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            continue
        if hasattr(module, "fp16_weight"):  # fbgemm's packed fp16 (diversed.backends.cpu.quantize)
            total += module.weight.numel() * 2
            tensors = [module.bias] if module.bias is not None else []
        else:
            tensors = list(module.parameters(recurse=False))
        packed = getattr(module, "packed_weight", None)
        if packed is not None:
            tensors.append(packed)
        for t in tensors:
            key = id(t) if t.is_mkldnn else t.data_ptr()  # oneDNN tensors have no data pointer
            if t.device.type != "meta" and key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
    return total


def _cut_at_eos(tokens: list[int], eos: int | None) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos is not None and eos in tokens else tokens


def _systems(target, draft, stock, tokenizer, spec: BenchSpec) -> dict[str, Runner]:
    k, budget = spec.num_assistant_tokens, spec.max_new_tokens
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    eos_ids = [eos] if eos is not None else []
    for assistant in (draft, stock[1]):
        configure_assistant(assistant, k)
    hf_kwargs = {"do_sample": False, "max_new_tokens": budget, "eos_token_id": eos, "pad_token_id": pad}

    def ours(method: str) -> Runner:
        config = DecodeConfig.from_dict(
            {"method": method, "num_assistant_tokens": k, "max_new_tokens": budget}
        )
        decoder = Decoder(target, draft if method != "auto" else None, config, eos_token_ids=eos_ids)
        return lambda batch: [g.token_ids for g in decoder.generate_batch(batch)]

    def hf(batch: list[list[int]], pair=(target, draft), assisted: bool = False) -> list[list[int]]:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=pair[0].device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=pair[0].device)
        extra = {"assistant_model": pair[1]} if assisted else {}
        out = pair[0].generate(input_ids=ids, attention_mask=mask, **hf_kwargs, **extra)
        return [_cut_at_eos(row[width:].tolist(), eos) for row in out]

    return {
        "ours_sd": ours("sd"),
        "ours_auto": ours("auto"),
        "hf_generate": hf,
        "hf_assisted": lambda batch: hf(batch, assisted=True),
        "hf_assisted_stock": lambda batch: hf(batch, pair=stock, assisted=True),
    }


BATCH_ONE_ONLY = ("hf_assisted", "hf_assisted_stock")  # HF assisted generation supports nothing else


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_bench(spec: BenchSpec) -> dict[str, Any]:
    if spec.threads:
        torch.set_num_threads(spec.threads)
    if spec.target and not spec.draft:
        raise ValueError("--target needs --draft")
    target, draft, tokenizer, target_name, draft_name = (
        load_bench_pair(spec) if spec.target else _tiny_bench_pair()
    )
    stock = stock_pair(spec, target, draft)
    if not spec.target:
        from diversed.loading.models import use_cpu_linears

        for model in (target, draft, *stock):
            model.to(spec.device)
        for model in (target, draft):
            use_cpu_linears(model, spec.device, spec.onednn, spec.quantize)
    prompts, prompt_source = _prompts(spec, tokenizer)
    if max(spec.batch_sizes) > len(prompts):
        raise ValueError(f"batch size {max(spec.batch_sizes)} is larger than the {len(prompts)} prompts")
    systems = _systems(target, draft, stock, tokenizer, spec)
    plan = [(name, b) for b in spec.batch_sizes for name in systems if name not in BATCH_ONE_ONLY or b == 1]
    outputs: dict[str, list[list[int]]] = {}
    rates: dict[str, list[float]] = {f"{name}@{b}": [] for name, b in plan}
    partial = Path(spec.out).with_suffix(".partial.json")
    partial.parent.mkdir(parents=True, exist_ok=True)
    for repeat in range(1, spec.repeats + 1):  # the first repeat's outputs are the ones compared
        for name, b in plan:
            produced = []
            seconds: list[float] = []
            with timed(spec.device, seconds):
                for i in range(0, len(prompts), b):
                    produced.extend(systems[name](prompts[i : i + b]))
            rates[f"{name}@{b}"].append(sum(len(t) for t in produced) / seconds[0])
            outputs.setdefault(f"{name}@{b}", produced)
        print(f"repeat {repeat}/{spec.repeats}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in rates.items()))
        partial.write_text(json.dumps({"tok_s_all_repeats": rates}, indent=1) + "\n")
    partial.unlink()

    reference = outputs["ours_auto@1"]
    identity = {}
    for key, rows in outputs.items():
        diffs = [first_difference(row, ref) for row, ref in zip(rows, reference, strict=True)]
        identity[key] = {
            "identical_rows": sum(d is None for d in diffs),
            "first_difference": [d for d in diffs if d is not None],
        }
    tok_s = {key: statistics.median(r) for key, r in rates.items()}

    k = spec.num_assistant_tokens
    sd_stats = GenerationStats.total(
        Decoder(
            target,
            draft,
            DecodeConfig.from_dict(
                {"method": "sd", "num_assistant_tokens": k, "max_new_tokens": spec.max_new_tokens}
            ),
            eos_token_ids=[tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [],
        )
        .generate(p)
        .stats
        for p in prompts[:4]
    )
    alpha = sd_stats.acceptance_rate or 0.0
    probe = prompts[0]
    t1 = step_seconds(target, probe, 1)
    c = step_seconds(draft, probe, 1) / t1
    verify_cost = step_seconds(target, probe, k + 1) / t1
    bandwidth = read_bandwidth(device=spec.device)
    target_bytes = weight_bytes(target)
    best_b = max(spec.batch_sizes, key=lambda b: tok_s[f"ours_sd@{b}"])
    result = {
        "tok_s": tok_s,
        "tok_s_all_repeats": rates,
        "identity_vs_ours_auto_b1": identity,
        "best_sd_batch": best_b,
        "ratios": {
            "ours_sd_best_vs_ours_sd_b1": tok_s[f"ours_sd@{best_b}"] / tok_s["ours_sd@1"],
            "ours_sd_best_vs_hf_assisted": tok_s[f"ours_sd@{best_b}"] / tok_s["hf_assisted@1"],
            "ours_sd_b1_vs_hf_assisted": tok_s["ours_sd@1"] / tok_s["hf_assisted@1"],
            "ours_sd_best_vs_hf_assisted_stock": tok_s[f"ours_sd@{best_b}"] / tok_s["hf_assisted_stock@1"],
            "ours_sd_b1_vs_hf_assisted_stock": tok_s["ours_sd@1"] / tok_s["hf_assisted_stock@1"],
            "ours_sd_b1_vs_ours_auto_b1": tok_s["ours_sd@1"] / tok_s["ours_auto@1"],
        },
        "alpha": alpha,
        "mean_accepted_length": sd_stats.mean_accepted_length,
        "c": c,
        "verify_cost": verify_cost,
        "verify_tokens": k + 1,
        "predicted_speedup": leviathan_speedup(alpha, k, c, verify_cost),
        "predicted_speedup_from_mal": (sd_stats.mean_accepted_length or 1.0) / (k * c + verify_cost),
        "target_step_seconds": t1,
        "target_weight_bytes": target_bytes,
        "target_weight_bytes_per_second": target_bytes / t1,
        "read_bandwidth_bytes_per_second": bandwidth,
        "share_of_bandwidth": target_bytes / t1 / bandwidth,
        "k": k,
        "max_new_tokens": spec.max_new_tokens,
        "batch_sizes": list(spec.batch_sizes),
        "prompts": len(prompts),
        "prompt_source": prompt_source,
        "new_tokens": {key: sum(len(t) for t in rows) for key, rows in outputs.items()},
        "repeats": spec.repeats,
        "target": target_name,
        "draft": draft_name,
        "dtype": str(target.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "onednn_linear": spec.onednn and spec.quantize == "none",
        "quantize": spec.quantize,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": platform.processor() or platform.machine(),
        "device": device_name(spec.device),
    }
    Path(spec.out).parent.mkdir(parents=True, exist_ok=True)
    Path(spec.out).write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    return result


def format_table(r: dict[str, Any]) -> str:
    """A Markdown table: tok/s per system and batch size, ratios and identity, then the step costs."""
    lines = [
        f"target {r['target']} | draft {r['draft']} | {r['dtype']}"
        f"{' (' + r['quantize'] + ' weights)' if r.get('quantize', 'none') != 'none' else ''} | k={r['k']}"
        f" | {r['prompts']} prompts ({r['prompt_source']}) x <= {r['max_new_tokens']} tokens"
        f" | {r['threads']} threads | median of {r['repeats']}",
        "",
        "| system | B | tok/s | vs ours sd B=1 | vs HF assisted | vs HF assisted, stock models"
        " | rows identical to ours auto B=1 |",
        "|---|---|---|---|---|---|---|",
    ]
    base, assisted = r["tok_s"]["ours_sd@1"], r["tok_s"]["hf_assisted@1"]
    stock = r["tok_s"]["hf_assisted_stock@1"]
    for key, rate in r["tok_s"].items():
        name, b = key.split("@")
        same = r["identity_vs_ours_auto_b1"][key]["identical_rows"]
        ratios = f"{rate / base:.2f} | {rate / assisted:.2f} | {rate / stock:.2f}"
        lines.append(f"| {name} | {b} | {rate:.2f} | {ratios} | {same}/{r['prompts']} |")
    lines += [
        "",
        f"alpha {r['alpha']:.3f} | mean accepted length {r['mean_accepted_length']:.2f} | c {r['c']:.3f}"
        f" | verify cost ({r['verify_tokens']} tokens) {r['verify_cost']:.2f}x"
        f" | predicted B=1 speed-up {r['predicted_speedup']:.2f}x (i.i.d. alpha),"
        f" {r['predicted_speedup_from_mal']:.2f}x (measured accepted length);"
        f" measured {r['ratios']['ours_sd_b1_vs_ours_auto_b1']:.2f}x over ours auto",
        f"target 1-token step {r['target_step_seconds'] * 1e3:.1f} ms streams"
        f" {r['target_weight_bytes_per_second'] / 1e9:.1f} GB/s of weights"
        f" = {r['share_of_bandwidth']:.0%} of the measured read bandwidth"
        f" {r['read_bandwidth_bytes_per_second'] / 1e9:.1f} GB/s",
    ]
    return "\n".join(lines)
