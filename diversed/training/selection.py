"""Choosing a head among checkpoints without running an LM.

Selection (``select_head``): the traces' prompts are split into train and validation (never the
test split); one head is trained per lambda, every epoch is a checkpoint, and so is the head the
round starts from (the previous round's, or the fresh one: w = 0.5 everywhere), so "no change" can
win. Each is scored on validation by two off-policy figures that need no LM. ``val_acceptance`` is
E_t[1 - w_t TV_t]. ``val_reward_gain`` is the first-order estimate of the change in a sequence's
expected reward when its tokens come from the head's mixture instead of the behaviour mu, in reward
units (pass-rate points for pass/fail tasks): per sequence (sum_t (r_t - 1)) (R - b), the linear term
of (prod_t r_t - 1) R, averaged per prompt, then over prompts. Because E_mu[r_t] = 1 it is unbiased
for any constant b; b is the train mean reward, the constant that keeps its variance low.
The rule ranks the trained checkpoints by their validation objective, the same trade the check
and the training make: ``val_objective`` = ``val_reward_gain`` + ``acceptance_value`` x
``val_acceptance`` (reward units), and takes the highest. The starting head is scored too, for
reference, but never chosen: an untrained head is the static ensemble at w = 0.5, which the static
sweep already covers, so the workflow always keeps a trained head and lets its on-policy check
(:mod:`diversed.jobs.check`) say whether it beats the static rule at its own mean w. For the same
reason a trained checkpoint whose w hardly varies over the validation tokens (standard deviation
below ``min_weight_std``) is scored but kept only when every trained one is like it: a constant
weight is a static point the sweep already has, and its check can only find the two arms alike (the
embedded default's lambda = 3 head settled at w ~ 0.006 with the highest objective, which the report
then showed as a "DIVERSED" equal to static w = 0 on every example). Each
checkpoint is also scored against that *static comparator* off-policy here, the constant head at
its own validation mean w (``val_reward_vs_static``, ``val_acceptance_vs_static``), and against the
start (``val_reward_vs_start`` with its one-sided lower bound), so the card shows how far each move
is vouched for. (An earlier rule took the highest acceptance among checkpoints whose reward bound
against the start held; it kept the untrained start in every run of every config.)
When every training sequence has the same reward there is nothing to learn (with A = R - 1 an
all-failed set still has |A| = 1, so S would let the acceptance term act alone): the starting head
is kept.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import torch

from diversed.head import EnsembleHead
from diversed.training.objective import flatten, policy
from diversed.training.traces import Trajectory

# The least standard deviation of w over the validation tokens that makes a checkpoint a per-token
# rule rather than a static one (module docstring); the workflow's head.min_weight_std.
MIN_WEIGHT_STD = 0.05


def _prompt(t: Trajectory) -> str:
    """The prompt a trajectory answers: ids are ``<example>@<behaviour>``."""
    return t.id.rsplit("@", 1)[0]


@torch.no_grad()
def _scores(
    head: EnsembleHead, trajectories: Sequence[Trajectory], baseline: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """``prompt_gains`` and the off-policy validation figures (no LM: the estimated reward gain over
    the behaviour policy, the expected acceptance, the mean weight) from one pass over the tokens."""
    tensors, owner, rewards = flatten(trajectories)
    w, ratio = policy(head, tensors)
    moved = torch.zeros(len(trajectories), dtype=ratio.dtype, device=ratio.device).index_add_(
        0, owner, ratio - 1
    )
    gains = moved * (rewards - baseline).to(ratio.dtype)
    prompts = {name: i for i, name in enumerate(sorted({_prompt(t) for t in trajectories}))}
    index = torch.tensor([prompts[_prompt(t)] for t in trajectories], device=ratio.device)
    total = gains.new_zeros(len(prompts)).index_add_(0, index, gains)
    per_prompt = total / torch.bincount(index, minlength=len(prompts)).to(gains.dtype)
    return per_prompt, {
        "val_reward_gain": float(per_prompt.mean()),
        "val_acceptance": float((1 - w * tensors["tv"]).mean()),
        "val_mean_weight": float(w.mean()),
        "val_weight_std": float(w.std()) if w.numel() > 1 else 0.0,
    }


def prompt_gains(head: EnsembleHead, trajectories: Sequence[Trajectory], baseline: float) -> torch.Tensor:
    """Per prompt (sorted by id): the mean over its sequences of (sum_t (r_t - 1)) (R - baseline),
    the first-order estimate of the reward change of the module docstring."""
    return _scores(head, trajectories, baseline)[0]


def lower_bound(differences: torch.Tensor, confidence: float) -> tuple[float, float]:
    """(mean, one-sided ``confidence`` lower bound) of paired per-prompt differences, normal
    approximation. Fewer than two prompts give no spread estimate: the bound is -inf unless every
    difference is exactly 0."""
    mean = float(differences.mean())
    if not differences.any():
        return mean, mean
    if differences.numel() < 2:
        return mean, -math.inf
    spread = float(differences.std()) / math.sqrt(differences.numel())
    return mean, mean - NormalDist().inv_cdf(confidence) * spread


def constant_head(like: EnsembleHead, w: float) -> EnsembleHead:
    """A head of ``like``'s sizes that puts ``w`` on every token: the static ensemble as a head."""
    head = EnsembleHead(like.d_draft, like.d_target, like.hidden, signals=like.signals)
    head.load_state_dict(like.state_dict())  # the signal standardisation too
    head.to(like.out.weight.device)  # where the traces it is scored on are
    w = min(max(w, 1e-6), 1 - 1e-6)
    with torch.no_grad():
        head.out.weight.zero_()
        head.out.bias.copy_(torch.tensor([0.0, math.log(w / (1 - w))]))
    return head


def validation_figures(
    head: EnsembleHead,
    validation: Sequence[Trajectory],
    baseline: float,
    start_gains: torch.Tensor,
    confidence: float,
) -> dict[str, Any]:
    """A checkpoint's figures for the selection rule: :func:`_scores`'s, plus its reward change
    against the starting head (whose ``prompt_gains`` are ``start_gains``), paired over the
    validation prompts, and that change's lower bound (None without a spread estimate); and the
    same against its static comparator, with the acceptance difference (module docstring)."""
    gains, figures = _scores(head, validation, baseline)
    change, low = lower_bound(gains - start_gains, confidence)
    static_gains, static = _scores(constant_head(head, figures["val_mean_weight"]), validation, baseline)
    versus_static, static_low = lower_bound(gains - static_gains, confidence)
    return {
        **figures,
        "val_reward_vs_start": change,
        "val_reward_vs_start_low": low if math.isfinite(low) else None,  # JSON has no -inf
        "val_reward_vs_static": versus_static,
        "val_reward_vs_static_low": static_low if math.isfinite(static_low) else None,
        "val_acceptance_vs_static": figures["val_acceptance"] - static["val_acceptance"],
    }


def split_by_prompt(
    trajectories: Sequence[Trajectory], share: float, seed: int
) -> tuple[list[Trajectory], list[Trajectory]]:
    """(train, validation): a seeded ``share`` of the prompts, with every sequence of a prompt on
    one side (ids are ``<example>@<behaviour>``), so validation never sees a training prompt."""

    prompts = sorted({_prompt(t) for t in trajectories})
    random.Random(seed).shuffle(prompts)
    held = set(prompts[: round(share * len(prompts))]) if len(prompts) > 1 else set()
    train = [t for t in trajectories if _prompt(t) not in held]
    return train, [t for t in trajectories if _prompt(t) in held]


def choose(
    candidates: Sequence[dict[str, Any]],
    acceptance_value: float = 1.0,
    min_weight_std: float = MIN_WEIGHT_STD,
) -> tuple[int, bool]:
    """(index, varies) of the checkpoint the selection rule of the module docstring picks: the
    highest validation objective among the trained ones whose ``val_weight_std`` reaches
    ``min_weight_std``, or among all trained ones when none does (``varies`` is then False);
    candidate 0, the start, only when it is alone. Each candidate gets its ``val_objective``."""
    for candidate in candidates:
        candidate["val_objective"] = (
            candidate["val_reward_gain"] + acceptance_value * candidate["val_acceptance"]
        )
    trained = range(1, len(candidates)) if len(candidates) > 1 else range(1)
    varying = [i for i in trained if candidates[i]["val_weight_std"] >= min_weight_std]
    return max(varying or trained, key=lambda i: candidates[i]["val_objective"]), bool(varying)
