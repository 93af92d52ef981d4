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
    return se if se > 1e-9 else None  # below: the rounding of sums taken in another order


def above_frontier(
    mine: dict[str, np.ndarray],
    statics: Sequence[dict[str, np.ndarray]],
    corpus_quality: Callable | None = None,
    seed: int = bootstrap.SEED,
    resamples: int = bootstrap.RESAMPLES,
) -> dict[str, Any]:
    """Quality of ``mine`` minus the static frontier at its acceptance, with a paired 95% interval
    and the 80%-power effect; all are columns of the same examples in the same order. ``gap`` is
    None (and ``outside`` says why) when ``mine`` lies outside the static acceptance range."""
    index = bootstrap.resamples(len(mine["count"]), resamples, seed)
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
        return outside(a[0, 0], low, high)
    spread, _, _ = gap(index)
    se = standard_error(spread)
    # the envelope's bias as the bootstrap sees it (its resamples' mean minus the point), removed
    # from the point and, twice, from the resamples, so that the interval is centred on the truth
    bias = float(np.nanmean(spread) - point[0])
    return {
        "gap_bias_corrected": float(point[0]) - bias,
        "gap_bias_corrected_ci": bootstrap.percentile_interval(spread - 2 * bias),
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


# The envelope above is a maximum over noisy static points, so it runs high: on the verdict's
# GSM8K cells its resample mean sat 0.6-1.0 points above the point envelope at the rules'
# acceptances, and the percentile intervals about 0.9 points low, enough to flip calls between
# interval methods. Cross-fitting takes the maximum out of the statistic: the envelope's active
# segment (two static settings) is chosen on nine tenths of the examples and the gap is measured on
# the other tenth against the chord through those two settings, which is a policy one could run
# (decode each example with one of them, at random, in the proportion that reaches the rule's
# acceptance); each tenth is judged in turn, and the estimate averages random partitions. What the
# choice gets wrong can only lower the comparator (a chord of true points lies under the true
# envelope), so the cross-fitted gap errs towards the rule where the plain envelope errs against
# it; choosing on nine tenths rather than a half makes wrong choices rarer (on a convex curve at
# n = 200 the mean error fell from +1.2 to +0.7 points). `benchmarks/frontier_coverage.py` measures
# both on synthetic studies with known truth.
CROSSFIT_FOLDS = 10
CROSSFIT_SPLITS = 16  # random partitions averaged for the point estimate
CROSSFIT_RESAMPLE_SPLITS = 1  # and one inside each bootstrap resample (its noise is in the interval)


def resample_counts(n: int, resamples: int, seed: int) -> np.ndarray:
    """How often each of n examples is drawn in each resample ([resamples, n]): the bootstrap as
    weights, so a fold of a resample keeps every copy of an example together."""
    counts = np.zeros((resamples, n))
    np.add.at(counts, (np.arange(resamples)[:, None], bootstrap.resamples(n, resamples, seed)), 1.0)
    return counts


def outside(acceptance: float, low: float, high: float) -> dict[str, Any]:
    """The figures of a setting whose acceptance lies outside the static points' range: none."""
    return {
        "gap": None,
        "gap_ci": None,
        "effect_80": None,
        "outside": f"acceptance {acceptance:.3f} outside the static range [{low:.3f}, {high:.3f}]",
    }


def _weighted_sums(columns: dict[str, np.ndarray], weights: np.ndarray) -> dict[str, np.ndarray]:
    """Each column summed over the examples with ``weights`` [resamples, n] (bootstrap counts times
    a half's mask): [resamples] or [resamples, d]."""
    return {name: weights @ column for name, column in columns.items()}


def _points(
    settings: Sequence[dict[str, np.ndarray]], weights: np.ndarray, quality: Callable
) -> tuple[np.ndarray, np.ndarray]:
    """(acceptance, quality) of every setting under ``weights``: two [resamples, settings] arrays."""
    accept = bootstrap.FIGURES["acceptance_rate"]
    sums = [_weighted_sums(cols, weights) for cols in settings]
    return np.stack([accept(s) for s in sums], axis=-1), np.stack([quality(s) for s in sums], axis=-1)


def active_segment(acceptance: np.ndarray, quality: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, ...]:
    """The two static settings (i, j) whose mix is the envelope at ``x``, per row, and whether x
    lies inside the points' range (else i = j = 0 and ``inside`` is False)."""
    a_i, a_j = acceptance[:, :, None], acceptance[:, None, :]
    q_i, q_j = quality[:, :, None], quality[:, None, :]
    at = x[:, None, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(a_j > a_i, (at - a_i) / (a_j - a_i), 0.0)
    mixed = np.where((a_i <= at) & (at <= a_j), q_i + t * (q_j - q_i), -np.inf).reshape(len(x), -1)
    best = mixed.argmax(axis=1)
    inside = np.isfinite(mixed[np.arange(len(x)), best])
    i, j = np.divmod(best, acceptance.shape[1])
    return i, j, inside


def chord_at(
    acceptance: np.ndarray, quality: np.ndarray, i: np.ndarray, j: np.ndarray, x: np.ndarray
) -> np.ndarray:
    """Per row, the quality on the line through static settings i and j at acceptance x: what
    decoding each example with i or j, at random in the proportion that reaches x, gives (the
    line's extension where x falls outside them on these examples; the point itself when i = j)."""
    rows = np.arange(len(x))
    a_i, a_j, q_i, q_j = acceptance[rows, i], acceptance[rows, j], quality[rows, i], quality[rows, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(a_j != a_i, (x - a_i) / (a_j - a_i), 0.0)
    return q_i + t * (q_j - q_i)


def _crossfit(
    settings: Sequence[dict[str, np.ndarray]],
    weights: np.ndarray,
    quality: Callable,
    splits: int,
    rng,
    folds: int = CROSSFIT_FOLDS,
) -> np.ndarray:
    """The cross-fitted gap per row of ``weights`` ([resamples, n] example counts), averaged over
    ``splits`` random partitions of the examples into ``folds`` (each fold judged against the
    segment the others chose; a resampled example stays in one fold with all its copies, so no
    example both chooses and judges)."""
    # the mixing proportion that reaches the rule's acceptance is read from all the examples: it is
    # no maximum, and a tenth's own acceptances (20 examples at n = 200) can nearly coincide for two
    # settings, which made the chord's slope, and the interval, explode
    accept, _ = _points(settings, weights, quality)
    total = np.zeros(len(weights))
    for _ in range(splits):
        fold = rng.integers(0, folds, size=weights.shape)
        gap_sum, count_sum = np.zeros(len(weights)), np.zeros(len(weights))
        for k in range(folds):
            choose, judge = weights * (fold != k), weights * (fold == k)
            a_c, q_c = _points(settings, choose, quality)
            i, j, inside = active_segment(a_c[:, 1:], q_c[:, 1:], a_c[:, 0])
            _, q_j = _points(settings, judge, quality)
            gap = q_j[:, 0] - chord_at(accept[:, 1:], q_j[:, 1:], i, j, accept[:, 0])
            count = judge.sum(axis=1)
            gap_sum += np.where(inside, gap, np.nan) * count
            count_sum += count
        total += gap_sum / count_sum
    return total / splits


def crossfit_above_frontier(
    mine: dict[str, np.ndarray],
    statics: Sequence[dict[str, np.ndarray]],
    corpus_quality: Callable | None = None,
    seed: int = bootstrap.SEED,
    resamples: int = bootstrap.RESAMPLES,
) -> dict[str, Any]:
    """``mine`` minus the static frontier at its acceptance, the frontier's segment chosen on data
    the comparison does not score (the comment above), with its paired percentile interval over
    ``resamples`` resamples and the 80%-power effect; the columns are of the same examples in the
    same order. ``gap`` is None where ``mine`` lies outside the static range on all the examples."""
    quality = corpus_quality or bootstrap.FIGURES["quality"]
    settings = [mine, *statics]
    n = len(mine["count"])
    a, _ = _points(settings, np.ones((1, n)), quality)
    low, high = float(np.nanmin(a[0, 1:])), float(np.nanmax(a[0, 1:]))
    if not low <= a[0, 0] <= high:
        return outside(a[0, 0], low, high)
    rng = np.random.default_rng(seed)
    # rounded at 1e-12: sums over folds in another order differ from the whole by float rounding
    point = round(float(np.nanmean(_crossfit(settings, np.ones((CROSSFIT_SPLITS, n)), quality, 1, rng))), 12)
    counts = resample_counts(n, resamples, seed)
    spread = np.round(_crossfit(settings, counts, quality, CROSSFIT_RESAMPLE_SPLITS, rng), 12)
    se = standard_error(spread)
    return {
        "gap": point,
        "gap_ci": bootstrap.percentile_interval(spread),
        "effect_80": None if se is None else POWER_FACTOR * se,
        "comparator": "cross-fitted",
    }


def above_fixed_chord(
    mine: dict[str, np.ndarray],
    vertices: Sequence[dict[str, np.ndarray]],
    corpus_quality: Callable | None = None,
    seed: int = bootstrap.SEED,
    resamples: int = bootstrap.RESAMPLES,
    level: float = bootstrap.LEVEL,
) -> dict[str, Any]:
    """``mine`` minus the piecewise-linear chord through static ``vertices`` fixed in advance (a
    preregistered comparator: no maximum is taken on these examples), at its acceptance, with its
    paired percentile interval at ``level`` and the 80%-power effect at that level. The segment
    is the one whose vertices' acceptances bracket ``mine``'s in each resample."""
    quality = corpus_quality or bootstrap.FIGURES["quality"]
    settings = [mine, *vertices]
    n = len(mine["count"])

    def gaps(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a, q = _points(settings, weights, quality)
        order = np.argsort(a[:, 1:], axis=1)
        a_v, q_v = np.take_along_axis(a[:, 1:], order, 1), np.take_along_axis(q[:, 1:], order, 1)
        k = np.clip((a_v <= a[:, :1]).sum(axis=1) - 1, 0, a_v.shape[1] - 2)
        inside = (a_v[:, 0] <= a[:, 0]) & (a[:, 0] <= a_v[:, -1])
        gap = q[:, 0] - chord_at(a_v, q_v, k, k + 1, a[:, 0])
        return np.where(inside, gap, np.nan), a

    point, a = gaps(np.ones((1, n)))
    if not np.isfinite(point[0]):
        return outside(a[0, 0], float(np.nanmin(a[0, 1:])), float(np.nanmax(a[0, 1:])))
    counts = resample_counts(n, resamples, seed)
    spread, _ = gaps(counts)
    se = standard_error(spread)
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    return {
        "gap": float(point[0]),
        "gap_ci": bootstrap.percentile_interval(spread, level),
        "effect_80": None if se is None else (z + 0.841621) * se,
        "acceptance": float(a[0, 0]),
        "n": n,
    }


def call(found: dict[str, Any], familywise: bool = True) -> str:
    """Whether a rule lies above or below the static frontier, said only where both comparators
    agree: the plain envelope errs against the rule (a maximum of noisy points runs high) and the
    cross-fitted chord towards it (a segment chosen wrongly lies under the true envelope), so the
    truth lies between them, and the bracket from the envelope's lower end to the cross-fitted
    upper end holds it at least as often as either interval does."""
    key = "gap_ci_familywise" if familywise else "gap_ci"
    crossfit = found.get("crossfit") or {}
    if found.get(key) is None or crossfit.get(key) is None:
        return "--"
    if found[key][0] > 0:
        return "above"
    if crossfit[key][1] < 0:
        return "below"
    return "neither"
