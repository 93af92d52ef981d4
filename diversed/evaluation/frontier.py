"""The static frontier: the fair comparator of any relaxed verification rule.

Each static weight w gives one point (acceptance, quality) on a set of examples; ``sd`` is w = 1
and w = 0 takes the draft's distribution. A user can run w1 on a share of the examples and w2 on
the rest, and so reach every point on the segment between two static points. What static weights
can achieve is therefore the **upper concave envelope** of the points, not the polyline through
neighbouring weights: where the static curve is convex (GSM8K on the natural pair: 36, 20, 20, 17.5
at w = 1, 0.75, 0.5, 0.25) the envelope lies well above that line. A rule (a learned head, a
training-free gate) beats static only if it lies above the envelope at its own acceptance.

The gap's interval comes from a paired bootstrap that resamples the examples once for all settings
and rebuilds the envelope in every resample. A setting whose acceptance lies outside the static
points' range gets no number (an envelope is not extrapolated). Beside each interval goes the
smallest effect the comparison detects with 80% power at a two-sided 5% level:
(z_0.975 + z_0.8) x the bootstrap standard error, about 1.43 half-widths.

A study asks the question of several rules at once (six gates and three heads in
``config/verdict.yaml``): one of them lying above the frontier at 95% is then weak evidence.
:func:`familywise` widens each rule's interval so that all m rules of a cell hold together at 95%
(Bonferroni): each side of the percentile interval is stretched about the point by
z_(1 - 0.025/m) / z_0.975, which keeps its skew (2,000 resamples leave too few in a 0.3% tail to
read a percentile there) and never makes it narrower than the single interval.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from diversed.evaluation import bootstrap

POWER_FACTOR = 1.959964 + 0.841621  # z_0.975 + z_0.80


def envelope_at(acceptance: np.ndarray, quality: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The upper concave envelope of points (acceptance[..., i], quality[..., i]) evaluated at
    x[...]; NaN where x lies outside the points' acceptance range. Leading dimensions are
    independent problems (bootstrap resamples). In one dimension a point of the hull at x is a
    mix of at most two points whose acceptances bracket x, so the envelope is the best such mix."""
    a_i, a_j = acceptance[..., :, None], acceptance[..., None, :]
    q_i, q_j = quality[..., :, None], quality[..., None, :]
    x = x[..., None, None]
    brackets = (a_i <= x) & (x <= a_j)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(a_j > a_i, (x - a_i) / (a_j - a_i), 0.0)
    mixed = np.where(brackets, q_i + t * (q_j - q_i), -np.inf)
    best = mixed.max(axis=(-2, -1))
    return np.where(np.isfinite(best), best, np.nan)


def hull(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The vertices of the upper concave envelope of (acceptance, quality) points, by acceptance
    (Andrew's monotone chain, upper half): what the plots draw."""
    upper: list[tuple[float, float]] = []
    for x, y in sorted(set(points)):
        while len(upper) >= 2:
            (x1, y1), (x2, y2) = upper[-2], upper[-1]
            if (x2 - x1) * (y - y1) - (y2 - y1) * (x - x1) >= 0:  # the middle point lies on or below
                upper.pop()
            else:
                break
        upper.append((x, y))
    return upper


def standard_error(spread: np.ndarray) -> float | None:
    """The standard deviation of a bootstrap distribution's finite values; None from fewer than 2,
    or when every resample gives the same gap (a setting that sits on a static point example by
    example: no spread, so no power figure rather than a detectable effect of 0)."""
    finite = spread[np.isfinite(spread)]
    se = float(finite.std(ddof=1)) if finite.size > 1 else 0.0
    return se if se > 0 else None


def above_frontier(
    mine: dict[str, np.ndarray],
    statics: Sequence[dict[str, np.ndarray]],
    corpus_quality: Callable | None = None,
    seed: int = bootstrap.SEED,
) -> dict[str, Any]:
    """Quality of ``mine`` minus the static frontier at its acceptance, with a paired 95% interval
    and the 80%-power effect; all are columns of the same examples in the same order. ``gap`` is
    None (and ``outside`` says why) when ``mine`` lies outside the static acceptance range."""
    index = bootstrap.resamples(len(mine["count"]), seed=seed)
    full = np.arange(len(mine["count"]))[None, :]
    quality = corpus_quality or bootstrap.FIGURES["quality"]
    accept = bootstrap.FIGURES["acceptance_rate"]

    def gap(sample: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sums = [bootstrap._sums(cols, sample) for cols in (mine, *statics)]
        a = np.stack([accept(s) for s in sums], axis=-1)
        q = np.stack([quality(s) for s in sums], axis=-1)
        return q[..., 0] - envelope_at(a[..., 1:], q[..., 1:], a[..., 0]), a, q

    point, a, q = gap(full)
    low, high = float(np.nanmin(a[0, 1:])), float(np.nanmax(a[0, 1:]))
    if not np.isfinite(point[0]):
        return {
            "gap": None,
            "gap_ci": None,
            "effect_80": None,
            "outside": f"acceptance {a[0, 0]:.3f} outside the static range [{low:.3f}, {high:.3f}]",
        }
    spread, _, _ = gap(index)
    se = standard_error(spread)
    return {
        "quality": float(q[0, 0]),  # over the examples every setting decoded, as the gap
        "acceptance": float(a[0, 0]),
        "frontier": float(q[0, 0] - point[0]),
        "gap": float(point[0]),
        "gap_ci": bootstrap.percentile_interval(spread),
        "effect_80": None if se is None else POWER_FACTOR * se,  # 80% power, two-sided 5%
        "outside_share": float(np.mean(~np.isfinite(spread))),  # resamples whose acceptance fell outside
        "range": [low, high],
    }


def familywise(found: Sequence[dict[str, Any]], level: float = bootstrap.LEVEL) -> None:
    """Give each comparison of one family (the rules judged against the same frontier) a
    ``gap_ci_familywise`` interval, its ``level`` interval's sides stretched about the gap by
    z_(1 - (1 - level) / 2m) / z_(1 - (1 - level) / 2), so that the m intervals cover their true gaps
    together with probability >= ``level`` (Bonferroni), and ``family`` = m. Comparisons without
    a number (outside the static range) do not count."""
    judged = [f for f in found if f.get("gap") is not None and f.get("gap_ci") is not None]
    if not judged:
        return
    normal = NormalDist()
    stretch = normal.inv_cdf(1 - (1 - level) / (2 * len(judged))) / normal.inv_cdf(1 - (1 - level) / 2)
    for f in judged:
        (low, high), gap = f["gap_ci"], f["gap"]
        f["gap_ci_familywise"] = [gap - stretch * (gap - low), gap + stretch * (high - gap)]
        f["family"] = len(judged)
