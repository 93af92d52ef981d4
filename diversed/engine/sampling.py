"""Turning logits into distributions, and drawing from them with per-row randomness.

Temperature, top-k and top-p are applied exactly once to each model's logits, before anything
else. The same function produces the draft's q (which the draft samples from, and which the
verifier then uses unchanged) and the target's p, so acceptance always uses the probabilities
that were actually sampled from.

Randomness is *counter-based*: every row of a batch owns a seed and a counter, and its n-th
uniform is a hash of (seed, n). A row's uniforms therefore never depend on its batch-mates, on
the batch size or on the device (the hash is integer arithmetic, identical on CPU and CUDA), and
drawing them for the whole batch is one tensor expression, with no per-row generator or Python
loop. A row advances its counter only for the draws it really makes (a row that stopped drafting
does not consume uniforms for the padding slots), which is what makes batched output equal
batch-1 output sample for sample. Tokens are drawn by inversion (one uniform against the row's
cumulative distribution, in float64), so a draw costs one uniform, not one per vocabulary entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF


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


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """x * constant mod 2**32 for int64 x < 2**32, without ever overflowing int64."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (Wellons' lowbias32) on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


class RowRandom:
    """Per-row uniform streams: row b's n-th uniform is a hash of (seed_b, n).

    ``seeds`` may be any non-negative Python ints; the counters live on ``device``.
    """

    def __init__(self, seeds: list[int], device: torch.device | str = "cpu") -> None:
        words = [[s & _MASK32, (s >> 32) & _MASK32] for s in seeds]
        key = torch.tensor(words, dtype=torch.long, device=device).reshape(-1, 2)
        self.key = _hash32(key[:, 0] ^ _hash32(key[:, 1] ^ 0x9E3779B9))
        self.counter = torch.zeros(len(seeds), dtype=torch.long, device=device)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices), e.g. when finished rows leave the batch."""
        self.key, self.counter = self.key[rows], self.counter[rows]

    def uniform(self, width: int, used: torch.Tensor) -> torch.Tensor:
        """Uniforms [B, width] in [0, 1) (float64, 53 random bits) at counters n .. n + width - 1.

        ``used`` [B] says how many of them each row really consumes; only those advance its
        counter, so the next call continues each row's own stream.
        """
        n = self.counter.unsqueeze(1) + torch.arange(width, device=self.counter.device)
        first = _hash32(self.key.unsqueeze(1) ^ _hash32(n & _MASK32))
        second = _hash32(first ^ 0x68E31DA4 ^ _hash32((n >> 32) & _MASK32))
        self.counter = self.counter + used.to(torch.long)
        bits = ((first >> 5) << 26) | (second >> 6)  # 27 + 26 = 53 bits
        return bits.double() / float(1 << 53)


def draw(probs: torch.Tensor, sampling: Sampling, uniforms: torch.Tensor | None) -> torch.Tensor:
    """One token per row of ``probs`` [..., V]: argmax when greedy, else inversion of ``uniforms`` [...].

    Inversion picks the first token whose cumulative mass exceeds u * total, so a token of
    probability 0 is never drawn.
    """
    if sampling.greedy:
        return probs.argmax(-1)
    cdf = probs.double().cumsum(-1)
    point = (uniforms * cdf[..., -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, point, right=True).squeeze(-1)
    return index.clamp_max(probs.shape[-1] - 1)
