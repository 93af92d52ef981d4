"""Verification rules: which drafted tokens to keep, and what to emit instead.

Each rule is a pair (acceptance probability, residual distribution) over the target's p, the
draft's q and the drafted token, in the style of Google's speculative-cascades reference. Most
rules verify the draft against some *target distribution* v with the lossless SD test
(accept with min(1, v(x)/q(x)), on rejection draw from norm((v - q)+)), so the emitted token is
distributed exactly as v; they differ only in v:

=========  ============================================================
sd         v = p
static     v = w p + (1 - w) q            (or softmax(w z_p + (1 - w) z_q))
diversed   as static, w per position from a learned head
cascade    v = pi, a deferral-rule mixture of p and q
=========  ============================================================

Lossy SD is the one rule that is not "SD against some v": it accepts with min(1, p/(l q)) and
resamples from norm((p - q)+).

Greedy decoding (temperature 0) uses token matching against argmax v; the distributions are then
the unfiltered temperature-1 ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diversed.config import DecodeConfig
from diversed.methods import CascadeRule, EnsembleSpace, Method
from diversed.sampling import Sampling, draw, probabilities


@dataclass
class Block:
    """What the verifier sees for one block of L drafted tokens.

    ``p`` has L + 1 rows (the last one is the bonus position); ``q`` has the L rows the draft
    sampled from. ``weights`` holds per-position target weights from a head (``diversed`` only).
    """

    tokens: torch.Tensor  # [L] drafted token ids
    p: torch.Tensor  # [L + 1, V] processed target probabilities
    q: torch.Tensor  # [L, V] processed draft probabilities (exactly those sampled from)
    p_logits: torch.Tensor  # [L + 1, V] raw target logits
    q_logits: torch.Tensor  # [L, V] raw draft logits
    weights: torch.Tensor | None = None  # [L] target weights w


def _normalise_positive(x: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """norm(max(0, x)) per row; where no mass is left (v == q up to rounding) use ``fallback``."""
    pos = x.clamp_min(0.0)
    mass = pos.sum(-1, keepdim=True)
    return torch.where(mass > 1e-12, pos / mass.clamp_min(1e-30), fallback)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """TV(p, q) = 1/2 sum |p - q| per row."""
    return 0.5 * (p - q).abs().sum(-1)


class Rule:
    """SD verification against :meth:`target`; subclasses choose the target."""

    needs_hidden_states = False

    def target(self, block: Block) -> torch.Tensor:
        """The distribution the L drafted tokens are verified against, [L, V]."""
        return block.p[:-1]

    def accept_prob(self, block: Block) -> torch.Tensor:
        """Probability of keeping each drafted token, given the previous ones were kept."""
        v = self.target(block)
        idx = block.tokens.unsqueeze(-1)
        ratio = v.gather(-1, idx).squeeze(-1) / block.q.gather(-1, idx).squeeze(-1)
        return ratio.clamp(max=1.0)

    def residual(self, block: Block) -> torch.Tensor:
        """Distribution of the correction token after a rejection, [L, V]."""
        v = self.target(block)
        return _normalise_positive(v - block.q, v)


class StandardRule(Rule):
    """Leviathan et al. / Chen et al.: lossless, v = p."""


class LossyRule(Rule):
    """Lossy SD (Leviathan et al. 2023, App. A.5): accept min(1, p / (l q)), residual norm((p - q)+)."""

    def __init__(self, lenience: float) -> None:
        if not 0.0 < lenience <= 1.0:
            raise ValueError(f"lenience must be in (0, 1], got {lenience}")
        self.lenience = lenience

    def accept_prob(self, block: Block) -> torch.Tensor:
        idx = block.tokens.unsqueeze(-1)
        p = block.p[:-1].gather(-1, idx).squeeze(-1)
        q = block.q.gather(-1, idx).squeeze(-1)
        return (p / (self.lenience * q)).clamp(max=1.0)

    def residual(self, block: Block) -> torch.Tensor:
        p = block.p[:-1]
        return _normalise_positive(p - block.q, p)


class EnsembleRule(Rule):
    """Static (fixed ``weight``) or dynamic (``weight=None``: per-position head weights) ensemble."""

    def __init__(self, weight: float | None, space: EnsembleSpace, sampling: Sampling) -> None:
        if weight is not None and not 0.0 <= weight <= 1.0:
            raise ValueError(f"target weight must be in [0, 1], got {weight}")
        self.weight = weight
        self.space = space
        self.sampling = sampling
        self.needs_hidden_states = weight is None

    def _weights(self, block: Block) -> torch.Tensor:
        if self.weight is not None:
            return torch.full((block.q.shape[0], 1), self.weight, dtype=block.q.dtype)
        if block.weights is None:
            raise ValueError("the dynamic ensemble needs per-position weights from a head")
        return block.weights.reshape(-1, 1).to(block.q.dtype)

    def target(self, block: Block) -> torch.Tensor:
        w = self._weights(block)
        if self.space is EnsembleSpace.PROBS:
            return w * block.p[:-1] + (1.0 - w) * block.q
        mixed = w * block.p_logits[:-1].float() + (1.0 - w) * block.q_logits.float()
        return probabilities(mixed, self.sampling)


class CascadeRuleVerifier(Rule):
    """Speculative cascades: lossless SD against the deferral target pi (Narasimhan et al. 2024)."""

    def __init__(self, rule: CascadeRule, alpha: float) -> None:
        self.rule = rule
        self.alpha = alpha

    def target(self, block: Block) -> torch.Tensor:
        p, q = block.p[:-1], block.q
        max_p = p.max(-1, keepdim=True).values
        max_q = q.max(-1, keepdim=True).values
        if self.rule is CascadeRule.TOKEN:
            keep = p >= (1.0 - self.alpha) * max_p
            eta = (q * ~keep).sum(-1, keepdim=True)
            return q * keep + eta * p
        if self.rule is CascadeRule.CHOW:
            defer = max_q < 1.0 - self.alpha
        elif self.rule is CascadeRule.DIFF:
            defer = max_q < max_p - self.alpha
        else:
            defer = max_q < max_p - self.alpha * total_variation(p, q).unsqueeze(-1)
        return torch.where(defer, p, q)


def make_rule(config: DecodeConfig) -> Rule:
    """The verification rule of ``config.method``."""
    sampling = Sampling(config.temperature, config.top_k, config.top_p)
    method = config.method
    if method in (Method.SD, Method.AUTO):
        return StandardRule()
    if method is Method.LOSSY:
        return LossyRule(config.lenience)
    if method is Method.STATIC:
        return EnsembleRule(config.target_weight, config.ensemble_space, sampling)
    if method is Method.DIVERSED:
        return EnsembleRule(None, config.ensemble_space, sampling)
    return CascadeRuleVerifier(config.cascade_rule, config.cascade_alpha)


def verify(
    rule: Rule, block: Block, sampling: Sampling, generator: torch.Generator | None
) -> tuple[int, int]:
    """Accept a prefix of the drafted tokens; return (number accepted, the one extra token).

    The extra token is the correction after the first rejection, or a bonus token drawn from
    the target (never mixed) when every drafted token was kept.
    """
    num_drafted = block.tokens.shape[0]
    if num_drafted == 0:
        return 0, int(draw(block.p[-1], sampling, generator))
    if sampling.greedy:
        best = rule.target(block).argmax(-1)
        keep = block.tokens == best
    else:
        uniforms = torch.rand(num_drafted, generator=generator)
        keep = uniforms < rule.accept_prob(block)
    rejected = (~keep).nonzero()
    n = int(rejected[0]) if rejected.numel() else num_drafted
    if n == num_drafted:
        return n, int(draw(block.p[-1], sampling, generator))
    if sampling.greedy:
        return n, int(best[n])
    return n, int(draw(rule.residual(block)[n], sampling, generator))
