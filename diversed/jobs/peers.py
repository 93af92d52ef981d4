"""Ours beside Hugging Face on Spec-Bench's questions: one process, the same pair, the same prompts.

Greedy, batch 1, each question's first turn in the chat template, Spec-Bench's stratified subset
(the first k questions of each category by id). Three pairs of systems, each ours against the peer
a user would pick instead:

* ``auto``: our autoregressive loop against ``model.generate``;
* ``sd``: our speculative loop against HF assisted generation with the same constant k and no
  confidence stop (``hf_assisted``: the same models, so only the loop differs), against it on the
  pair as a user loads it (``hf_assisted_stock``: torch's own linears), and against HF's stock
  assistant settings (``hf_assisted_defaults``: 20 tokens, confidence stop 0.4, on the stock pair);
* ``static``: our static mixture verification against HF's ``assistant_ensemble_weight`` (the
  weight on the target in w·p + (1 − w)·q, transformers ≥ 5.25), which greedy decoding equals.

Repeats run interleaved (every system on every question once per repeat, the systems' order
rotating), and each call is timed alone, so a category's tokens per second is its questions'
tokens over their seconds; the median over repeats is kept. Where the algorithms agree the tokens
must too: every lossless system against our ``auto``, HF's ensemble against our ``static``; the
record counts the questions that do and names the first that does not.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from diversed.config import DecodeConfig
from diversed.devices import sync
from diversed.engine.loop import Decoder
from diversed.jobs.bench import (
    BenchSpec,
    configure_assistant,
    first_difference,
    load_bench_pair,
    provenance,
    stock_pair,
)

PAIRS = {  # ours -> the peers its tokens per second are divided by
    "ours_auto": ("hf_generate",),
    "ours_sd": ("hf_assisted", "hf_assisted_stock", "hf_assisted_defaults"),
    "ours_static": ("hf_ensemble",),
}
REFERENCE = {  # the system whose tokens each one must equal where the algorithms agree
    "ours_sd": "ours_auto",
    "hf_generate": "ours_auto",
    "hf_assisted": "ours_auto",
    "hf_assisted_stock": "ours_auto",
    "hf_assisted_defaults": "ours_auto",
    "hf_ensemble": "ours_static",
}
HF_ASSISTANT_DEFAULTS = {  # GenerationConfig's own, transformers 5.25
    "num_assistant_tokens": 20,
    "num_assistant_tokens_schedule": "constant",
    "assistant_confidence_threshold": 0.4,
}


def _systems(target, draft, stock, tokenizer, spec: BenchSpec, weight: float) -> dict[str, Callable]:
    k, budget = spec.num_assistant_tokens, spec.max_new_tokens
    eos = tokenizer.eos_token_id
    configured = target.generation_config.eos_token_id
    eos_ids = sorted({eos, *(configured if isinstance(configured, list) else [configured])} - {None})
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    hf_kwargs = {"do_sample": False, "max_new_tokens": budget, "eos_token_id": eos_ids, "pad_token_id": pad}

    def ours(method: str) -> Callable:
        values = {"method": method, "num_assistant_tokens": k, "max_new_tokens": budget}
        if method == "static":
            values["target_weight"] = weight
        config = DecodeConfig.from_dict(values)
        decoder = Decoder(target, None if method == "auto" else draft, config, eos_token_ids=eos_ids)
        return lambda prompt: decoder.generate_batch([prompt])[0].token_ids

    def hf(prompt: list[int], pair=(target, draft), settings: dict | None = None, **extra) -> list[int]:
        model, assistant = pair
        ids = torch.tensor([prompt], device=model.device)
        if settings is not None:
            saved = {key: getattr(assistant.generation_config, key) for key in settings}
            for key, value in settings.items():
                setattr(assistant.generation_config, key, value)
        try:
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **hf_kwargs, **extra)
        finally:
            if settings is not None:
                for key, value in saved.items():
                    setattr(assistant.generation_config, key, value)
        row = out[0, len(prompt) :].tolist()
        return next((row[: i + 1] for i, t in enumerate(row) if t in eos_ids), row)

    for assistant in (draft, stock[1]):
        configure_assistant(assistant, k)
    return {
        "ours_auto": ours("auto"),
        "hf_generate": hf,
        "ours_sd": ours("sd"),
        "hf_assisted": lambda p: hf(p, assistant_model=draft),
        "hf_assisted_stock": lambda p: hf(p, pair=stock, assistant_model=stock[1]),
        "hf_assisted_defaults": lambda p: hf(p, stock, HF_ASSISTANT_DEFAULTS, assistant_model=stock[1]),
        "ours_static": ours("static"),
        "hf_ensemble": lambda p: hf(p, assistant_model=draft, assistant_ensemble_weight=weight),
    }


def run_peers(spec: BenchSpec, per_category: int = 1, weight: float = 0.5) -> dict[str, Any]:
    """The side-by-side record of ``spec`` (its ``dataset`` is specbench) on ``per_category``
    questions of each category; written to ``spec.out`` and returned."""
    from diversed.data import load_examples
    from diversed.loading.models import prompt_ids

    if spec.threads:
        torch.set_num_threads(spec.threads)
    if not spec.target or not spec.draft:
        raise ValueError("the Spec-Bench side by side needs --target and --draft (a real pair)")
    target, draft, tokenizer, target_name, draft_name = load_bench_pair(spec)
    stock = stock_pair(spec, target, draft)
    examples = load_examples("specbench", directory=spec.data_dir, per_category=per_category)
    prompts = [prompt_ids(tokenizer, e.prompt, chat=True) for e in examples]
    systems = _systems(target, draft, stock, tokenizer, spec, weight)
    names = list(systems)
    seconds: dict[str, list[list[float]]] = {name: [] for name in names}
    outputs: dict[str, list[list[int]]] = {}
    for repeat in range(spec.repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        times = {name: [0.0] * len(prompts) for name in names}
        for i, prompt in enumerate(prompts):
            for name in order:
                sync(target.device)
                start = time.perf_counter()
                tokens = systems[name](prompt)
                sync(target.device)
                times[name][i] = time.perf_counter() - start
                if repeat == 0:
                    outputs.setdefault(name, []).append(tokens)
        for name in names:
            seconds[name].append(times[name])
        print(f"repeat {repeat + 1}/{spec.repeats} done", flush=True)
    categories = sorted({e.category for e in examples}, key=[e.category for e in examples].index)
    rates: dict[str, dict[str, float]] = {}
    for name in names:
        tokens = [len(t) for t in outputs[name]]
        rates[name] = {}
        for group in [*categories, "all"]:
            rows = [i for i, e in enumerate(examples) if group in ("all", e.category)]
            rates[name][group] = statistics.median(
                sum(tokens[i] for i in rows) / sum(run[i] for i in rows) for run in seconds[name]
            )
    identity = {}
    for name, reference in REFERENCE.items():
        diffs = [first_difference(a, b) for a, b in zip(outputs[name], outputs[reference], strict=True)]
        identity[name] = {
            "reference": reference,
            "identical": sum(d is None for d in diffs),
            "first_differing_question": next(
                (examples[i].id for i, d in enumerate(diffs) if d is not None), None
            ),
        }
    ratios = {
        f"{ours}_vs_{peer}": {g: rates[ours][g] / rates[peer][g] for g in rates[ours]}
        for ours, peers in PAIRS.items()
        for peer in peers
    }
    result = {
        **provenance(),
        "what": "ours vs Hugging Face on Spec-Bench's stratified subset: greedy, B = 1, first turns",
        "questions": [e.id for e in examples],
        "categories": {c: sum(e.category == c for e in examples) for c in categories},
        "tok_s": rates,
        "ratios": ratios,
        "identity": identity,
        "new_tokens": {name: sum(len(t) for t in rows) for name, rows in outputs.items()},
        "seconds_all_repeats": seconds,
        "k": spec.num_assistant_tokens,
        "target_weight": weight,
        "max_new_tokens": spec.max_new_tokens,
        "repeats": spec.repeats,
        "target": target_name,
        "draft": draft_name,
        "dtype": str(target.dtype).removeprefix("torch."),
        "quantize": spec.quantize,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    Path(spec.out).parent.mkdir(parents=True, exist_ok=True)
    Path(spec.out).write_text(json.dumps(result, indent=2) + "\n")
    print(peers_table(result))
    return result


def peers_table(r: dict[str, Any]) -> str:
    """Per category: each of ours over its peers (tok/s ratio), then the identity counts."""
    groups = [*r["categories"], "all"]
    lines = [
        f"{r['target']} / {r['draft']} | {r['dtype']} | k = {r['k']} | greedy, B = 1"
        f" | <= {r['max_new_tokens']} tokens | median of {r['repeats']} interleaved repeats;"
        " ours / peer tokens per second",
        "",
        "| pair | " + " | ".join(groups) + " |",
        "|---|" + "---:|" * len(groups),
    ]
    for pair, by_group in r["ratios"].items():
        lines.append(f"| {pair} | " + " | ".join(f"{by_group[g]:.2f}" for g in groups) + " |")
    n = len(r["questions"])
    lines += ["", "Identical tokens where the algorithms agree:"]
    lines += [f"- {name} = {v['reference']}: {v['identical']}/{n}" for name, v in r["identity"].items()]
    return "\n".join(lines)
