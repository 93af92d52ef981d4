"""The training objective: sequence-level policy gradient on the mixture, plus acceptance.

The policy is the probability mixture pi_theta(y) = w_theta p(y) + (1 - w_theta) q(y), with
w_theta = head(h_draft, h_target), so the stored scalars p(y), q(y) and hidden states are all
that is needed: no LM runs during training. Per batch of sequences:

* advantage A = R - b. With group rollouts (several samples of one prompt under one behaviour,
  ids ``<example>@<behaviour>#<g>``), ``baseline="auto"`` (the default) takes b = the mean reward
  of the *other* samples of the group (``group``: RLOO, the leave-one-out form of GRPO's group
  mean, unbiased): a prompt whose samples disagree carries signal even when most prompts pass or
  fail together, and a prompt whose samples agree carries none, whatever its difficulty. Without
  groups it follows the released trainer per task: pass/fail rewards (every reward 0 or 1:
  GSM8K, HumanEval, MBPP) use b = 1, so a failure is pushed down even when the whole batch failed;
  graded rewards (ROUGE, BLEU) a running mean (momentum 0.9). ``group``, ``batch`` (the batch
  mean), ``running`` and ``minus_one`` force one rule.
* per-token importance ratio r_t = pi_theta(y_t) / mu(y_t), clipped PPO-style:
  L_pg = -mean_t min(r_t A, clip(r_t, 1 - eps, 1 + eps) A);
* acceptance term: the expected share of drafts accepted, E_t[1 - w_t TV_t], rewarded.
  ``reg_scale="relative"`` (the default) weighs it at lambda times the strength of the reward
  signal, S = mean_t |r_t A| (detached), and counts only tokens whose ratio is still inside the
  PPO trust region [1 - eps, 1 + eps]: loss = L_pg - lambda S E_in / E.detach(), whose value is
  about lambda S. The released trainer meant the scaling (its term was worth 5% of the
  policy-gradient term) but got the sign wrong. Why both parts: with sparse 0/1 rewards a batch
  often carries no reward information (S = 0), and a fixed lambda then pushes w to 0 ("always
  trust the draft") with nothing pulling back; here such a batch leaves the head alone. And like
  the reward term, the acceptance term cannot move the policy further from the behaviour that
  sampled the traces than the trust region allows, so no lambda collapses a head in one round
  (further moves need a new round of traces). ``fixed`` keeps the old loss, L_pg - lambda E.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from diversed.config import ConfigError, check_range
from diversed.data import DataError
from diversed.head import SIGNALS, EnsembleHead
from diversed.training.traces import Trajectory

BASELINES = ("auto", "group", "batch", "running", "minus_one")
REG_SCALES = ("relative", "fixed")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 4
    batch_size: int = 8
    lr: float = 5e-4
    warmup_steps: int = 10
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    reg_lambda: float = 1.0  # relative: the acceptance term is worth lambda x the reward signal
    reg_scale: str = "relative"  # relative | fixed, see the module docstring
    clip_eps: float = 0.2
    baseline: str = "auto"  # auto | group | batch | running | minus_one
    hidden: int = 0  # 0: the paper's linear head; > 0: a small MLP
    signals: bool = False  # the head also reads TV(p, q) and both entropies (diversed.head)
    seed: int = 42

    def __post_init__(self) -> None:
        check_range("epochs", self.epochs, minimum=1)
        check_range("batch_size", self.batch_size, minimum=1)
        check_range("lr", self.lr, exclusive_minimum=0)
        check_range("reg_lambda", self.reg_lambda, exclusive_minimum=0)  # it rewards accepted drafts
        check_range("hidden", self.hidden, minimum=0)
        if self.baseline not in BASELINES:
            raise ConfigError(f"baseline: {self.baseline!r} is not one of {', '.join(BASELINES)}")
        if self.reg_scale not in REG_SCALES:
            raise ConfigError(f"reg_scale: {self.reg_scale!r} is not one of {', '.join(REG_SCALES)}")

    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def group_of(trajectory: Trajectory) -> str:
    """The group a rollout belongs to: its id without the ``#<g>`` suffix (prompt and behaviour)."""
    return trajectory.id.rsplit("#", 1)[0]


def resolve_baseline(kind: str, trajectories: Sequence[Trajectory]) -> str:
    """``auto``: the group's leave-one-out mean when every rollout has a group mate, else r - 1
    when every reward is pass/fail (0 or 1), else the running mean."""
    if kind != "auto":
        return kind
    if min(Counter(group_of(t) for t in trajectories).values()) >= 2:
        return "group"
    return "minus_one" if all(t.reward in (0.0, 1.0) for t in trajectories) else "running"


def group_advantages(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """RLOO: each rollout's reward minus the mean reward of the other rollouts of its group (0 for
    a rollout without a group mate: nothing to compare it with)."""
    totals: dict[str, list[float]] = {}
    for t in trajectories:
        totals.setdefault(group_of(t), []).append(t.reward)
    advantages = {}
    for t in trajectories:
        rewards = totals[group_of(t)]
        others = len(rewards) - 1
        advantages[t.id] = t.reward - (sum(rewards) - t.reward) / others if others else 0.0
    return advantages


def flatten(batch: Sequence[Trajectory]) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Concatenate a batch's tokens; also return each token's sequence index and the rewards."""
    tensors = {k: torch.cat([t.tensors[k] for t in batch]).float() for k in batch[0].tensors}
    device = tensors["mu"].device
    owner = torch.cat(
        [torch.full((t.tensors["mu"].shape[0],), i, device=device) for i, t in enumerate(batch)]
    )
    rewards = torch.tensor([t.reward for t in batch], device=device)
    return tensors, owner, rewards


def head_signals(head: EnsembleHead, tensors: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The verifier's signals [N, 3] a ``signals`` head reads from stored tokens (None for a head
    that reads hidden states alone); traces collected before they were stored are refused."""
    if not head.signals:
        return None
    missing = [name for name in SIGNALS if name not in tensors]
    if missing:
        raise DataError(
            f"the traces lack {', '.join(missing)}, which a head with signals reads; collect them again"
        )
    return torch.stack([tensors[name] for name in SIGNALS], -1)


def policy(head: EnsembleHead, tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: the head's weight w and the importance ratio pi(y) / mu(y) of its mixture."""
    w = head(tensors["h_draft"], tensors["h_target"], head_signals(head, tensors))
    pi = w * tensors["p_y"] + (1 - w) * tensors["q_y"]
    return w, pi / tensors["mu"].clamp_min(1e-12)


def batch_loss(
    head: EnsembleHead, batch: Sequence[Trajectory], advantages: torch.Tensor, cfg: TrainConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of the module docstring on one batch; ``advantages`` holds A per sequence."""
    tensors, owner, rewards = flatten(batch)
    w, ratio = policy(head, tensors)
    advantage = advantages.to(ratio)[owner]
    surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * advantage)
    accept = 1 - w * tensors["tv"]
    expected_accept = accept.mean()
    if cfg.reg_scale == "relative":
        inside = ((ratio > 1 - cfg.clip_eps) & (ratio < 1 + cfg.clip_eps)).detach()
        trusted = (accept * inside).mean()
        strength = (ratio * advantage).abs().mean().detach()
        accept_term = cfg.reg_lambda * strength * trusted / expected_accept.detach().clamp_min(1e-6)
    else:
        accept_term = cfg.reg_lambda * expected_accept
    loss = -surrogate.mean() - accept_term
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


@torch.no_grad()
def head_weights(head: EnsembleHead, trajectories: Sequence[Trajectory]) -> torch.Tensor:
    """w on every stored token, in order."""
    return torch.cat(
        [
            head(t.tensors["h_draft"], t.tensors["h_target"], head_signals(head, t.tensors))
            for t in trajectories
        ]
    )
