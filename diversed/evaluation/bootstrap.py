"""Seeded bootstrap confidence intervals over examples, and paired differences between methods.

Every figure of a score is a function of per-example quantities: a mean (quality of
mean-type metrics, seconds per example), a ratio of sums (acceptance rate = sum accepted / sum
drafted; mean accepted length = sum (accepted + blocks) / sum blocks), or, for corpus BLEU, a
function of summed n-gram statistics. Resampling the examples with replacement and recomputing
the figure gives its sampling distribution; the interval is its 2.5th and 97.5th percentiles
(percentile bootstrap, ``RESAMPLES`` resamples, seeded, so a rerun prints the same interval).

Methods decode the same examples, so a difference against ``sd`` is bootstrapped *paired*: the
same resampled example ids feed both methods' figures, which cancels the per-example difficulty
that dominates an unpaired comparison at a few dozen examples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95
SEED = 0
# Latency is printed only from at least this many batch-1 examples per cell: below it an
# interval is the few examples' own min and max, not a measurement.
MIN_LATENCY = 10

# One figure as a function of per-example columns, vectorised over resamples: it gets each
# column summed ("sum") or averaged ("mean") over the examples of every resample.
Figure = Callable[[dict[str, np.ndarray]], np.ndarray]


def resamples(n: int, count: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """[count, n] example indices, drawn with replacement."""
    return np.random.default_rng(seed).integers(0, n, size=(count, n))


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> list[float] | None:
    """[low, high] of the finite values (None when none is finite)."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return None
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(finite, [tail, 100 - tail])
    return [float(low), float(high)]


def _sums(columns: dict[str, np.ndarray], index: np.ndarray) -> dict[str, np.ndarray]:
    """Each column summed over the examples of every resample: [resamples] or [resamples, d]."""
    return {name: column[index].sum(axis=1) for name, column in columns.items()}


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1), np.nan)


FIGURES: dict[str, Figure] = {
    "acceptance_rate": lambda s: _ratio(s["accepted"], s["drafted"]),
    "mean_accepted_length": lambda s: _ratio(s["accepted"] + s["blocks"], s["blocks"]),
    "quality": lambda s: _ratio(s["quality"], s["count"]),
    "seconds_per_example": lambda s: _ratio(s["latency_seconds"], s["latency_count"]),
}


def columns(examples: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Per-example columns from a score's ``per_example`` rows: counters, batch-1 latency, quality.

    A row's ``quality`` is a score (mean-type metrics) or, for corpus BLEU, a list of n-gram
    statistics that :func:`corpus_bleu_quality` turns into the corpus score of any sum of rows.
    """
    single = np.array([e["batch_size"] == 1 for e in examples], dtype=float)
    return {
        "accepted": np.array([e["accepted"] for e in examples], dtype=float),
        "drafted": np.array([e["drafted"] for e in examples], dtype=float),
        "blocks": np.array([e["blocks"] for e in examples], dtype=float),
        "latency_seconds": np.array([e["seconds"] for e in examples]) * single,
        "latency_count": single,
        "quality": np.array([e["quality"] for e in examples], dtype=float),
        "count": np.ones(len(examples)),
    }


def corpus_bleu_quality(sums: dict[str, np.ndarray]) -> np.ndarray:
    """Corpus BLEU of each resample from its summed sentence statistics (sacrebleu's own formula)."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU()
    return np.array([bleu._compute_score_from_stats(list(row)).score for row in sums["quality"]])


def intervals(
    cols: dict[str, np.ndarray], corpus_quality: Callable | None = None, seed: int = SEED
) -> dict[str, list[float] | None]:
    """The 95% interval of every figure of FIGURES, as ``{name + "_ci": [low, high]}``."""
    sums = _sums(cols, resamples(len(cols["count"]), seed=seed))
    out = {}
    for name, figure in FIGURES.items():
        values = corpus_quality(sums) if name == "quality" and corpus_quality else figure(sums)
        out[f"{name}_ci"] = percentile_interval(values)
    return out


def paired_differences(
    mine: dict[str, np.ndarray],
    reference: dict[str, np.ndarray],
    names: Sequence[str] = ("quality", "acceptance_rate"),
    corpus_quality: Callable | None = None,
    seed: int = SEED,
) -> dict[str, Any]:
    """Figure(mine) - figure(reference) over the same examples, with its paired 95% interval.

    ``mine`` and ``reference`` are columns of the same examples in the same order.
    """
    index = resamples(len(mine["count"]), seed=seed)
    full = np.arange(len(mine["count"]))[None, :]
    out: dict[str, Any] = {}
    for name in names:
        figure = corpus_quality if name == "quality" and corpus_quality else FIGURES[name]
        point = figure(_sums(mine, full)) - figure(_sums(reference, full))
        spread = figure(_sums(mine, index)) - figure(_sums(reference, index))
        value = float(point[0])
        out[name] = value if np.isfinite(value) else None
        out[f"{name}_ci"] = percentile_interval(spread)
    return out


def paired_speedup(
    reference: dict[str, np.ndarray], mine: dict[str, np.ndarray], seed: int = SEED
) -> tuple[float | None, list[float] | None, int]:
    """Speed-up of ``mine`` over ``reference`` (e.g. ``auto``) on the examples both decoded at batch
    1: total reference seconds over total own seconds, with a paired 95% interval (the same
    resampled examples feed both sums), and the number of those examples. None and None below
    :data:`MIN_LATENCY` examples. Both are columns of the same examples in the same order."""
    both = (reference["latency_count"] > 0) & (mine["latency_count"] > 0)
    n = int(both.sum())
    if n < MIN_LATENCY:
        return None, None, n
    theirs, own = reference["latency_seconds"][both], mine["latency_seconds"][both]
    index = resamples(n, seed=seed)
    point = float(theirs.sum() / own.sum())
    return point, percentile_interval(_ratio(theirs[index].sum(axis=1), own[index].sum(axis=1))), n


def above_curve(
    mine: dict[str, np.ndarray],
    low: dict[str, np.ndarray],
    high: dict[str, np.ndarray],
    corpus_quality: Callable | None = None,
    seed: int = SEED,
) -> tuple[float | None, list[float] | None]:
    """Quality of ``mine`` minus the curve's quality at its acceptance, with a paired 95% interval.

    The curve is the straight line between two settings (``low`` and ``high``, e.g. neighbouring
    static weights) in (acceptance, quality); all three are columns of the same examples, resampled
    together, and each resample interpolates at its own acceptances. Positive: above the curve.
    """
    index = resamples(len(mine["count"]), seed=seed)
    full = np.arange(len(mine["count"]))[None, :]
    quality = corpus_quality or FIGURES["quality"]
    accept = FIGURES["acceptance_rate"]

    def gap(sample: np.ndarray) -> np.ndarray:
        sums = [_sums(cols, sample) for cols in (mine, low, high)]
        (a_me, a_lo, a_hi), (q_me, q_lo, q_hi) = ([f(x) for x in sums] for f in (accept, quality))
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (a_me - a_lo) / (a_hi - a_lo)
        return q_me - (q_lo + t * (q_hi - q_lo))

    point = float(gap(full)[0])
    return (point if np.isfinite(point) else None), percentile_interval(gap(index))
