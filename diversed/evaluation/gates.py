"""Choosing a training-free gate's thresholds before decoding a sweep with them.

A gate (method ``gate``) sets w = 1 or 0 per position by a threshold on TV(p, q), KL or the target's
entropy; a study sweeps its threshold the way static is swept over w, and wants thresholds that
span an acceptance range rather than guesses. One decode that records the signals (any ``gate``
or ``diversed`` run: its records carry w, TV and H(p) per verified token) gives them: at a position
with weight w a drafted token is kept with probability 1 - w TV(p, q), so replaying a threshold's w
over the recorded positions predicts its acceptance without decoding again.

The prediction is off-policy (the positions are the recorded run's, not the gated run's) and
models a block of k drafts as k consecutive recorded positions: the expected accepted drafts per
block, sum over j of the mean over starts of prod_{i<j} (1 - w TV), over k. It is printed beside
the recorded run's own measured acceptance, predicted the same way, so its error is in sight. Run
the recording on a train split: thresholds chosen on the test split would be chosen on the data
they are judged on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from diversed.methods import GateSignal

SIGNALS = (GateSignal.TV, GateSignal.ENTROPY)
"""The signals a decode record carries per token (TOKEN_STATS: w, TV, entropy); KL is not recorded."""


def recorded_positions(records: Iterable[dict[str, Any]]) -> list[list[tuple[float, float, float]]]:
    """Per record, the (w, TV, entropy) of each verified position in order (bonus tokens, drawn
    from the target alone, have none and are skipped)."""
    rows = []
    for record in records:
        tokens = record.get("token_weights")
        if tokens:
            rows.append([tuple(stats) for stats in tokens["stats"] if stats is not None])
    if not rows:
        raise ValueError("no record carries per-token signals (decode with method gate or diversed)")
    return rows


def gate_weight(signal: GateSignal, threshold: float, tv: float, entropy: float) -> float:
    """The gate's w at one position, as :class:`diversed.engine.rules.GateRule` sets it."""
    if signal is GateSignal.TV:
        return float(tv > threshold)
    if signal is GateSignal.ENTROPY:
        return float(entropy < threshold)
    raise ValueError(f"decode records carry TV and entropy, not {signal.value}")


def block_acceptance(keep: Sequence[Sequence[float]], k: int) -> float:
    """Expected accepted / drafted for blocks of ``k`` drafts over rows of per-position keep
    probabilities (module docstring): sum_j mean_t prod_{i<j} keep[t + i], over k."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    expected = 0.0
    for j in range(1, k + 1):
        products = [math.prod(row[t : t + j]) for row in keep for t in range(len(row) - j + 1)]
        expected += sum(products) / len(products) if products else 0.0
    return expected / k


def predicted_acceptance(
    rows: Sequence[Sequence[tuple[float, float, float]]],
    k: int,
    signal: GateSignal | None = None,
    threshold: float = 0.0,
) -> float:
    """The acceptance a gate at ``threshold`` would have on the recorded positions (``signal``
    None: the recorded run's own weights)."""
    keep = [
        [
            1.0 - (w if signal is None else gate_weight(signal, threshold, tv, entropy)) * tv
            for w, tv, entropy in row
        ]
        for row in rows
    ]
    return block_acceptance(keep, k)


def threshold_for(
    rows: Sequence[Sequence[tuple[float, float, float]]], signal: GateSignal, acceptance: float, k: int
) -> float | None:
    """The threshold whose predicted acceptance is closest to ``acceptance``, searched over the
    recorded values of the signal (None when the recording has no positions)."""
    index = 1 if signal is GateSignal.TV else 2
    candidates = sorted({round(position[index], 3) for row in rows for position in row})
    if not candidates:
        return None
    # acceptance is monotone in the threshold (rising for TV, falling for entropy): bisect
    low, high = 0, len(candidates) - 1
    rising = signal is GateSignal.TV
    while low < high:
        middle = (low + high) // 2
        above = predicted_acceptance(rows, k, signal, candidates[middle]) >= acceptance
        if above == rising:
            high = middle
        else:
            low = middle + 1
    return candidates[low]


def threshold_table(
    records: Iterable[dict[str, Any]], acceptances: Sequence[float], k: int
) -> dict[str, Any]:
    """For each recorded signal and each wanted acceptance: the threshold and its predicted
    acceptance; plus the recording's measured and predicted acceptance, the check on the model."""
    records = list(records)
    rows = recorded_positions(records)
    drafted = sum(r["stats"]["drafted"] for r in records if r.get("stats"))
    accepted = sum(r["stats"]["accepted"] for r in records if r.get("stats"))
    table = []
    for signal in SIGNALS:
        for wanted in acceptances:
            threshold = threshold_for(rows, signal, wanted, k)
            table.append(
                {
                    "gate": signal.value,
                    "wanted": wanted,
                    "threshold": threshold,
                    "predicted": predicted_acceptance(rows, k, signal, threshold),
                }
            )
    return {
        "positions": sum(len(row) for row in rows),
        "examples": len(rows),
        "recorded_measured": accepted / drafted if drafted else None,
        "recorded_predicted": predicted_acceptance(rows, k),
        "thresholds": table,
    }
