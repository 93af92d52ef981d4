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
gate       as static, w per position 1 or 0 by a threshold on TV, KL or H(p): no training
cascade    v = pi, a deferral-rule mixture of p and q
=========  ============================================================

Lossy SD is the one rule that is not "SD against some v": it accepts with min(1, p/(l q)) and
resamples from norm((p - q)+).

Greedy decoding (temperature 0) uses token matching against argmax v; the distributions are then
the unfiltered temperature-1 ones.

Rules take their knobs from a :class:`~diversed.config.DecodeConfig`, which validated each where
it is declared; they do not check them again. Every rule works position by position on tensors
shaped [..., V] (a batch of B rows and L drafted positions is [B, L, V]), so one call verifies a
whole batch's block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diversed.config import DecodeConfig
from diversed.engine.sampling import RowRandom, Sampling, draw, probabilities
from diversed.methods import CascadeRule, EnsembleSpace, GateSignal, Method


@dataclass
class Block:
    """What the verifier sees for one block: B rows of up to L drafted tokens.

    ``p`` has L + 1 positions (the last is the bonus position); ``q`` has the L the draft sampled
    from. Row b drafted ``num_drafted[b]`` tokens; its positions beyond that are padding.
    """

    tokens: torch.Tensor  # [B, L] drafted token ids
    num_drafted: torch.Tensor  # [B] drafted tokens per row (<= L)
    p: torch.Tensor  # [B, L + 1, V] processed target probabilities
    q: torch.Tensor  # [B, L, V] processed draft probabilities (exactly those sampled from)
    p_logits: torch.Tensor  # [B, L + 1, V] raw target logits
    q_logits: torch.Tensor  # [B, L, V] raw draft logits
    weights: torch.Tensor | None = None  # [B, L] target weights w (diversed)


@dataclass
class Position:
    """The distributions at a set of positions (any leading shape, last dimension V)."""

    p: torch.Tensor
    q: torch.Tensor
    p_logits: torch.Tensor
    q_logits: torch.Tensor
    weights: torch.Tensor | None = None  # leading shape, no V


def _normalise_positive(x: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """norm(max(0, x)) per row; where no mass is left (v == q up to rounding) use ``fallback``."""
    pos = x.clamp_min(0.0)
    mass = pos.sum(-1, keepdim=True)
    return torch.where(mass > 1e-12, pos / mass.clamp_min(1e-30), fallback)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """TV(p, q) = 1/2 sum |p - q| per row."""
    return 0.5 * (p - q).abs().sum(-1)


def _at(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return x.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


class Rule:
    """SD verification against :meth:`target`; subclasses choose the target."""

    needs_hidden_states = False
    per_token_weights = False  # a weight w per position (recorded with each token)

    def weights(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor | None:
        """Per-position weights the rule computes itself from p and q ([..., V] -> [...]), if any."""
        return None

    def target(self, pos: Position) -> torch.Tensor:
        """The distribution the drafted tokens are verified against."""
        return pos.p

    def accept_prob(self, pos: Position, v: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Probability of keeping each drafted token, given the previous ones were kept."""
        return (_at(v, tokens) / _at(pos.q, tokens)).clamp(max=1.0)

    def residual(self, pos: Position, v: torch.Tensor) -> torch.Tensor:
        """Distribution of the correction token after a rejection."""
        return _normalise_positive(v - pos.q, v)


class StandardRule(Rule):
    """Leviathan et al. / Chen et al.: lossless, v = p."""


class LossyRule(Rule):
    """Lossy SD (Leviathan et al. 2023, App. A.5): accept min(1, p / (l q)), residual norm((p - q)+)."""

    def __init__(self, lenience: float) -> None:
        self.lenience = lenience

    def accept_prob(self, pos: Position, v: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return (_at(pos.p, tokens) / (self.lenience * _at(pos.q, tokens))).clamp(max=1.0)

    def residual(self, pos: Position, v: torch.Tensor) -> torch.Tensor:
        return _normalise_positive(pos.p - pos.q, pos.p)


class EnsembleRule(Rule):
    """Static (fixed ``weight``) or dynamic (``weight=None``: per-position head weights) ensemble."""

    def __init__(self, weight: float | None, space: EnsembleSpace, sampling: Sampling) -> None:
        self.weight = weight
        self.space = space
        self.sampling = sampling
        self.needs_hidden_states = weight is None
        self.per_token_weights = weight is None

    def _weights(self, pos: Position) -> torch.Tensor | float:
        if self.weight is not None:
            return self.weight
        if pos.weights is None:
            raise ValueError("the dynamic ensemble needs per-position weights from a head")
        return pos.weights.unsqueeze(-1).to(pos.q.dtype)

    def target(self, pos: Position) -> torch.Tensor:
        w = self._weights(pos)
        if self.space is EnsembleSpace.PROBS:
            return w * pos.p + (1.0 - w) * pos.q
        mixed = w * pos.p_logits.float() + (1.0 - w) * pos.q_logits.float()
        return probabilities(mixed, self.sampling)


def kl_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row, in nats (0 log 0 = 0)."""
    return torch.where(p > 0, p * (p.clamp_min(1e-30).log() - q.clamp_min(1e-30).log()), 0.0).sum(-1)


def entropy(p: torch.Tensor) -> torch.Tensor:
    """H(p) per row, in nats."""
    return -torch.where(p > 0, p * p.clamp_min(1e-30).log(), 0.0).sum(-1)


def logit_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(softmax(logits)) per row, in nats: a model's own temperature-1 uncertainty."""
    log_p = logits.float().log_softmax(-1)
    return -(log_p.exp() * log_p).sum(-1)


def verifier_signals(
    p: torch.Tensor, q: torch.Tensor, p_logits: torch.Tensor, q_logits: torch.Tensor
) -> torch.Tensor:
    """Per position [..., 3], the signals the verifier holds anyway (``diversed.head.SIGNALS``):
    TV(p, q) of the distributions verified against, and H of each model's raw logits."""
    return torch.stack([total_variation(p, q), logit_entropy(p_logits), logit_entropy(q_logits)], -1)


class GateRule(EnsembleRule):
    """A training-free per-token ensemble: w = 1 or 0 at each position by a threshold on a signal
    the verifier already has (:class:`~diversed.methods.GateSignal`), then the dynamic ensemble's
    test against v = w p + (1 - w) q, so a kept token has acceptance 1 - w TV(p, q)."""

    def __init__(
        self, signal: GateSignal, threshold: float, space: EnsembleSpace, sampling: Sampling
    ) -> None:
        super().__init__(None, space, sampling)
        self.needs_hidden_states = False
        self.signal = signal
        self.threshold = threshold

    def weights(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        if self.signal is GateSignal.TV:
            protect = total_variation(p, q) > self.threshold
        elif self.signal is GateSignal.KL:
            protect = kl_divergence(p, q) > self.threshold
        else:
            protect = entropy(p) < self.threshold
        return protect.to(p.dtype)


class CascadeRuleVerifier(Rule):
    """Speculative cascades: lossless SD against the deferral target pi (Narasimhan et al. 2024)."""

    def __init__(self, rule: CascadeRule, alpha: float) -> None:
        self.rule = rule
        self.alpha = alpha

    def target(self, pos: Position) -> torch.Tensor:
        p, q = pos.p, pos.q
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
    if method is Method.GATE:
        return GateRule(config.gate, config.gate_threshold, config.ensemble_space, sampling)
    return CascadeRuleVerifier(config.cascade_rule, config.cascade_alpha)


def _row(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[b, index[b]] for x [B, L, ...]."""
    return x[torch.arange(x.shape[0], device=x.device), index]


def verify(
    rule: Rule, block: Block, sampling: Sampling, rng: RowRandom | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Accept a prefix of each row's drafts; return (accepted [B], the one extra token [B], the
    verification target v [B, L, V] it used, which trace mode records).

    The extra token is the correction after the first rejection, or a bonus token drawn from the
    target (never mixed) when every drafted token was kept. Each row consumes ``num_drafted``
    acceptance uniforms and then one for its extra token, whatever its batch-mates do.
    """
    length = block.tokens.shape[1]
    u = None if sampling.greedy else rng.uniform(1, torch.ones_like(block.num_drafted))
    if length == 0:  # nothing drafted in any row (autoregressive, or a one-token budget)
        extra = draw(block.p[:, 0], sampling, None if u is None else u[:, 0])
        return block.num_drafted, extra, block.p[:, :0]
    drafted = torch.arange(length, device=block.tokens.device) < block.num_drafted.unsqueeze(1)
    pos = Position(block.p[:, :-1], block.q, block.p_logits[:, :-1], block.q_logits, block.weights)
    v = rule.target(pos)
    if sampling.greedy:
        best = v.argmax(-1)
        keep = block.tokens == best
    else:
        acceptance = rng.uniform(length, block.num_drafted)
        keep = acceptance < rule.accept_prob(pos, v, block.tokens)
    accepted = (keep & drafted).long().cumprod(-1).sum(-1)
    bonus = accepted == block.num_drafted
    p_next = _row(block.p, accepted)
    at = accepted.clamp_max(length - 1)
    if sampling.greedy:
        return accepted, torch.where(bonus, p_next.argmax(-1), _row(best, at)), v
    here = Position(_row(pos.p, at), _row(pos.q, at), _row(pos.p_logits, at), _row(pos.q_logits, at))
    if pos.weights is not None:
        here.weights = _row(pos.weights, at)
    correction = rule.residual(here, _row(v, at))
    dist = torch.where(bonus.unsqueeze(-1), p_next, correction)
    return accepted, draw(dist, sampling, u[:, 0]), v
