"""Each verification rule hits its closed form."""

from __future__ import annotations

import pytest
import torch

from diversed import DecodeConfig, Decoder
from diversed.engine.rules import (
    Block,
    CascadeRuleVerifier,
    EnsembleRule,
    LossyRule,
    Position,
    StandardRule,
    total_variation,
    verify,
)
from diversed.engine.sampling import RowRandom, Sampling
from diversed.methods import CascadeRule, EnsembleSpace

SAMPLING = Sampling(temperature=1.0)


def random_pair(vocab: int = 50, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, vocab, generator=g) * 2
    p, q = logits.softmax(-1)
    return p, q


def every_token(p: torch.Tensor, q: torch.Tensor) -> Position:
    """One position per vocabulary entry, so accept_prob lists the acceptance of every possible draft."""
    vocab = p.shape[0]
    return Position(
        p=p.expand(vocab, vocab),
        q=q.expand(vocab, vocab),
        p_logits=p.log().expand(vocab, vocab),
        q_logits=q.log().expand(vocab, vocab),
    )


def accept_prob(rule, p, q) -> torch.Tensor:
    pos = every_token(p, q)
    return rule.accept_prob(pos, rule.target(pos), torch.arange(p.shape[0]))


def residual(rule, p, q) -> torch.Tensor:
    pos = every_token(p, q)
    return rule.residual(pos, rule.target(pos))


def expected_acceptance(rule, p, q) -> float:
    """E_{x ~ q}[accept(x)]: the per-token acceptance probability."""
    return float((q * accept_prob(rule, p, q)).sum())


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("weight", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_static_acceptance_is_one_minus_w_tv(seed, weight):
    p, q = random_pair(seed=seed)
    rule = EnsembleRule(weight, EnsembleSpace.PROBS, SAMPLING)
    assert expected_acceptance(rule, p, q) == pytest.approx(
        1 - weight * float(total_variation(p, q)), abs=1e-5
    )


def test_sd_acceptance_is_one_minus_tv():
    p, q = random_pair(seed=4)
    assert expected_acceptance(StandardRule(), p, q) == pytest.approx(
        1 - float(total_variation(p, q)), abs=1e-5
    )


@pytest.mark.parametrize("lenience", [0.2, 0.5, 1.0])
def test_lossy_acceptance_is_sum_of_min_q_p_over_l(lenience):
    p, q = random_pair(seed=5)
    expected = float(torch.minimum(q, p / lenience).sum())
    assert expected_acceptance(LossyRule(lenience), p, q) == pytest.approx(expected, abs=1e-5)


def test_lossy_with_lenience_one_is_sd():
    p, q = random_pair(seed=6)
    assert torch.allclose(accept_prob(LossyRule(1.0), p, q), accept_prob(StandardRule(), p, q))
    assert torch.allclose(residual(LossyRule(1.0), p, q), residual(StandardRule(), p, q))


@pytest.mark.parametrize("weight", [0.1, 0.5, 1.0])
def test_static_residual_is_independent_of_weight(weight):
    p, q = random_pair(seed=7)
    got = residual(EnsembleRule(weight, EnsembleSpace.PROBS, SAMPLING), p, q)[0]
    expected = (p - q).clamp_min(0)
    assert torch.allclose(got, expected / expected.sum(), atol=1e-6)


def test_monte_carlo_acceptance_through_verify():
    """verify() draws accept/reject with the stated probability: 20,000 rows of one batched
    call, 4-sigma band; the corrections follow the residual (chi-square, p > 1e-3)."""
    from scipy.stats import chisquare

    p, q = random_pair(vocab=20, seed=8)
    weight = 0.6
    rule = EnsembleRule(weight, EnsembleSpace.PROBS, SAMPLING)
    draws = 20_000
    x = torch.multinomial(q, draws, replacement=True, generator=torch.Generator().manual_seed(0))
    block = Block(
        tokens=x.unsqueeze(1),
        num_drafted=torch.ones(draws, dtype=torch.long),
        p=p.expand(draws, 2, -1),
        q=q.expand(draws, 1, -1),
        p_logits=p.log().expand(draws, 2, -1),
        q_logits=q.log().expand(draws, 1, -1),
    )
    accepted, extra, _ = verify(rule, block, SAMPLING, RowRandom(list(range(draws))))
    beta = 1 - weight * float(total_variation(p, q))
    sigma = (beta * (1 - beta) / draws) ** 0.5
    assert abs(float(accepted.double().mean()) - beta) < 4 * sigma
    corrections = extra[accepted == 0]
    expected = (p - q).clamp_min(0).double()
    expected = expected / expected.sum() * corrections.numel()
    observed = torch.bincount(corrections, minlength=20).double()
    assert float(observed[expected == 0].sum()) == 0  # never a token the residual excludes
    big = expected >= 5  # the residual's zeros hold nothing, checked above; the rest are large cells
    assert float(expected[(expected > 0) & ~big].sum()) == 0
    observed, expected = observed[big], expected[big]
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3


def test_weight_zero_accepts_every_draft_in_the_loop(pair, tokenizer):
    cfg = DecodeConfig.from_dict(
        {
            "method": "static",
            "target_weight": 0.0,
            "temperature": 1.0,
            "num_assistant_tokens": 4,
            "max_new_tokens": 40,
        }
    )
    stats = Decoder(*pair, cfg).generate(tokenizer("abc").input_ids).stats
    assert stats.drafted > 0
    assert stats.acceptance_rate == 1.0
    cfg_sd = DecodeConfig.from_dict(
        {"method": "sd", "temperature": 1.0, "num_assistant_tokens": 4, "max_new_tokens": 40}
    )
    assert Decoder(*pair, cfg_sd).generate(tokenizer("abc").input_ids).stats.acceptance_rate < 1.0


def test_logit_space_mixture_is_geometric():
    p, q = random_pair(seed=9)
    rule = EnsembleRule(0.3, EnsembleSpace.LOGITS, SAMPLING)
    v = rule.target(every_token(p, q))[0]
    expected = (0.3 * p.log() + 0.7 * q.log()).softmax(-1)
    assert torch.allclose(v, expected, atol=1e-6)


def cascade_target(rule: CascadeRule, alpha: float, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return CascadeRuleVerifier(rule, alpha).target(every_token(p, q))[0]


def test_cascade_deferral_rules():
    p, q = random_pair(seed=10)
    max_p, max_q, tv = float(p.max()), float(q.max()), float(total_variation(p, q))
    for rule, alpha, defers in [
        (CascadeRule.CHOW, 1.0 - max_q - 1e-3, True),
        (CascadeRule.CHOW, 1.0 - max_q + 1e-3, False),
        (CascadeRule.DIFF, max_p - max_q + 1e-3, False),
        (CascadeRule.DIFF, max_p - max_q - 1e-3, True),
        (CascadeRule.OPT, (max_p - max_q) / tv - 1e-3, True),
        (CascadeRule.OPT, (max_p - max_q) / tv + 1e-3, False),
    ]:
        expected = p if defers else q
        assert torch.allclose(cascade_target(rule, alpha, p, q), expected), (rule, alpha)


def test_token_cascade_target():
    p, q = random_pair(seed=11)
    alpha = 0.5
    pi = cascade_target(CascadeRule.TOKEN, alpha, p, q)
    keep = p >= (1 - alpha) * p.max()
    assert torch.allclose(pi[keep], q[keep] + q[~keep].sum() * p[keep])
    assert torch.allclose(pi[~keep], q[~keep].sum() * p[~keep])
    assert float(pi.sum()) == pytest.approx(1.0, abs=1e-6)
