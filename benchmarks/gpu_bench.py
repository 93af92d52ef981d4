"""The engine on a GPU against the hardware limit and against HF, offline (random weights, no download).

A realistic pair from random weights, the *perturbed self-draft* of ``../shared/reference/gpu.md``:
the draft is the target's first ``--draft-layers`` layers with the target's embeddings, final norm and
lm_head; in the target, the output projections (``o_proj``, ``down_proj``) of the remaining layers are
scaled by ``--eps``, so the target stays near the draft. Smaller eps, higher acceptance; the record
states the acceptance measured (aim: 0.6-0.8). Shapes: Llama-3.1-8B target over Llama-3.2-1B-like
draft depth (``--shapes paper``) or tiny ones (``--shapes tiny``: CPUs and the test suite).

Prints, and writes to ``--out`` as JSON, in one run:

* the target's one-forward time at 1 and k + 1 tokens per row and at B rows, against the HBM floor
  (weight bytes / the card's bandwidth: :data:`CARD_BANDWIDTH` by the device's name, or ``--bandwidth``;
  an unknown card without it gets no floor, and the record says so);
* tokens/s at B = 1 of HF generate, HF assisted, ours ``auto`` and ours ``sd``; at each larger B of
  ``--batch-sizes``, ours ``auto``, ours ``sd`` and HF generate, with the ratios the issue names;
* fp32 exactness on the device (a tiny pair): greedy ``sd`` equals greedy ``auto``, and batched rows
  equal batch-1 rows for every method, for each ``--steps`` (``Decoder(step=...)``: ``eager``; ``fixed``,
  the fixed-shape step over a pre-allocated cache; ``graphs``, that step replayed from CUDA graphs),
  and each step's rows equal the eager step's.

Ours runs at every step of ``--steps`` (default: eager and graphs on CUDA, eager and fixed elsewhere);
a system's name carries its step when it is not eager (``ours_sd[graphs]@1``).

Each figure is written to ``--out`` as soon as it is measured, so a run cut short by its time limit
still leaves what it measured. Run it through ``benchmarks/gpu.sh``.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from diversed import DecodeConfig, Decoder
from diversed.devices import device_name, timed
from diversed.engine.cache import STEPS
from diversed.jobs import bench

# Datasheet memory bandwidth (bytes/s) by a name fragment of torch.cuda.get_device_name(); the first
# fragment that matches wins, so the more specific ones come first.
CARD_BANDWIDTH = (
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),  # SXM5, HBM3
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),  # the 40 GB cards
    ("L40S", 0.864e12),
    ("RTX 4090", 1.008e12),
)


def card_bandwidth(name: str) -> float | None:
    """The datasheet bandwidth of the card called ``name``, or None for a card not in the table."""
    return next((value for fragment, value in CARD_BANDWIDTH if fragment in name), None)


SHAPES = {
    "paper": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
    },
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    },
}
# Every method the engine has, greedy or sampled, for the exactness checks.
EXACTNESS_METHODS = [
    {"method": "sd", "temperature": 0.0},
    {"method": "static", "target_weight": 0.6, "temperature": 0.0},
    {"method": "sd", "temperature": 1.0},
    {"method": "static", "target_weight": 0.5, "temperature": 1.0},
    {"method": "lossy", "lenience": 0.5, "temperature": 1.0},
    {"method": "cascade", "temperature": 1.0},
    {"method": "sd", "temperature": 1.0, "schedule": "heuristic"},
]


def self_draft_pair(
    shape: dict, draft_layers: int, eps: float, device: str, dtype: torch.dtype, seed: int = 0
) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """(target, draft): a random Llama whose layers past ``draft_layers`` only nudge the residual
    stream (output projections scaled by ``eps``), and its first ``draft_layers`` layers as draft."""
    config = LlamaConfig(
        **shape,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        target = LlamaForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        for layer in target.model.layers[draft_layers:]:
            layer.self_attn.o_proj.weight.mul_(eps)
            layer.mlp.down_proj.weight.mul_(eps)
    draft_config = copy.deepcopy(config)
    draft_config.num_hidden_layers = draft_layers
    with torch.device(device):
        draft = LlamaForCausalLM(draft_config).to(dtype).eval()
    kept = {k: v for k, v in target.state_dict().items() if _layer(k) is None or _layer(k) < draft_layers}
    draft.load_state_dict(kept)
    return target, draft


def _layer(key: str) -> int | None:
    parts = key.split(".")
    return int(parts[2]) if key.startswith("model.layers.") else None


def tokens_per_second(run, prompts: list[list[int]], batch: int, device: str) -> float:
    """Generated tokens per second of ``run`` over ``prompts``, ``batch`` at a time."""
    seconds: list[float] = []
    total = 0
    with timed(device, seconds):
        for i in range(0, len(prompts), batch):
            total += sum(len(o) for o in run(prompts[i : i + batch]))
    return total / seconds[0]


def exactness(device: str, steps: list[str]) -> dict[str, bool]:
    """fp32 on ``device``, per step: greedy sd = greedy auto (eager), batched rows = batch-1 rows per
    method, and (steps other than eager) batched rows = the eager step's batched rows."""
    target, draft = self_draft_pair(SHAPES["tiny"], 2, 0.3, device, torch.float32, seed=1)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 512, (5 + 3 * i,), generator=generator).tolist() for i in range(4)]
    seeds = [7 + i for i in range(len(prompts))]
    results = {}
    auto = Decoder(target, None, DecodeConfig.from_dict({"method": "auto", "max_new_tokens": 12}))
    reference = [auto.generate(p).token_ids for p in prompts]
    eager: dict[str, list[list[int]]] = {}
    for step in ["eager", *[s for s in steps if s != "eager"]]:
        sd = Decoder(target, draft, DecodeConfig.from_dict({"method": "sd", "max_new_tokens": 12}), step=step)
        results[f"{step}: greedy sd = auto"] = [sd.generate(p).token_ids for p in prompts] == reference
        for values in EXACTNESS_METHODS:
            config = DecodeConfig.from_dict({**values, "max_new_tokens": 12, "num_assistant_tokens": 3})
            batched = [
                g.token_ids
                for g in Decoder(target, draft, config, step=step).generate_batch(prompts, seeds=seeds)
            ]
            # a fresh decoder per row: the heuristic schedule's draft length persists across calls (as HF's)
            single = [
                Decoder(target, draft, config, step=step).generate_batch([p], seeds=[s])[0].token_ids
                for p, s in zip(prompts, seeds, strict=True)
            ]
            name = " ".join(f"{k}={v}" for k, v in values.items())
            results[f"{step}: batched = batch 1: {name}"] = batched == single
            if step == "eager":
                eager[name] = batched
            else:
                results[f"{step}: batched = eager: {name}"] = batched == eager[name]
    return results


def ours_name(method: str, step: str) -> str:
    """A system's name in the record: ``ours_sd``, or ``ours_sd[graphs]`` at a step other than eager."""
    return f"ours_{method}" + ("" if step == "eager" else f"[{step}]")


def ratios(rates: dict[str, float], step: str, sizes: list[int]) -> dict[str, float]:
    """The issue's ratios for ours at one step: against HF at B = 1, and sd over auto at each B."""
    auto, sd = ours_name("auto", step), ours_name("sd", step)
    return {
        f"{auto} / hf_generate @1": rates[f"{auto}@1"] / rates["hf_generate@1"],
        f"{sd} / hf_assisted @1": rates[f"{sd}@1"] / rates["hf_assisted@1"],
        **{f"{sd} / {auto} @{b}": rates[f"{sd}@{b}"] / rates[f"{auto}@{b}"] for b in sizes},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="paper")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--draft-layers", type=int, default=2, help="the draft: the target's first layers (2)"
    )
    parser.add_argument("--eps", type=float, default=0.02, help="scale of the later layers' outputs (0.02)")
    parser.add_argument("--k", type=int, default=4, help="draft length (4)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per B = 1 measurement (16)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument(
        "--steps",
        nargs="+",
        choices=STEPS,
        help="ours' steps to time and check (default: eager graphs on CUDA, eager fixed elsewhere)",
    )
    parser.add_argument(
        "--bandwidth", type=float, help="memory bandwidth, bytes/s (default: the card's, from CARD_BANDWIDTH)"
    )
    parser.add_argument("--out", help="JSON file to write")
    args = parser.parse_args(argv)
    steps = args.steps or ["eager", "graphs" if args.device.startswith("cuda") else "fixed"]
    dtype = getattr(torch, args.dtype)
    card = device_name(args.device)
    bandwidth = args.bandwidth or card_bandwidth(card)
    result: dict = {
        **bench.provenance(),
        "shapes": args.shapes,
        "device": card,
        "dtype": args.dtype,
        "bandwidth": bandwidth,
        "bandwidth_source": "--bandwidth" if args.bandwidth else "CARD_BANDWIDTH" if bandwidth else None,
        "k": args.k,
        "new_tokens": args.new_tokens,
        "prompts": args.prompts,
        "steps": steps,
    }

    def save(**figures) -> None:
        """Add figures to the record and write it at once: a run cut short keeps what it measured."""
        result.update(figures)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")

    if bandwidth is None:
        print(f"{card}: not in CARD_BANDWIDTH and no --bandwidth given: no memory floor is reported")
    save()
    target, draft = self_draft_pair(SHAPES[args.shapes], args.draft_layers, args.eps, args.device, dtype)
    weight_bytes = bench.weight_bytes(target)
    floor = weight_bytes / bandwidth if bandwidth else None
    context = list(range(3, 3 + 256))
    step_seconds = {"1 token": bench.step_seconds(target, context, 1)}
    step_seconds[f"{args.k + 1} tokens"] = bench.step_seconds(target, context, args.k + 1)
    for rows in args.batch_sizes:
        step_seconds[f"1 token x {rows} rows"] = bench.step_seconds(target, context, 1, rows=rows)
        step_seconds[f"{args.k + 1} tokens x {rows} rows"] = bench.step_seconds(
            target, context, args.k + 1, rows=rows
        )
    save(
        pair=f"perturbed self-draft: draft = first {args.draft_layers} layers, eps = {args.eps}",
        target_weight_bytes=weight_bytes,
        hbm_floor_seconds=floor,
        target_step_seconds=step_seconds,
        step_over_floor={name: seconds / floor for name, seconds in step_seconds.items()} if floor else None,
    )
    generator = torch.Generator().manual_seed(0)
    vocab = SHAPES[args.shapes]["vocab_size"]
    count = max([args.prompts, *args.batch_sizes])
    prompts = [torch.randint(3, vocab, (40,), generator=generator).tolist() for _ in range(count)]
    fixed = {"max_new_tokens": args.new_tokens, "num_assistant_tokens": args.k}
    ours = {
        ours_name(m, step): Decoder(
            target, draft if m == "sd" else None, DecodeConfig.from_dict({"method": m, **fixed}), step=step
        )
        for step in steps
        for m in ("auto", "sd")
    }
    bench.configure_assistant(draft, args.k)

    def hf(batch: list[list[int]], assisted: bool) -> list[list[int]]:
        ids = torch.tensor(batch, device=args.device)
        out = target.generate(
            ids,
            assistant_model=draft if assisted else None,
            do_sample=False,
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            pad_token_id=0,
        )
        return [row[ids.shape[1] :].tolist() for row in out]

    systems = {
        "hf_generate": lambda b: hf(b, False),
        "hf_assisted": lambda b: hf(b, True),
        **{
            name: (lambda b, d=decoder: [g.token_ids for g in d.generate_batch(b)])
            for name, decoder in ours.items()
        },
    }
    for run in systems.values():
        run(prompts[:1])  # warm-up: kernels, allocator
    one = prompts[: args.prompts]
    rates: dict[str, float] = {}
    for name, run in systems.items():
        rates[f"{name}@1"] = tokens_per_second(run, one, 1, args.device)
        save(tok_s=rates)
    stats = [ours["ours_sd"].generate(p).stats for p in one[:4]]
    save(acceptance_greedy=sum(s.accepted for s in stats) / max(1, sum(s.drafted for s in stats)))
    for batch in args.batch_sizes:
        for name in [*ours, "hf_generate"]:  # HF assisted runs at batch 1 only
            rates[f"{name}@{batch}"] = tokens_per_second(systems[name], prompts[:batch], batch, args.device)
            save(tok_s=rates)
    sizes = [1, *args.batch_sizes]
    save(
        ratios={key: value for step in steps for key, value in ratios(rates, step, sizes).items()},
        ours_sd_increases_with_batch={
            step: all(
                rates[f"{ours_name('sd', step)}@{a}"] < rates[f"{ours_name('sd', step)}@{b}"]
                for a, b in zip(sizes, sizes[1:], strict=False)
            )
            for step in steps
        },
    )
    save(exact_fp32=exactness(args.device, steps))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
