"""Turning logits into the distributions that are sampled from and verified against.

Temperature, top-k and top-p are applied exactly once to each model's logits, before anything
else. The same function produces the draft's q (which the draft samples from, and which the
verifier then uses unchanged) and the target's p, so acceptance always uses the probabilities
that were actually sampled from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters; ``temperature == 0`` means greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def filter_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Temperature, then top-k, then top-p (Hugging Face's order), on the last dimension.

    Greedy decoding needs no filtering: the argmax survives every filter, and the ensemble
    rules build their greedy targets from the unfiltered temperature-1 distributions.
    """
    logits = logits.float()
    if sampling.greedy:
        return logits
    logits = logits / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop the low tail whose mass is at most 1 - top_p; always keep the best token.
        drop_sorted = cumulative <= (1.0 - sampling.top_p)
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The processed distribution (float32) that tokens are drawn from."""
    return filter_logits(logits, sampling).softmax(-1)


def draw(probs: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row: argmax when greedy, else a draw from ``probs``."""
    if sampling.greedy:
        return probs.argmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
