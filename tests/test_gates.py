"""Choosing gate thresholds from recorded signals (diversed.evaluation.gates): closed forms and limits."""

from __future__ import annotations

import pytest

from diversed.evaluation.gates import block_acceptance, predicted_acceptance, threshold_for, threshold_table
from diversed.methods import GateSignal


def _record(stats, drafted=10, accepted=6):
    return {
        "token_weights": {"stats": stats, "class": ["other"] * len(stats)},
        "stats": {"drafted": drafted, "accepted": accepted},
    }


def test_block_acceptance_constant_keep_is_the_geometric_sum():
    a, k = 0.8, 4
    assert block_acceptance([[a] * 50], k) == pytest.approx(sum(a**j for j in range(1, k + 1)) / k)
    assert block_acceptance([[1.0] * 7], 3) == 1.0


def test_block_acceptance_sees_clustered_rejections():
    # the same mean keep, once alternating and once in runs: runs reject fewer blocks
    alternating = [[1.0, 0.0] * 20]
    clustered = [[1.0] * 20 + [0.0] * 20]
    assert block_acceptance(clustered, 4) > block_acceptance(alternating, 4)


def test_limits_of_each_gate_are_sd_and_static_w0():
    rows = [[(1.0, 0.3, 0.5), (1.0, 0.0, 2.0), (1.0, 0.6, 0.1), (1.0, 0.05, 3.0)]]
    sd = predicted_acceptance(rows, 2)  # the recorded run put w = 1 everywhere
    assert predicted_acceptance(rows, 2, GateSignal.TV, -1.0) == pytest.approx(sd)
    assert predicted_acceptance(rows, 2, GateSignal.TV, 1.0) == 1.0
    assert predicted_acceptance(rows, 2, GateSignal.ENTROPY, 100.0) == pytest.approx(sd)
    assert predicted_acceptance(rows, 2, GateSignal.ENTROPY, 0.0) == 1.0


def test_a_gate_keeps_one_minus_w_tv_per_position():
    rows = [[(1.0, 0.4, 0.2), (1.0, 0.1, 2.5)]]
    # tv gate at 0.2 protects the first position only: keep 0.6 and 1.0
    assert predicted_acceptance(rows, 1, GateSignal.TV, 0.2) == pytest.approx((0.6 + 1.0) / 2)
    # entropy gate at 1.0 protects where the target is sure (the first): the same here
    assert predicted_acceptance(rows, 1, GateSignal.ENTROPY, 1.0) == pytest.approx((0.6 + 1.0) / 2)
    # a wrongly signed entropy gate (protect where unsure) would keep 1.0 and 0.9 instead
    assert predicted_acceptance(rows, 1, GateSignal.ENTROPY, 1.0) != pytest.approx((1.0 + 0.9) / 2)


def test_threshold_for_reaches_the_wanted_acceptance_monotonically():
    rows = [[(1.0, tv / 100, 5 * tv / 100) for tv in range(100)]]
    for wanted in (0.7, 0.8, 0.9):
        tv = threshold_for(rows, GateSignal.TV, wanted, 4)
        assert abs(predicted_acceptance(rows, 4, GateSignal.TV, tv) - wanted) < 0.02
        entropy = threshold_for(rows, GateSignal.ENTROPY, wanted, 4)
        assert abs(predicted_acceptance(rows, 4, GateSignal.ENTROPY, entropy) - wanted) < 0.02
    higher = [threshold_for(rows, GateSignal.TV, a, 4) for a in (0.7, 0.9)]
    assert higher[0] < higher[1]  # a TV gate accepts more as it protects less


def test_threshold_table_needs_recorded_signals():
    with pytest.raises(ValueError, match="per-token signals"):
        threshold_table([{"stats": {"drafted": 1, "accepted": 1}}], [0.8], 4)
    table = threshold_table([_record([(1.0, 0.2, 1.0), None, (1.0, 0.5, 0.2)])], [0.8], 1)
    assert table["positions"] == 2 and table["recorded_measured"] == 0.6
    assert {row["gate"] for row in table["thresholds"]} == {"tv", "entropy"}
