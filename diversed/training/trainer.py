"""The training loop: one head per lambda, the checkpoint the selection rule picks, its card.

AdamW, linear warm-up then cosine decay, gradient clipping, a fixed seed. Every step's loss,
reward, mean weight and expected acceptance go to ``train_log.jsonl`` (and to an optional
``log_step`` callback, which the workflow uses for MLflow).
"""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from diversed.config import check_range
from diversed.head import EnsembleHead, load_head, save_head
from diversed.training.objective import (
    TrainConfig,
    batch_loss,
    group_advantages,
    head_signals,
    head_weights,
    lr_factor,
    resolve_baseline,
)
from diversed.training.selection import (
    MIN_WEIGHT_STD,
    choose,
    prompt_gains,
    split_by_prompt,
    validation_figures,
)
from diversed.training.traces import Trajectory, load_traces

LogStep = Callable[[int, dict[str, float]], None]
FINALIST = "lambda-"  # subfolders of a trained head's folder: each lambda's last epoch


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


def weight_card(head: EnsembleHead, trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """A head card's w figures on the traces: ``metrics`` (mean, std, shares) and ``w_histogram``."""
    summary = weight_summary(head_weights(head, trajectories))
    histogram = summary.pop("w_histogram")
    return {"metrics": summary, "w_histogram": histogram}


def start_head(
    trajectories: Sequence[Trajectory], cfg: TrainConfig, init: EnsembleHead | None = None
) -> EnsembleHead:
    """The head training starts from: a copy of ``init``, else a fresh one (w = 0.5 everywhere)."""
    first = trajectories[0].tensors
    sizes = (first["h_draft"].shape[-1], first["h_target"].shape[-1])
    head = EnsembleHead(*sizes, cfg.hidden, cfg.seed, signals=cfg.signals)
    head.to(first["h_target"].device)  # where the traces are: the device training runs on
    if init is not None:
        head.load_state_dict(init.state_dict())
    elif cfg.signals:
        head.fit_signals(torch.cat([head_signals(head, t.tensors) for t in trajectories]))
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
    grouped = group_advantages(trajectories) if baseline_kind == "group" else {}
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
            if baseline_kind == "group":
                advantages = [grouped[t.id] for t in batch]
            else:
                batch_mean = sum(t.reward for t in batch) / len(batch)
                if baseline_kind == "minus_one":
                    baseline = 1.0
                elif baseline_kind == "running":
                    baseline = batch_mean if running is None else running
                    running = batch_mean if running is None else 0.9 * running + 0.1 * batch_mean
                else:
                    baseline = batch_mean
                advantages = [t.reward - baseline for t in batch]
            loss, figures = batch_loss(head, batch, torch.tensor(advantages), cfg)
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


def select_head(
    trajectories: Sequence[Trajectory],
    cfg: TrainConfig,
    lambdas: Sequence[float],
    validation_share: float = 0.25,
    acceptance_value: float = 1.0,
    init: EnsembleHead | None = None,
    log_path: Path | None = None,
    log_step: LogStep | None = None,
    progress: bool = True,
    confidence: float = 0.95,
    min_weight_std: float = MIN_WEIGHT_STD,
) -> tuple[EnsembleHead, dict[str, Any], dict[float, EnsembleHead]]:
    """Train one head per lambda on the train prompts, score every epoch and the starting head
    (``init``, the previous round's, else the fresh one) on the validation prompts, and return the
    chosen checkpoint (the trained one with the highest validation objective among those whose w
    varies by at least ``min_weight_std`` on the validation tokens, :func:`choose`) with
    a record of every candidate, and each lambda's last epoch (the finalists a study may decode).
    Without validation prompts (too few) the last epoch of the first lambda is taken, and the
    record says so; without reward information nothing is trained, and the start is returned."""
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
            index, varies = choose(candidates, acceptance_value, min_weight_std)
            among = (
                f"whose w varies (val_weight_std >= {min_weight_std:g})"
                if varies
                else f"(none has val_weight_std >= {min_weight_std:g}: every one is a static rule in effect)"
            )
            rule = (
                f"the trained checkpoint {among} with the highest val_objective = val_reward_gain + "
                f"{acceptance_value:g} x val_acceptance ({len(start_gains)} validation prompts)"
            )
        else:
            index = cfg.epochs  # candidates: the starting head, then each lambda's epochs in order
            rule = "no validation prompts: the last epoch of the first lambda"
    last = [i for i, c in enumerate(candidates) if c["epoch"] == cfg.epochs]
    finals = {candidates[i]["reg_lambda"]: snapshots[i] for i in last}
    record = {
        "rule": rule,
        "baseline": baseline_kind,
        "train_sequences": len(train),
        "validation_sequences": len(validation),
        "candidates": candidates,
        "chosen": candidates[index],
    }
    return snapshots[index], record, finals


def train_from_traces(
    traces: str | Path | Sequence[str | Path],
    out: str | Path,
    cfg: TrainConfig,
    lambdas: Sequence[float] | None = None,
    validation_share: float = 0.25,
    acceptance_value: float = 1.0,
    init: str | Path | None = None,
    log_step: LogStep | None = None,
    progress: bool = True,
    confidence: float = 0.95,
    device: str = "cpu",
    min_weight_std: float = MIN_WEIGHT_STD,
) -> dict[str, Any]:
    """Train on one or several trace folders (the rounds so far), starting from the head at
    ``init`` if given, choose lambda and the epoch by the selection rule, save head and card.
    Training runs on ``device``: the traces' tensors are moved there once, the head lives there."""
    for lam in lambdas or ():
        check_range("reg_lambda", lam, exclusive_minimum=0)
    check_range("validation_share", validation_share, minimum=0, exclusive_maximum=1)
    check_range("confidence", confidence, exclusive_minimum=0.5, exclusive_maximum=1)
    check_range("min_weight_std", min_weight_std, minimum=0)
    folders = [traces] if isinstance(traces, str | Path) else list(traces)
    trajectories: list[Trajectory] = []
    manifests = []
    for folder in folders:
        found, manifest = load_traces(folder)
        trajectories += [replace(t, tensors={k: v.to(device) for k, v in t.tensors.items()}) for t in found]
        manifests.append(manifest)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "train_log.jsonl").unlink(missing_ok=True)
    start = load_head(init).to(device) if init else None
    head, selection, finals = select_head(
        trajectories,
        cfg,
        lambdas or [cfg.reg_lambda],
        validation_share,
        acceptance_value,
        start,
        out_dir / "train_log.jsonl",
        log_step,
        progress,
        confidence,
        min_weight_std,
    )
    weights = weight_card(head, trajectories)
    settings = manifests[-1]["settings"]
    chosen = selection["chosen"]["reg_lambda"]  # None: the untrained start was kept
    trained = replace(cfg, reg_lambda=chosen) if chosen is not None else None
    card = {
        "target": settings.get("target"),
        "draft": settings.get("draft"),
        "task": settings.get("dataset"),
        "traces": [str(f) for f in folders],
        "traces_hash": [m["settings_hash"] for m in manifests],
        "init": str(init) if init else None,
        "training": asdict(trained) if trained else {**asdict(cfg), "reg_lambda": None, "epochs_trained": 0},
        "training_hash": trained.config_hash() if trained else None,
        "selection": selection,
        "untrained": trained is None,  # the start: w = 0.5 everywhere, i.e. static w = 0.5
        "metrics": {**weights["metrics"], **selection["chosen"]},
        "w_histogram": weights["w_histogram"],
        "sequences": len(trajectories),
    }
    save_head(head, out_dir, card)
    for stale in out_dir.glob(f"{FINALIST}*"):
        shutil.rmtree(stale)
    for lam, final in finals.items():  # the finalists of an on-policy check, beside the chosen head
        mine = replace(cfg, reg_lambda=lam)
        own = {
            **card,
            "training": asdict(mine),
            "training_hash": mine.config_hash(),
            "chosen_by": f"the last epoch of lambda {lam:g}",
            **weight_card(final, trajectories),
        }
        save_head(final, out_dir / f"{FINALIST}{lam:g}", own)
    return card
