"""The DIVERSED ensemble head: per-token target weight from both models' hidden states.

As in the paper's code: one linear layer over [h_draft ; h_target] (last-layer hidden states at
the position being verified) gives two logits, softmax gives (w_draft, w_target). Both rows start
identical and the bias at zero, so every weight starts at exactly 0.5. An optional small MLP
replaces the linear layer (``hidden`` > 0), with the same start.

An option beyond the paper (``signals``): the verifier's own per-position signals, TV(p, q) and
both models' entropies (:data:`SIGNALS`), join the hidden states as inputs. A linear head cannot
compute them from the hidden states (each is a nonlinear function of both models' logits), and
they are what the training-free gates threshold on (:mod:`diversed.evaluation.gates`), so a head with them can
express those gates and any blend of them with context. They enter standardised by the training
traces' mean and std (kept in the head) and scaled by sqrt(input width): under Adam every input
weight moves about lr per step, and a direction of the hidden states sums about sqrt(width) of
them, so this gives each signal the leverage of one such direction instead of 1/sqrt(width) of it.

Saved as ``head.safetensors`` plus ``head.json``, a card with the input sizes, the models, the
task, the training config and its hash, and metrics at save time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from diversed.files import read_json, read_tensors, require

WEIGHTS = "head.safetensors"
CARD = "head.json"
SIGNALS = ("tv", "entropy_p", "entropy_q")
"""The verifier's signals a ``signals`` head reads, in input order: TV(p, q) of the distributions
verified against, and the temperature-1 entropies of the target's and the draft's logits (nats)."""


class HeadError(ValueError):
    """A head file is missing or does not fit the models."""


class EnsembleHead(nn.Module):
    """(h_draft [L, d_draft], h_target [L, d_target][, signals [L, 3]]) -> target weight w [L] in (0, 1)."""

    def __init__(
        self, d_draft: int, d_target: int, hidden: int = 0, seed: int = 0, signals: bool = False
    ) -> None:
        super().__init__()
        self.d_draft, self.d_target, self.hidden, self.signals = d_draft, d_target, hidden, signals
        width = self.width = d_draft + d_target + (len(SIGNALS) if signals else 0)
        if signals:  # standardisation, set from the training traces by :meth:`fit_signals`
            self.register_buffer("signal_mean", torch.zeros(len(SIGNALS)))
            self.register_buffer("signal_scale", torch.full((len(SIGNALS),), math.sqrt(width)))
        self.body = nn.Sequential(nn.Linear(width, hidden), nn.GELU()) if hidden else nn.Identity()
        self.out = nn.Linear(hidden or width, 2)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            row = torch.randn(self.out.in_features, generator=generator) * 0.01
            self.out.weight.copy_(row.expand(2, -1))  # identical rows: softmax gives exactly (0.5, 0.5)
            self.out.bias.zero_()
            if hidden:
                nn.init.normal_(self.body[0].weight, std=0.02, generator=generator)
                nn.init.zeros_(self.body[0].bias)

    def fit_signals(self, signals: torch.Tensor) -> None:
        """Standardise the signal inputs by the mean and std of ``signals`` [N, 3] (training tokens)."""
        with torch.no_grad():
            self.signal_mean.copy_(signals.float().mean(0))
            self.signal_scale.copy_(math.sqrt(self.width) / signals.float().std(0).clamp_min(1e-6))

    def forward(
        self, h_draft: torch.Tensor, h_target: torch.Tensor, signals: torch.Tensor | None = None
    ) -> torch.Tensor:
        parts = [h_draft.float(), h_target.float()]
        if self.signals:
            if signals is None:
                raise HeadError("this head reads the verifier's signals (TV, entropies); none were given")
            parts.append((signals.float() - self.signal_mean) * self.signal_scale)
        features = torch.cat(parts, dim=-1)
        weights = self.out(self.body(features)).softmax(-1)
        return weights[..., 1]  # column 0 is w_draft, column 1 is w_target


def save_head(head: EnsembleHead, directory: str | Path, card: dict[str, Any]) -> Path:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}, str(out / WEIGHTS))
    sizes = {"d_draft": head.d_draft, "d_target": head.d_target, "hidden": head.hidden}
    full_card = {**sizes, "signals": list(SIGNALS) if head.signals else [], **card}
    (out / CARD).write_text(json.dumps(full_card, indent=2) + "\n")
    return out


def load_head(directory: str | Path, d_draft: int | None = None, d_target: int | None = None) -> EnsembleHead:
    """Load a saved head; sizes that do not fit the models are a one-line error naming both."""
    path = Path(directory)
    if not (path / CARD).exists() or not (path / WEIGHTS).exists():
        raise HeadError(f"no ensemble head at {path} (expected {CARD} and {WEIGHTS})")
    card = require(read_json(path / CARD), ("d_draft", "d_target"), path / CARD, "a head card")
    if not all(isinstance(card[key], int) and card[key] > 0 for key in ("d_draft", "d_target")):
        raise HeadError(
            f"{path / CARD}: d_draft and d_target must be hidden sizes,"
            f" not {card['d_draft']!r} and {card['d_target']!r}"
        )
    expected = (card["d_draft"], card["d_target"])
    if d_draft is not None and d_target is not None and (d_draft, d_target) != expected:
        raise HeadError(
            f"head {path} expects hidden sizes draft {expected[0]} + target {expected[1]},"
            f" but the models have draft {d_draft} + target {d_target}"
        )
    head = EnsembleHead(
        card["d_draft"], card["d_target"], card.get("hidden", 0), signals=bool(card.get("signals"))
    )
    try:
        head.load_state_dict(read_tensors(path / WEIGHTS))
    except RuntimeError as err:  # names or shapes that are not this head's
        raise HeadError(f"{path / WEIGHTS} does not hold the head its card describes: {err}") from None
    return head.eval()


def load_head_for(directory: str | Path, target: nn.Module, draft: nn.Module) -> EnsembleHead:
    """A saved head, checked against the hidden sizes of the models it will read."""
    return load_head(directory, draft.config.hidden_size, target.config.hidden_size)


def read_card(directory: str | Path) -> dict[str, Any]:
    return read_json(Path(directory) / CARD)
