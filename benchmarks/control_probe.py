"""Does the trainer learn a per-token weight on the positive control's traces? No LM runs.

Trains one head per (lambda, lr, clip) on the train prompts of a trace folder (the selection's own
split) and prints, on the held-out validation prompts, the head's mean w on digit tokens and on the
rest, and the shares of digit tokens above 0.99 and of the rest below 0.1. A token's class comes
from re-tokenising the stored completion (sequences whose re-tokenisation differs in length from
the trace are left out, and counted).

    .venv/bin/python benchmarks/control_probe.py runs/control/results/traces/gsm8k/r1
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from diversed.loading.models import load_tokenizer
from diversed.training.objective import TrainConfig, head_weights
from diversed.training.selection import split_by_prompt
from diversed.training.traces import load_traces
from diversed.training.trainer import train_head


def digit_masks(folder: Path, trajectories, tokenizer) -> dict[str, torch.Tensor]:
    manifest = json.loads((folder / "manifest.json").read_text())
    files = {s["id"]: s["file"] for s in manifest["sequences"]}
    masks = {}
    for t in trajectories:
        completion = json.loads((folder / f"{files[t.id]}.json").read_text())["completion"]
        ids = tokenizer(completion).input_ids
        if len(ids) == t.tensors["mu"].shape[0]:
            masks[t.id] = torch.tensor([tokenizer.decode([i]).strip().isdigit() for i in ids])
    return masks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", type=Path)
    parser.add_argument("--target", default="embedded:qwen2.5-coder-1.5b", help="for the tokenizer")
    parser.add_argument("--lambdas", type=float, nargs="+", default=[0.7, 1.0, 1.5])
    parser.add_argument("--lrs", type=float, nargs="+", default=[2e-3, 5e-3])
    parser.add_argument("--clips", type=float, nargs="+", default=[0.2])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    trajectories, _ = load_traces(args.traces)
    masks = digit_masks(args.traces, trajectories, load_tokenizer(args.target))
    train, validation = split_by_prompt(trajectories, 0.25, args.seed)
    held = [t for t in validation if t.id in masks]
    print(
        f"{len(trajectories)} sequences, {len(train)} train / {len(validation)} validation; "
        f"{len(held)} validation sequences re-tokenise exactly"
    )
    digit = torch.cat([masks[t.id] for t in held])
    for lam, lr, clip in itertools.product(args.lambdas, args.lrs, args.clips):
        cfg = TrainConfig(
            epochs=args.epochs, lr=lr, reg_lambda=lam, clip_eps=clip, baseline="group", seed=args.seed
        )
        head, _ = train_head(train, cfg, progress=False)
        w = head_weights(head, held)
        print(
            f"lambda {lam:g} lr {lr:g} clip {clip:g}: digits w {w[digit].mean():.3f} "
            f"(> 0.99: {(w[digit] > 0.99).float().mean():.0%}), other w {w[~digit].mean():.3f} "
            f"(< 0.1: {(w[~digit] < 0.1).float().mean():.0%}), "
            f"tokens {int(digit.sum())} / {int((~digit).sum())}",
            flush=True,
        )


if __name__ == "__main__":
    main()
