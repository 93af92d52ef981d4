"""The frontier comparators without the envelope's selection bias (issue 49): the cross-fitted gap
and the gap against preregistered fixed vertices hit known answers on synthetic curves, and on
simulated studies with a known truth the cross-fitted 95% interval covers it and does not call a
rule on the frontier above it more often than nominal (the full grid: benchmarks/frontier_coverage.py)."""

from __future__ import annotations

import numpy as np
import pytest

from diversed.evaluation import frontier
from diversed.evaluation.simulate import CURVES, Case, coverage


def exact(points: list[tuple[float, float]], n: int = 100) -> list[dict[str, np.ndarray]]:
    """Settings whose every example scores its point exactly: any subset of examples gives the same
    point, so every estimate must be the true gap itself."""
    return [
        {
            "accepted": np.full(n, 100.0 * a),
            "drafted": np.full(n, 100.0),
            "quality": np.full(n, q),
            "count": np.ones(n),
        }
        for a, q in points
    ]


@pytest.mark.parametrize("curve", sorted(CURVES))
@pytest.mark.parametrize("delta", [-6.0, 0.0, 4.0])
def test_the_crossfitted_gap_is_the_true_gap_where_the_points_are_exact(curve, delta):
    case = Case(curve, delta, 100)
    mine, *statics = exact([(case.rule_acceptance, case.rule_quality()), *CURVES[curve]])
    found = frontier.crossfit_above_frontier(mine, statics, resamples=50)
    assert found["gap"] == pytest.approx(delta, abs=1e-9)
    assert found["gap_ci"] == pytest.approx([delta, delta], abs=1e-9)
    assert frontier.above_frontier(mine, statics, resamples=50)["gap"] == pytest.approx(delta, abs=1e-9)


def test_fixed_vertices_give_their_own_chord_not_the_envelope():
    """A preregistered chord through sd and w = 0 alone: an inner point above it does not count."""
    points = CURVES["non-monotone"]  # w 0.150 at (0.931, 18) lies 0.13 above the sd-w0 chord
    mine, *statics = exact([(0.9, 20.0), *points])
    sd, w0 = statics[0], statics[-1]
    chord = points[0][1] + (0.9 - points[0][0]) / (points[-1][0] - points[0][0]) * (
        points[-1][1] - points[0][1]
    )
    found = frontier.above_fixed_chord(mine, [w0, sd], resamples=50)  # any order: sorted by acceptance
    assert found["gap"] == pytest.approx(20.0 - chord, abs=1e-9)
    outside = frontier.above_fixed_chord(exact([(0.5, 30.0)])[0], [sd, w0], resamples=50)
    assert outside["gap"] is None and "outside" in outside["outside"]


def test_crossfitted_intervals_cover_the_truth_and_call_a_rule_on_the_frontier_above_rarely():
    """The fast version of the committed simulation: the verdict's own GSM8K curve, a rule exactly on
    its frontier, n = 200, 200 studies (fixed seed, so the figures are what they are every run)."""
    found = coverage(Case("non-monotone", 0.0, 200), 200, seed=3, resamples=200)
    crossfit, envelope = found["cross-fitted (percentile)"], found["envelope (percentile)"]
    assert crossfit["coverage"] >= 0.93, found
    assert crossfit["called_above"] <= 0.025, found  # a two-sided 95% interval's one side
    assert (
        envelope["bias"] < 0 < crossfit["bias"]
    )  # the envelope errs against the rule, cross-fitting towards it


def test_the_preregistered_test_says_its_sentence_for_each_outcome():
    """Score files whose examples all score their point: a rule 6 above the fixed chord is above, 6
    below is below, and one on it with no spread is neither (no power figure from no noise)."""
    from diversed.evaluation.confirm import confirm

    def score(acceptance: float, quality: float) -> dict:
        rows = [
            {
                "id": str(i),
                "quality": quality,
                "accepted": 100 * acceptance,
                "drafted": 100,
                "blocks": 25,
                "batch_size": 8,
                "seconds": 1.0,
            }
            for i in range(50)
        ]
        return {"per_example": rows}

    vertices = [score(0.64, 32.0), score(0.93, 18.0), score(1.0, 14.5)]
    on_chord = 32.0 + (0.8 - 0.64) / (0.93 - 0.64) * (18.0 - 32.0)
    second = 18.0 + (0.95 - 0.93) / (1.0 - 0.93) * (14.5 - 18.0)  # on the chord's second segment
    rules = {"up": score(0.8, on_chord + 6), "down": score(0.8, on_chord - 6), "on": score(0.95, second)}
    found = {r["rule"]: r for r in confirm(rules, vertices, resamples=200)}
    assert found["up"]["outcome"] == "above" and found["up"]["gap"] == pytest.approx(6.0)
    assert found["down"]["outcome"] == "below" and "by 6.0 points" in found["down"]["sentence"]
    assert found["up"]["level"] == pytest.approx(1 - 0.05 / 3)
    assert found["on"]["outcome"] == "neither" and found["on"]["gap"] == pytest.approx(0.0, abs=1e-9)
