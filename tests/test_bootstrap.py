"""Bootstrap intervals: they cover the truth as often as they claim, pairing narrows them, and the
score and report files carry them."""

from __future__ import annotations

import numpy as np
import pytest

from diversed.evaluation import bootstrap


def example_rows(quality, accepted=None, drafted=None):
    n = len(quality)
    accepted = accepted if accepted is not None else [3] * n
    drafted = drafted if drafted is not None else [4] * n
    return [
        {
            "id": str(i),
            "quality": q,
            "accepted": a,
            "drafted": d,
            "blocks": 2,
            "batch_size": 1,
            "seconds": 1.0,
        }
        for i, (q, a, d) in enumerate(zip(quality, accepted, drafted, strict=True))
    ]


def coverage(level_resamples: int, trials: int = 200, n: int = 40, p: float = 0.6) -> float:
    """How often the interval of a pass rate over n Bernoulli(p) examples contains 100 p."""
    rng = np.random.default_rng(1)
    hits = 0
    for trial in range(trials):
        passed = (rng.random(n) < p) * 100.0
        cols = bootstrap.columns(example_rows(list(passed)))
        sums = {
            k: v[bootstrap.resamples(n, level_resamples, seed=trial)].sum(axis=1) for k, v in cols.items()
        }
        low, high = bootstrap.percentile_interval(bootstrap.FIGURES["quality"](sums))
        hits += low <= 100 * p <= high
    return hits / trials


def test_intervals_cover_the_true_rate_about_as_often_as_they_claim():
    # 200 simulated 40-example runs; the percentile bootstrap of a proportion runs a little
    # narrow at this n (expected coverage ~0.93). Tolerance: 0.85-0.99 (binomial sd ~0.017).
    assert 0.85 <= coverage(1000) <= 0.99


def test_a_wrong_interval_is_rejected_by_the_same_check(monkeypatch):
    # a 50% interval sold as 95% covers about half the time: the check above must fail it
    monkeypatch.setattr(bootstrap, "LEVEL", 0.5)
    monkeypatch.setattr(bootstrap.percentile_interval, "__defaults__", (0.5,))
    assert not 0.85 <= coverage(1000) <= 0.99


def test_ratio_figures_are_ratios_of_sums_and_their_intervals_bracket_them():
    rows = example_rows([100.0, 0.0, 100.0, 100.0], accepted=[4, 0, 2, 4], drafted=[4, 4, 4, 4])
    found = bootstrap.intervals(bootstrap.columns(rows))
    low, high = found["acceptance_rate_ci"]
    assert low <= 10 / 16 <= high and low >= 0 and high <= 1
    assert found["seconds_per_example_ci"] == [1.0, 1.0]  # every example took 1 s


def test_paired_differences_cancel_shared_difficulty():
    rng = np.random.default_rng(0)
    difficulty = rng.normal(50, 30, size=60)
    reference = example_rows(list(difficulty))
    mine = example_rows(list(difficulty + 2.0 + rng.normal(0, 1, size=60)))
    paired = bootstrap.paired_differences(bootstrap.columns(mine), bootstrap.columns(reference), ("quality",))
    low, high = paired["quality_ci"]
    assert low > 0 and high - low < 2  # the shift is found; an unpaired interval would span ~20 points
    same = bootstrap.paired_differences(bootstrap.columns(reference), bootstrap.columns(reference))
    assert same["quality"] == 0 and same["quality_ci"] == [0.0, 0.0]


def test_corpus_bleu_intervals_recompute_the_corpus_score():
    from sacrebleu import corpus_bleu
    from sacrebleu.metrics import BLEU

    hyps = ["the cat sat on the mat", "a dog ran", "it rains today", "we like tea"]
    refs = ["the cat sat on a mat", "the dog ran", "it is raining today", "we like tea"]
    stats = [list(r) for r in BLEU()._extract_corpus_statistics(hyps, [refs])]
    cols = bootstrap.columns(example_rows(stats))
    whole = {k: v[None, :].sum(axis=1) for k, v in cols.items()}
    assert bootstrap.corpus_bleu_quality(whole)[0] == pytest.approx(corpus_bleu(hyps, [refs]).score)
    low, high = bootstrap.intervals(cols, bootstrap.corpus_bleu_quality)["quality_ci"]
    assert low <= corpus_bleu(hyps, [refs]).score <= high


def test_above_the_curve_is_zero_on_the_curve_and_positive_above_it():
    rng = np.random.default_rng(0)
    n = 200

    def cols(accept_share, quality):
        drafted = np.full(n, 40.0)
        return {
            "accepted": np.round(drafted * accept_share),
            "drafted": drafted,
            "blocks": np.full(n, 10.0),
            "latency_seconds": np.zeros(n),
            "latency_count": np.zeros(n),
            "quality": quality.astype(float),
            "count": np.ones(n),
        }

    base = rng.random(n) < 0.4
    low, high = cols(0.7, base), cols(0.9, base & (rng.random(n) < 0.8))
    gap, interval = bootstrap.above_curve(low, low, high)  # a curve's own end point
    assert gap == 0.0 and interval == [0.0, 0.0]
    better = cols(0.8, base | (rng.random(n) < 0.3))  # between them in acceptance, higher quality
    gap, interval = bootstrap.above_curve(better, low, high)
    assert gap > 0 and interval[0] > 0


def test_speedup_is_a_paired_ratio_with_an_interval_and_absent_below_ten_batch_one_examples():
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(1, 10, size=30)  # shared: hard examples are slow for both
    auto = example_rows([1.0] * 30)
    fast = example_rows([1.0] * 30)
    for e, a, d in zip(fast, auto, difficulty, strict=True):
        a["seconds"], e["seconds"] = 2.0 * d, d * rng.uniform(0.9, 1.1)
    point, interval, n = bootstrap.paired_speedup(bootstrap.columns(auto), bootstrap.columns(fast))
    assert n == 30 and 1.9 < point < 2.1
    assert interval[0] < point < interval[1] and interval[1] - interval[0] < 0.2  # pairing cancels difficulty
    for e in fast[9:]:
        e["batch_size"] = 4  # only 9 examples at batch 1: no latency figure
    assert bootstrap.paired_speedup(bootstrap.columns(auto), bootstrap.columns(fast)) == (None, None, 9)
