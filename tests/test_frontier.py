"""The static frontier on synthetic static curves whose envelope is known by hand: concave, convex,
not monotone, and a setting outside the static acceptance range."""

from __future__ import annotations

import numpy as np
import pytest

from diversed.evaluation.frontier import POWER_FACTOR, above_frontier, envelope_at, familywise, hull

CONVEX = ([0.6, 0.7, 0.8, 0.9], [36.0, 20.0, 20.0, 17.5])  # the natural pair's GSM8K shape
CONCAVE = ([0.6, 0.8, 0.9], [30.0, 29.0, 20.0])
NOT_MONOTONE = ([0.6, 0.7, 0.8, 0.9], [30.0, 10.0, 28.0, 5.0])


def at(points, x):
    acceptance, quality = (np.array(v) for v in points)
    return float(envelope_at(acceptance, quality, np.array(x)))


def test_a_convex_curve_is_bridged_by_its_end_points():
    # the chord from (0.6, 36) to (0.9, 17.5), not the neighbour line's 20
    assert at(CONVEX, 0.78) == pytest.approx(36 - 0.6 * 18.5)
    assert at(CONVEX, 0.6) == 36.0 and at(CONVEX, 0.9) == 17.5


def test_a_concave_curve_is_its_own_envelope():
    assert at(CONCAVE, 0.7) == pytest.approx(29.5)
    assert at(CONCAVE, 0.85) == pytest.approx(24.5)


def test_a_dip_in_a_curve_that_is_not_monotone_is_jumped_over():
    assert at(NOT_MONOTONE, 0.7) == pytest.approx(29.0)  # the mix of w at 0.6 and 0.8, not the dip's 10
    assert at(NOT_MONOTONE, 0.85) == pytest.approx(16.5)


def test_outside_the_static_range_there_is_no_number():
    assert np.isnan(at(CONVEX, 0.95)) and np.isnan(at(CONVEX, 0.5))


def test_the_envelope_is_solved_per_resample():
    acceptance = np.array([CONVEX[0], CONCAVE[0] + [0.9]])
    quality = np.array([CONVEX[1], CONCAVE[1] + [20.0]])
    found = envelope_at(acceptance, quality, np.array([0.78, 0.7]))
    assert found == pytest.approx([36 - 0.6 * 18.5, 29.5])


def cell(acceptance: float, quality: float, n: int = 200) -> dict[str, np.ndarray]:
    """Per-example columns of a setting with exactly this acceptance (10 drafted per example) and
    quality (a share of examples scored 100)."""
    accepted = np.full(n, acceptance * 10)
    scores = np.zeros(n)
    scores[: round(quality / 100 * n)] = 100.0
    return {
        "accepted": accepted,
        "drafted": np.full(n, 10.0),
        "blocks": np.full(n, 3.0),
        "latency_seconds": np.zeros(n),
        "latency_count": np.zeros(n),
        "quality": scores,
        "count": np.ones(n),
    }


def test_the_gap_against_the_frontier_with_its_interval_and_power():
    statics = [cell(a, q) for a, q in zip(*CONVEX, strict=True)]
    found = above_frontier(cell(0.78, 30.0), statics)
    assert found["gap"] == pytest.approx(30.0 - (36 - 0.6 * 18.5))  # +5.1; the neighbour line says +10
    low, high = found["gap_ci"]
    assert low < found["gap"] < high
    # with binary outcomes the gap's standard error is near sqrt of the summed variances / n
    assert found["effect_80"] == pytest.approx(POWER_FACTOR * (high - low) / (2 * 1.96), rel=0.15)
    assert found["range"] == [0.6, 0.9]


def test_a_setting_outside_the_static_range_gets_no_gap():
    statics = [cell(a, q) for a, q in zip(*CONVEX, strict=True)]
    found = above_frontier(cell(0.95, 40.0), statics)
    assert found["gap"] is None and found["gap_ci"] is None
    assert found["outside"] == "acceptance 0.950 outside the static range [0.600, 0.900]"


def test_the_plotted_frontier_keeps_only_the_envelopes_vertices():
    assert hull(list(zip(*CONVEX, strict=True))) == [(0.6, 36.0), (0.9, 17.5)]
    assert hull(list(zip(*CONCAVE, strict=True))) == list(zip(*CONCAVE, strict=True))
    assert hull(list(zip(*NOT_MONOTONE, strict=True))) == [(0.6, 30.0), (0.8, 28.0), (0.9, 5.0)]


def test_familywise_intervals_hold_together_where_single_ones_do_not():
    """Nine independent rules with true gap 0 and unit standard errors, 20,000 studies: the
    Bonferroni intervals cover all nine at once in (1 - 0.05/9)^9 = 95.0% of studies (its bound is
    tight for independent rules); nine single 95% intervals only in 0.95^9 = 63%."""
    estimates = np.random.default_rng(0).normal(size=(20_000, 9))
    found = [{"gap": 0.0, "gap_ci": [-1.959964, 1.959964]} for _ in range(8)]
    found.append({"gap": None, "gap_ci": None, "outside": "acceptance 0.950 outside"})
    familywise(found)
    assert "family" not in found[-1]  # a rule outside the static range is not judged
    assert found[0]["family"] == 8 and found[0]["gap_ci_familywise"] == pytest.approx(
        [-2.7344, 2.7344], abs=1e-4
    )
    z = {m: familywise_z(m) for m in (1, 9)}
    assert z[1] == pytest.approx(1.959964, abs=1e-5)
    covered = {m: np.mean(np.all(np.abs(estimates) <= z[m], axis=1)) for m in z}
    assert covered[9] == pytest.approx(0.95, abs=0.005) and covered[1] == pytest.approx(0.95**9, abs=0.02)


def test_a_familywise_interval_keeps_the_skew_of_its_bootstrap_interval():
    found = [{"gap": 1.0, "gap_ci": [-3.0, 2.0]}, {"gap": 0.0, "gap_ci": [-1.0, 1.0]}]
    familywise(found)
    stretch = 2.241403 / 1.959964  # z_(1 - 0.025/2) / z_0.975
    assert found[0]["gap_ci_familywise"] == pytest.approx([1 - 4 * stretch, 1 + stretch], abs=1e-5)


def familywise_z(m: int) -> float:
    """The half-width that familywise gives each of m rules whose single 95% interval is +-1.96."""
    found = [{"gap": 0.0, "gap_ci": [-1.959964, 1.959964]} for _ in range(m)]
    familywise(found)
    return found[0]["gap_ci_familywise"][1]


def test_a_setting_on_a_static_point_example_by_example_has_no_power_figure():
    """A head that collapsed onto w = 0 decodes what w = 0 decodes: the gap is 0 in every resample,
    and "detects an effect of 0 with 80% power" would be false; there is no figure."""
    from diversed.evaluation.tables import effect_80

    statics = [cell(a, q) for a, q in zip(*CONVEX, strict=True)]
    found = above_frontier(cell(0.9, 17.5), statics)
    assert found["gap"] == 0.0 and found["gap_ci"] == [0.0, 0.0] and found["effect_80"] is None
    assert effect_80([0.0, 0.0]) == "--" and effect_80([-1.0, 1.0]) == "1.43"
