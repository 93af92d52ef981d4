"""Old vs new head objective on real traces: does the head collapse?

Trains heads on stored trace folders (no LM runs) with the old loss (fixed lambda, batch-mean
baseline) and the new one (acceptance worth lambda x the reward signal, inside the trust region,
per-task advantage), over a 10x range of lambda each, with the same held-out prompts, and reports
per head the w statistics on every token (mean, std, shares below 0.1 and above 0.9) and the
validation figures the selection rule uses. A collapsed head has w ~ 0 everywhere ("always trust
the draft").

    python benchmarks/head_objective.py --traces runs/cpu-study/results/traces/mbpp/r1 \\
        --out benchmarks/results/head-objective.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

from diversed.training.objective import TrainConfig, head_weights
from diversed.training.selection import split_by_prompt, validation_figures
from diversed.training.traces import load_traces
from diversed.training.trainer import train_head, weight_summary

OBJECTIVES = {
    "old: fixed lambda, batch baseline": {"reg_scale": "fixed", "baseline": "batch"},
    "new: relative, trust region, auto baseline": {"reg_scale": "relative", "baseline": "auto"},
}


def _number(value: float | None) -> float:
    """A figure for the table; NaN where there is none (no validation, or no spread estimate)."""
    return float("nan") if value is None else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="+", required=True, help="trace folder(s)")
    parser.add_argument("--lambdas", type=float, nargs="+", default=[0.1, 0.3, 1.0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    trajectories = [t for folder in args.traces for t in load_traces(folder)[0]]
    train, validation = split_by_prompt(trajectories, 0.25, seed=42)
    mean_reward = sum(t.reward for t in train) / len(train)
    rows = []
    for name, settings in OBJECTIVES.items():
        for lam in args.lambdas:
            cfg = TrainConfig(
                epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, reg_lambda=lam, **settings
            )
            head, _ = train_head(train, cfg, progress=False)
            summary = weight_summary(head_weights(head, trajectories))
            # the selection rule's figures against the fresh head, which is the behaviour (gains 0)
            figures = (
                validation_figures(head, validation, mean_reward, torch.zeros(()), 0.95) if validation else {}
            )
            summary.pop("w_histogram")
            rows.append({"objective": name, "reg_lambda": lam, **summary, **figures})
            print(json.dumps(rows[-1]))
    record = {
        "traces": args.traces,
        "sequences": len(trajectories),
        "tokens": sum(len(t.tensors["mu"]) for t in trajectories),
        "rewarded_share": sum(t.reward > 0 for t in trajectories) / len(trajectories),
        "train_sequences": len(train),
        "validation_sequences": len(validation),
        "settings": {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr},
        "rows": rows,
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "machine": platform.processor() or platform.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    lines = [
        f"Heads trained on {record['sequences']} sequences ({record['tokens']} tokens, "
        f"{record['rewarded_share']:.0%} rewarded), w over every token; validation on "
        f"{record['validation_sequences']} held-out sequences.",
        "",
        "| objective | lambda | w mean | w std | w < 0.1 | w > 0.9 | val acceptance | val reward gain "
        "| its 95% lower bound |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['objective']} | {r['reg_lambda']:g} | {r['w_mean']:.3f} | {r['w_std']:.3f} | "
            f"{r['w_below_0.1']:.1%} | {r['w_above_0.9']:.1%} | "
            f"{_number(r.get('val_acceptance')):.3f} | {_number(r.get('val_reward_gain')):+.3f} | "
            f"{_number(r.get('val_reward_vs_start_low')):+.3f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
