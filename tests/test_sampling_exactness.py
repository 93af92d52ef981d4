"""Under sampling, SD must emit the target's distribution and the static ensemble its mixture v.

The first two emitted tokens of 20,000 seeded generations on an 8-token vocabulary are compared
with the exact distribution obtained by enumerating both positions, with Pearson's chi-square
test. Threshold: p-value > 1e-3 passes (seeds are fixed, so the outcome is deterministic); the
same test must reject a deliberately wrong rule with p-value < 1e-6. Generations run in batches
of four rows, each with its own seed. Batch 1 gives these very samples: the first 500 seeds are
decoded at batch 1 and must equal the batch-4 samples exactly, so the batch-4 tests are the batch-1
tests too (running them at batch 1 as well would cost minutes for the same counts).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from diversed import DecodeConfig, Decoder
from diversed.engine.rules import StandardRule

SAMPLES = 20_000
PROMPT = [1]
PASS_P = 1e-3
FAIL_P = 1e-6


def exact_two_token_distribution(target, draft, weight: float) -> np.ndarray:
    """P(x1, x2) when each position is drawn from v = w p + (1 - w) q, by enumeration."""
    with torch.no_grad():

        def mix(ids):
            p = target(torch.tensor([ids])).logits[0, -1].softmax(-1)
            q = draft(torch.tensor([ids])).logits[0, -1].softmax(-1)
            return weight * p + (1 - weight) * q

        first = mix(PROMPT)
        table = torch.stack([first[x] * mix([*PROMPT, x]) for x in range(first.shape[0])])
    return table.double().numpy()


def empirical_counts(decoder: Decoder, vocab: int, batch: int = 4) -> np.ndarray:
    counts = np.zeros((vocab, vocab))
    for first in range(0, SAMPLES, batch):
        seeds = list(range(first, first + batch))
        for generation in decoder.generate_batch([PROMPT] * batch, seeds=seeds):
            x1, x2 = generation.token_ids[:2]
            counts[x1, x2] += 1
    return counts


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs.ravel() / probs.sum() * counts.sum()
    observed = counts.ravel()
    big = expected >= 5  # pool sparse cells so the chi-square approximation holds
    observed = np.append(observed[big], observed[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    return float(chisquare(observed, expected).pvalue)


def make_decoder(pair, method: str, weight: float = 1.0) -> Decoder:
    # max_new_tokens = 3 so that the second token is always a verified draft or a correction,
    # never a bonus token of the one-token-left budget.
    cfg = DecodeConfig.from_dict(
        {
            "method": method,
            "target_weight": weight,
            "num_assistant_tokens": 2,
            "max_new_tokens": 3,
            "temperature": 1.0,
        }
    )
    return Decoder(pair[0], pair[1], cfg)


def test_batch_one_draws_the_same_samples(small_vocab_pair):
    for method in ("sd", "static"):
        decoder = make_decoder(small_vocab_pair, method, 0.3)
        singles = [decoder.generate(PROMPT, seed=seed).token_ids for seed in range(500)]
        batched = [
            g.token_ids
            for first in range(0, 500, 4)
            for g in decoder.generate_batch([PROMPT] * 4, seeds=range(first, first + 4))
        ]
        assert singles == batched


def test_sd_matches_target_distribution(small_vocab_pair):
    counts = empirical_counts(make_decoder(small_vocab_pair, "sd"), 8)
    assert chi_square_p(counts, exact_two_token_distribution(*small_vocab_pair, weight=1.0)) > PASS_P


@pytest.mark.parametrize("weight", [0.3, 0.7])
def test_static_ensemble_matches_mixture(small_vocab_pair, weight):
    decoder = make_decoder(small_vocab_pair, "static", weight)
    counts = empirical_counts(decoder, 8)
    probs = exact_two_token_distribution(*small_vocab_pair, weight=weight)
    assert chi_square_p(counts, probs) > PASS_P
    # and it is distinguishable from the target itself: the test has power here
    assert chi_square_p(counts, exact_two_token_distribution(*small_vocab_pair, weight=1.0)) < FAIL_P


class ResampleFromTarget(StandardRule):
    """A classic bug: on rejection draw from p instead of norm((p - q)+)."""

    def residual(self, pos, v):
        return pos.p


def test_chi_square_rejects_a_wrong_rule(small_vocab_pair):
    decoder = make_decoder(small_vocab_pair, "sd")
    decoder.rule = ResampleFromTarget()
    counts = empirical_counts(decoder, 8, batch=50)
    assert chi_square_p(counts, exact_two_token_distribution(*small_vocab_pair, weight=1.0)) < FAIL_P


def test_trace_mode_samples_the_mixture_at_every_position(small_vocab_pair):
    """Trace mode ends a fully kept block on its last draft instead of a bonus token from p, so with
    one draft per block the second token is often a block's first draft: it must still follow v."""
    cfg = DecodeConfig.from_dict(
        {
            "method": "static",
            "target_weight": 0.3,
            "num_assistant_tokens": 1,
            "max_new_tokens": 2,
            "temperature": 1.0,
        }
    )
    decoder = Decoder(small_vocab_pair[0], small_vocab_pair[1], cfg, traces=True)
    counts = empirical_counts(decoder, 8, batch=50)
    assert chi_square_p(counts, exact_two_token_distribution(*small_vocab_pair, weight=0.3)) > PASS_P
    bonus = Decoder(small_vocab_pair[0], small_vocab_pair[1], cfg)  # with a bonus token from p instead
    counts = empirical_counts(bonus, 8, batch=50)
    assert chi_square_p(counts, exact_two_token_distribution(*small_vocab_pair, weight=0.3)) < FAIL_P
