"""Training-free per-token rules (method ``gate``): their closed form, their limits, and a gate of
the wrong sign caught by the same check.

A gate sets w = 1 or 0 at each position and verifies against v = w p + (1 - w) q, so a drafted
token is kept with probability sum_x min(q, v) = 1 - w TV(p, q). tv and kl protect where the
models disagree; entropy relaxes where the target is unsure. At their thresholds' ends they are
``sd`` and static w = 0, token for token (fp32, greedy and sampled).
"""

from __future__ import annotations

import pytest
import torch

from diversed import DecodeConfig, Decoder
from diversed.engine.rules import GateRule, Position, entropy, kl_divergence, make_rule, total_variation
from diversed.engine.sampling import Sampling
from diversed.methods import EnsembleSpace, GateSignal

PROMPTS = ["def f(x):\n    return", "a", "The quick brown fox jumps over"]
SEEDS = [11, 12, 13]


def positions(seed: int = 0) -> Position:
    """Distributions over a vocabulary of 50 at 4 x 6 positions, some near each other, some apart."""
    generator = torch.Generator().manual_seed(seed)
    z_p = torch.randn(4, 6, 50, generator=generator) * 3
    z_q = z_p + torch.randn(4, 6, 50, generator=generator) * torch.linspace(0.05, 3, 6)[:, None]
    return Position(z_p.softmax(-1), z_q.softmax(-1), z_p, z_q)


def check_gate(rule: GateRule, pos: Position) -> None:
    """What a gate must do: w from its own definition, and the closed-form acceptance."""
    p, q = pos.p, pos.q
    signal = {GateSignal.TV: total_variation, GateSignal.KL: kl_divergence}.get(rule.signal)
    expected = (signal(p, q) > rule.threshold) if signal else (entropy(p) < rule.threshold)
    w = rule.weights(p, q)
    assert torch.equal(w, expected.to(w.dtype)), "w is not the gate's definition"
    v = rule.target(Position(p, q, pos.p_logits, pos.q_logits, w))
    acceptance = torch.minimum(q, v).sum(-1)
    assert torch.allclose(acceptance, 1 - w * total_variation(p, q), atol=1e-6)


@pytest.mark.parametrize(
    ("signal", "threshold"), [(GateSignal.TV, 0.3), (GateSignal.KL, 0.5), (GateSignal.ENTROPY, 2.0)]
)
def test_each_gate_keeps_a_draft_with_probability_one_minus_w_tv(signal, threshold):
    pos = positions()
    rule = GateRule(signal, threshold, EnsembleSpace.PROBS, Sampling(1.0))
    check_gate(rule, pos)
    w = rule.weights(pos.p, pos.q)
    assert 0 < float(w.mean()) < 1  # both sides of the gate occur here: the test is not vacuous


class WrongSign(GateRule):
    """Protects where the models agree: the mistake the check must catch."""

    def weights(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return 1 - super().weights(p, q)


def test_a_gate_of_the_wrong_sign_fails_the_same_check():
    rule = WrongSign(GateSignal.TV, 0.3, EnsembleSpace.PROBS, Sampling(1.0))
    with pytest.raises(AssertionError, match="gate's definition"):
        check_gate(rule, positions())


def decode(pair, tokenizer, settings: dict, temperature: float):
    config = DecodeConfig.from_dict({**settings, "temperature": temperature, "num_assistant_tokens": 4})
    decoder = Decoder(pair[0], pair[1], config, eos_token_ids=[])
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    return decoder.generate_batch(prompts, [20, 12, 16], SEEDS)


def same(a, b) -> bool:
    keys = ("accepted", "drafted", "blocks")
    return [g.token_ids for g in a] == [g.token_ids for g in b] and all(
        [getattr(x.stats, k) for k in keys] == [getattr(y.stats, k) for k in keys]
        for x, y in zip(a, b, strict=True)
    )


LIMITS = [
    ({"gate": "tv", "gate_threshold": 0.0}, {"method": "sd"}),
    ({"gate": "tv", "gate_threshold": 1.0}, {"method": "static", "target_weight": 0.0}),
    ({"gate": "kl", "gate_threshold": 0.0}, {"method": "sd"}),
    ({"gate": "kl", "gate_threshold": 1e9}, {"method": "static", "target_weight": 0.0}),
    ({"gate": "entropy", "gate_threshold": 0.0}, {"method": "static", "target_weight": 0.0}),
    ({"gate": "entropy", "gate_threshold": 100.0}, {"method": "sd"}),
]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(("gate", "equal_to"), LIMITS, ids=lambda s: "-".join(map(str, s.values())))
def test_the_thresholds_ends_are_sd_and_static_w0_token_for_token(
    pair, tokenizer, gate, equal_to, temperature
):
    assert same(
        decode(pair, tokenizer, {"method": "gate", **gate}, temperature),
        decode(pair, tokenizer, equal_to, temperature),
    )


def test_a_gate_between_the_ends_is_neither(pair, tokenizer):
    """Not vacuous: the pair is one whose sd and static w = 0 differ, and a middle gate is a third."""
    sd = decode(pair, tokenizer, {"method": "sd"}, 1.0)
    w0 = decode(pair, tokenizer, {"method": "static", "target_weight": 0.0}, 1.0)
    middle = decode(pair, tokenizer, {"method": "gate", "gate": "tv", "gate_threshold": 0.5}, 1.0)
    assert not same(sd, w0) and not same(middle, sd) and not same(middle, w0)
    w = [s[0] for g in middle for s in g.token_stats if s is not None]
    assert set(w) == {0.0, 1.0}  # each token records the gate's w, as DIVERSED's records its head's


def test_the_grid_names_a_gate_by_its_signal_and_threshold():
    from diversed.pipeline.grid import expand

    names = expand(
        [{"method": "gate", "gate": ["tv", "entropy"], "gate_threshold": [0.1, 2]}], [4], [1.0], {}
    )
    assert sorted(names) == [
        "gate-entropy-t0.1-k4-T1",
        "gate-entropy-t2-k4-T1",
        "gate-tv-t0.1-k4-T1",
        "gate-tv-t2-k4-T1",
    ]
    assert isinstance(make_rule(DecodeConfig.from_dict(names["gate-tv-t2-k4-T1"])), GateRule)
