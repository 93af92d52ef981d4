"""Training the ensemble head on stored traces with sequence-level policy gradient.

The policy is the probability mixture pi_theta(y) = w_theta p(y) + (1 - w_theta) q(y), with
w_theta = head(h_draft, h_target), so the stored scalars p(y), q(y) and hidden states are all
that is needed: no LM runs during training. Per batch of sequences:

* advantage A = R - b. ``baseline="auto"`` (the default) follows the released trainer per task:
  pass/fail rewards (every reward 0 or 1: GSM8K, HumanEval, MBPP) use b = 1, so a failure is
  pushed down even when the whole batch failed; graded rewards (ROUGE, BLEU) a running mean
  (momentum 0.9). ``batch`` (the batch mean), ``running`` and ``minus_one`` force one rule.
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

Selection (``select_head``): the traces' prompts are split into train and validation (never the
test split); one head is trained per lambda, every epoch is a checkpoint, and so is the head the
round starts from (the previous round's, or the fresh one: w = 0.5 everywhere), so "no change" can
win. Each is scored on validation by two off-policy figures that need no LM. ``val_acceptance`` is
E_t[1 - w_t TV_t]. ``val_reward_gain`` is the first-order estimate of the change in a sequence's
expected reward when its tokens come from the head's mixture instead of the behaviour mu, in reward
units (pass-rate points for pass/fail tasks): per sequence (sum_t (r_t - 1)) (R - b), the linear term
of (prod_t r_t - 1) R, averaged per prompt, then over prompts. Because E_mu[r_t] = 1 it is unbiased
for any constant b; b is the train mean reward, the constant that keeps its variance low.
The rule is a non-inferiority test against the starting head, with the prompt as the unit: a
checkpoint is eligible when the one-sided ``confidence`` lower bound of its gain minus the starting
head's (paired over the same prompts) is at least ``-tolerance``; the chosen one has the highest
validation acceptance among the eligible. The starting head always is (a zero difference with zero
spread), so there is always a choice, and a move the held-out prompts cannot vouch for is not made.
Why a bound, not the point estimate: the spread of the estimate grows with how far the head moves
from the behaviour. On the embedded default's second round (8 validation prompts) the collapsed
checkpoints (w ~ 0.008) had point estimates of +0.03 to +0.10 pass rate, which a point-estimate rule
took, and lower bounds of -0.11 to -0.14, which this one refuses.
When every training sequence has the same reward there is nothing to learn (with A = R - 1 an
all-failed set still has |A| = 1, so S would let the acceptance term act alone): the starting head
is kept.

AdamW, linear warm-up then cosine decay, gradient clipping, a fixed seed. Every step's loss,
reward, mean weight and expected acceptance go to ``train_log.jsonl`` (and to an optional
``log_step`` callback, which the workflow uses for MLflow).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import NormalDist
from typing import Any

import torch
from tqdm import tqdm

from diversed.head import EnsembleHead, load_head, save_head
from diversed.traces import Trajectory, load_traces

BASELINES = ("auto", "batch", "running", "minus_one")
REG_SCALES = ("relative", "fixed")
LogStep = Callable[[int, dict[str, float]], None]


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
    baseline: str = "auto"  # auto | batch | running | minus_one
    hidden: int = 0  # 0: the paper's linear head; > 0: a small MLP
    seed: int = 42

    def __post_init__(self) -> None:
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline: {self.baseline!r} is not one of {', '.join(BASELINES)}")
        if self.reg_scale not in REG_SCALES:
            raise ValueError(f"reg_scale: {self.reg_scale!r} is not one of {', '.join(REG_SCALES)}")

    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def resolve_baseline(kind: str, trajectories: Sequence[Trajectory]) -> str:
    """``auto``: r - 1 when every reward is pass/fail (0 or 1), else the running mean."""
    if kind != "auto":
        return kind
    return "minus_one" if all(t.reward in (0.0, 1.0) for t in trajectories) else "running"


def _flatten(batch: Sequence[Trajectory]) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Concatenate a batch's tokens; also return each token's sequence index and the rewards."""
    tensors = {k: torch.cat([t.tensors[k] for t in batch]).float() for k in batch[0].tensors}
    owner = torch.cat([torch.full((t.tensors["mu"].shape[0],), i) for i, t in enumerate(batch)])
    rewards = torch.tensor([t.reward for t in batch])
    return tensors, owner, rewards


def _policy(head: EnsembleHead, tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: the head's weight w and the importance ratio pi(y) / mu(y) of its mixture."""
    w = head(tensors["h_draft"], tensors["h_target"])
    pi = w * tensors["p_y"] + (1 - w) * tensors["q_y"]
    return w, pi / tensors["mu"].clamp_min(1e-12)


def batch_loss(
    head: EnsembleHead, batch: Sequence[Trajectory], baseline: float, cfg: TrainConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    tensors, owner, rewards = _flatten(batch)
    w, ratio = _policy(head, tensors)
    advantage = (rewards - baseline)[owner]
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
    return torch.cat([head(t.tensors["h_draft"], t.tensors["h_target"]) for t in trajectories])


def _prompt(t: Trajectory) -> str:
    """The prompt a trajectory answers: ids are ``<example>@<behaviour>``."""
    return t.id.rsplit("@", 1)[0]


@torch.no_grad()
def _scores(
    head: EnsembleHead, trajectories: Sequence[Trajectory], baseline: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """``prompt_gains`` and the off-policy validation figures (no LM: the estimated reward gain over
    the behaviour policy, the expected acceptance, the mean weight) from one pass over the tokens."""
    tensors, owner, rewards = _flatten(trajectories)
    w, ratio = _policy(head, tensors)
    moved = torch.zeros(len(trajectories), dtype=ratio.dtype).index_add_(0, owner, ratio - 1)
    gains = moved * (rewards - baseline).to(ratio.dtype)
    prompts = {name: i for i, name in enumerate(sorted({_prompt(t) for t in trajectories}))}
    index = torch.tensor([prompts[_prompt(t)] for t in trajectories])
    total = torch.zeros(len(prompts), dtype=gains.dtype).index_add_(0, index, gains)
    per_prompt = total / torch.bincount(index, minlength=len(prompts)).to(gains.dtype)
    return per_prompt, {
        "val_reward_gain": float(per_prompt.mean()),
        "val_acceptance": float((1 - w * tensors["tv"]).mean()),
        "val_mean_weight": float(w.mean()),
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


def validation_figures(
    head: EnsembleHead,
    validation: Sequence[Trajectory],
    baseline: float,
    start_gains: torch.Tensor,
    confidence: float,
) -> dict[str, Any]:
    """A checkpoint's figures for the selection rule: :func:`_scores`'s, plus its reward change
    against the starting head (whose ``prompt_gains`` are ``start_gains``), paired over the
    validation prompts, and that change's lower bound (None without a spread estimate)."""
    gains, figures = _scores(head, validation, baseline)
    change, low = lower_bound(gains - start_gains, confidence)
    return {
        **figures,
        "val_reward_vs_start": change,
        "val_reward_vs_start_low": low if math.isfinite(low) else None,  # JSON has no -inf
    }


def weight_summary(w: torch.Tensor) -> dict[str, Any]:
    """Mean, std, the shares of tokens below 0.1 and above 0.9, and a 20-bin histogram of w."""
    counts = torch.histc(w.float(), bins=20, min=0.0, max=1.0)
    return {
        "w_mean": float(w.mean()),
        "w_std": float(w.std()) if w.numel() > 1 else 0.0,
        "w_below_0.1": float((w < 0.1).float().mean()),
        "w_above_0.9": float((w > 0.9).float().mean()),
        "w_histogram": {"edges": [i / 20 for i in range(21)], "counts": [int(c) for c in counts]},
    }


def start_head(
    trajectories: Sequence[Trajectory], cfg: TrainConfig, init: EnsembleHead | None = None
) -> EnsembleHead:
    """The head training starts from: a copy of ``init``, else a fresh one (w = 0.5 everywhere)."""
    first = trajectories[0].tensors
    head = EnsembleHead(first["h_draft"].shape[-1], first["h_target"].shape[-1], cfg.hidden, cfg.seed)
    if init is not None:
        head.load_state_dict(init.state_dict())
    return head


def train_head(
    trajectories: Sequence[Trajectory],
    cfg: TrainConfig,
    log_path: Path | None = None,
    log_step: LogStep | None = None,
    progress: bool = True,
    init: EnsembleHead | None = None,
    on_epoch: Callable[[int, EnsembleHead], None] | None = None,
    first_step: int = 0,
) -> tuple[EnsembleHead, dict[str, float]]:
    """Fit a head to ``trajectories`` (from ``init`` when given, e.g. the previous round's head);
    return it and the last step's figures. ``on_epoch(epoch, head)`` sees every checkpoint."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    head = start_head(trajectories, cfg, init)
    baseline_kind = resolve_baseline(cfg.baseline, trajectories)
    optimiser = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    per_epoch = math.ceil(len(trajectories) / cfg.batch_size)
    total = cfg.epochs * per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: lr_factor(s, total, cfg.warmup_steps))
    running: float | None = None
    figures: dict[str, float] = {}
    log = log_path.open("a") if log_path else None
    bar = tqdm(total=total, desc="train head", unit="step", disable=not progress)
    step = first_step
    for epoch in range(1, cfg.epochs + 1):
        order = list(trajectories)
        rng.shuffle(order)
        for start in range(0, len(order), cfg.batch_size):
            batch = order[start : start + cfg.batch_size]
            batch_mean = sum(t.reward for t in batch) / len(batch)
            if baseline_kind == "minus_one":
                baseline = 1.0
            elif baseline_kind == "running":
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
            figures = {
                "step": step,
                "lr": scheduler.get_last_lr()[0],
                "reg_lambda": cfg.reg_lambda,
                **figures,
            }
            if log:
                log.write(json.dumps(figures) + "\n")
            if log_step:
                log_step(step, figures)
            bar.update()
            bar.set_postfix(w=f"{figures['mean_weight']:.3f}", accept=f"{figures['expected_acceptance']:.3f}")
        if on_epoch:
            on_epoch(epoch, head)
    bar.close()
    if log:
        log.close()
    return head.eval(), figures


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


def choose(candidates: Sequence[dict[str, Any]], tolerance: float) -> int:
    """Index of the checkpoint the selection rule of the module docstring picks: the highest
    validation acceptance among those whose lower bound on the reward change against the starting
    head (candidate 0, always eligible) is at least ``-tolerance``."""
    lows = [c["val_reward_vs_start_low"] for c in candidates]
    eligible = [i for i, low in enumerate(lows) if i == 0 or (low is not None and low >= -tolerance)]
    return max(eligible, key=lambda i: (candidates[i]["val_acceptance"], lows[i]))


def select_head(
    trajectories: Sequence[Trajectory],
    cfg: TrainConfig,
    lambdas: Sequence[float],
    validation_share: float = 0.25,
    tolerance: float = 0.0,
    init: EnsembleHead | None = None,
    log_path: Path | None = None,
    log_step: LogStep | None = None,
    progress: bool = True,
    confidence: float = 0.95,
) -> tuple[EnsembleHead, dict[str, Any]]:
    """Train one head per lambda on the train prompts, score every epoch and the starting head
    (``init``, the previous round's, else the fresh one) on the validation prompts, and return the
    chosen checkpoint with a record of every candidate. Without validation prompts (too few) the
    last epoch of the first lambda is taken, and the record says so."""
    train, validation = split_by_prompt(trajectories, validation_share, cfg.seed)
    baseline_kind = resolve_baseline(cfg.baseline, trajectories)
    mean_reward = sum(t.reward for t in train) / len(train)
    candidates: list[dict[str, Any]] = []
    snapshots: list[EnsembleHead] = []

    start = start_head(trajectories, cfg, init)
    start_gains = prompt_gains(start, validation, mean_reward) if validation else None

    def checkpoint(head: EnsembleHead, lam: float | None, epoch: int, step: int) -> None:
        figures: dict[str, Any] = {}
        if start_gains is not None:
            figures = validation_figures(head, validation, mean_reward, start_gains, confidence)
        if log_step and figures:
            log_step(step, {k: v for k, v in figures.items() if v is not None})
        candidates.append({"reg_lambda": lam, "epoch": epoch, **figures})
        snapshots.append(copy.deepcopy(head).eval())

    checkpoint(start, None, 0, 0)
    if len({t.reward for t in train}) == 1:
        index, rule = 0, f"every train sequence has reward {train[0].reward:g}: the starting head, untrained"
    else:
        steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
        for n, lam in enumerate(lambdas):
            first = n * cfg.epochs * steps_per_epoch
            train_head(
                train,
                replace(cfg, reg_lambda=lam, baseline=baseline_kind),  # the rule resolved on all traces
                log_path,
                log_step,
                progress,
                init,
                lambda epoch, head, lam=lam, first=first: checkpoint(
                    head, lam, epoch, first + epoch * steps_per_epoch
                ),
                first_step=first,
            )
        if validation:
            index = choose(candidates, tolerance)
            rule = (
                f"max val_acceptance among checkpoints whose reward change against the starting head has a "
                f"{confidence:g} lower bound >= {-tolerance:g} ({len(start_gains)} validation prompts)"
            )
        else:
            index = cfg.epochs  # candidates: the starting head, then each lambda's epochs in order
            rule = "no validation prompts: the last epoch of the first lambda"
    record = {
        "rule": rule,
        "baseline": baseline_kind,
        "train_sequences": len(train),
        "validation_sequences": len(validation),
        "candidates": candidates,
        "chosen": candidates[index],
    }
    return snapshots[index], record


def train_from_traces(
    traces: str | Path | Sequence[str | Path],
    out: str | Path,
    cfg: TrainConfig,
    lambdas: Sequence[float] | None = None,
    validation_share: float = 0.25,
    tolerance: float = 0.0,
    init: str | Path | None = None,
    log_step: LogStep | None = None,
    progress: bool = True,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Train on one or several trace folders (the rounds so far), starting from the head at
    ``init`` if given, choose lambda and the epoch by the selection rule, save head and card."""
    folders = [traces] if isinstance(traces, str | Path) else list(traces)
    trajectories: list[Trajectory] = []
    manifests = []
    for folder in folders:
        found, manifest = load_traces(folder)
        trajectories += found
        manifests.append(manifest)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "train_log.jsonl").unlink(missing_ok=True)
    start = load_head(init) if init else None
    head, selection = select_head(
        trajectories,
        cfg,
        lambdas or [cfg.reg_lambda],
        validation_share,
        tolerance,
        start,
        out_dir / "train_log.jsonl",
        log_step,
        progress,
        confidence,
    )
    summary = weight_summary(head_weights(head, trajectories))
    settings = manifests[-1]["settings"]
    card = {
        "target": settings.get("target"),
        "draft": settings.get("draft"),
        "task": settings.get("dataset"),
        "traces": [str(f) for f in folders],
        "traces_hash": [m["settings_hash"] for m in manifests],
        "init": str(init) if init else None,
        "training": asdict(cfg),
        "training_hash": cfg.config_hash(),
        "selection": selection,
        "metrics": {**{k: v for k, v in summary.items() if k != "w_histogram"}, **selection["chosen"]},
        "w_histogram": summary["w_histogram"],
        "sequences": len(trajectories),
    }
    save_head(head, out_dir, card)
    return card


def plot_weight_histogram(card: dict[str, Any], out: str | Path) -> Path:
    """``w_histogram.png`` in the head folder: where the chosen head puts its weight."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist, metrics = card["w_histogram"], card["metrics"]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.stairs(hist["counts"], hist["edges"], fill=True, alpha=0.7)
    ax.set_xlabel("target weight w")
    ax.set_ylabel("tokens")
    ax.set_title(
        f"{card['task']}: mean {metrics['w_mean']:.2f}, <0.1 {metrics['w_below_0.1']:.0%}, "
        f">0.9 {metrics['w_above_0.9']:.0%} (n = {sum(hist['counts'])})",
        fontsize=9,
    )
    fig.tight_layout()
    path = Path(out) / "w_histogram.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
