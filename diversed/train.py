"""Training the ensemble head on stored traces with sequence-level policy gradient.

The policy is the probability mixture pi_theta(y) = w_theta p(y) + (1 - w_theta) q(y), with
w_theta = head(h_draft, h_target), so the stored scalars p(y), q(y) and hidden states are all
that is needed: no LM runs during training. Per batch of sequences:

* advantage A = R - b, with b the batch mean reward or a running mean (the paper's two choices);
* per-token importance ratio r_t = pi_theta(y_t) / mu(y_t), clipped PPO-style:
  L_pg = -mean_t min(r_t A, clip(r_t, 1 - eps, 1 + eps) A);
* acceptance regulariser: the expected share of drafts accepted, E_t[1 - w_t TV_t], with a
  positive weight lambda: loss = L_pg - lambda E_t[1 - w_t TV_t]. (The released trainer's
  dynamic scale had the wrong sign and pushed acceptance down.)

AdamW, linear warm-up then cosine decay, gradient clipping, a fixed seed. Every step's loss,
reward, mean weight and expected acceptance go to ``train_log.jsonl`` (and to an optional
``log_step`` callback, which the workflow uses for MLflow).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from diversed.head import EnsembleHead, save_head
from diversed.traces import Trajectory, load_traces


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 4
    batch_size: int = 8
    lr: float = 5e-4
    warmup_steps: int = 10
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    reg_lambda: float = 0.1
    clip_eps: float = 0.2
    baseline: str = "batch"  # "batch" mean or "running" mean (momentum 0.9)
    hidden: int = 0  # 0: the paper's linear head; > 0: a small MLP
    seed: int = 42

    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def _flatten(batch: list[Trajectory]) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Concatenate a batch's tokens; also return each token's sequence index and the rewards."""
    tensors = {k: torch.cat([t.tensors[k] for t in batch]).float() for k in batch[0].tensors}
    owner = torch.cat([torch.full((t.tensors["mu"].shape[0],), i) for i, t in enumerate(batch)])
    rewards = torch.tensor([t.reward for t in batch])
    return tensors, owner, rewards


def batch_loss(
    head: EnsembleHead, batch: list[Trajectory], baseline: float, cfg: TrainConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    tensors, owner, rewards = _flatten(batch)
    w = head(tensors["h_draft"], tensors["h_target"])
    pi = w * tensors["p_y"] + (1 - w) * tensors["q_y"]
    ratio = pi / tensors["mu"].clamp_min(1e-12)
    advantage = (rewards - baseline)[owner]
    surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * advantage)
    expected_accept = (1 - w * tensors["tv"]).mean()
    loss = -surrogate.mean() - cfg.reg_lambda * expected_accept
    return loss, {
        "loss": float(loss.detach()),
        "reward": float(rewards.mean()),
        "mean_weight": float(w.detach().mean()),
        "expected_acceptance": float(expected_accept.detach()),
    }


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up from 0.1 to 1, then cosine decay to 0."""
    if step < warmup:
        return 0.1 + 0.9 * step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train_head(
    trajectories: list[Trajectory],
    cfg: TrainConfig,
    log_path: Path | None = None,
    log_step: Callable[[int, dict[str, float]], None] | None = None,
    progress: bool = True,
) -> tuple[EnsembleHead, dict[str, float]]:
    """Fit a head to ``trajectories``; return it and the last step's figures."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    first = trajectories[0].tensors
    head = EnsembleHead(first["h_draft"].shape[-1], first["h_target"].shape[-1], cfg.hidden, cfg.seed)
    optimiser = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    per_epoch = math.ceil(len(trajectories) / cfg.batch_size)
    total = cfg.epochs * per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: lr_factor(s, total, cfg.warmup_steps))
    running: float | None = None
    figures: dict[str, float] = {}
    log = log_path.open("w") if log_path else None
    bar = tqdm(total=total, desc="train head", unit="step", disable=not progress)
    step = 0
    for _ in range(cfg.epochs):
        order = trajectories[:]
        rng.shuffle(order)
        for start in range(0, len(order), cfg.batch_size):
            batch = order[start : start + cfg.batch_size]
            batch_mean = sum(t.reward for t in batch) / len(batch)
            if cfg.baseline == "running":
                baseline = batch_mean if running is None else running
                running = batch_mean if running is None else 0.9 * running + 0.1 * batch_mean
            else:
                baseline = batch_mean
            loss, figures = batch_loss(head, batch, baseline, cfg)
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.max_grad_norm)
            optimiser.step()
            scheduler.step()
            step += 1
            figures = {"step": step, "lr": scheduler.get_last_lr()[0], **figures}
            if log:
                log.write(json.dumps(figures) + "\n")
            if log_step:
                log_step(step, figures)
            bar.update()
            bar.set_postfix(w=f"{figures['mean_weight']:.3f}", accept=f"{figures['expected_acceptance']:.3f}")
    bar.close()
    if log:
        log.close()
    return head.eval(), figures


def train_from_traces(
    traces: str | Path, out: str | Path, cfg: TrainConfig, log_step=None, progress: bool = True
) -> dict[str, Any]:
    trajectories, manifest = load_traces(traces)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    head, figures = train_head(trajectories, cfg, out_dir / "train_log.jsonl", log_step, progress)
    settings = manifest["settings"]
    card = {
        "target": settings.get("target"),
        "draft": settings.get("draft"),
        "task": settings.get("dataset"),
        "traces": str(traces),
        "traces_hash": manifest["settings_hash"],
        "training": asdict(cfg),
        "training_hash": cfg.config_hash(),
        "metrics": figures,
        "sequences": len(trajectories),
    }
    save_head(head, out_dir, card)
    return card
