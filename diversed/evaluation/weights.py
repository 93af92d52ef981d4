"""Where a DIVERSED head puts its weight, measured on the tokens it really decoded.

A decode record of method ``diversed`` carries, per generated token, the head's weight w, TV(p, q)
and the target's entropy at that position (``None`` for a bonus token, which the target alone
drew), and the token's class. Statistics over a run's tokens answer "does the head weight tokens
differently by context?": mean, std, the shares below 0.1 and above 0.9, the mean by class (digits,
whitespace and indentation, Python keywords, other), its correlation with TV and entropy, and a
20-bin histogram.
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Iterable
from typing import Any

TOKEN_CLASSES = ("digit", "whitespace", "keyword", "other")
MATCHED_DECIMALS = 4
"""A head's mean w becomes its matched static cell's w rounded to this many decimals: a weight a
file name and a config can carry, 5e-5 at most from the mean."""
MATCH_TOLERANCE = 10.0**-MATCHED_DECIMALS
"""How far a static cell's w may lie from a head's mean w and still be its matched cell: one unit of
the last decimal kept (the rounding moves it half of that)."""


def token_class(text: str) -> str:
    """The class of one token's text (leading spaces ignored, as tokenizers attach them)."""
    stripped = text.strip()
    if not stripped:
        return "whitespace"
    if stripped.isdigit():
        return "digit"
    if keyword.iskeyword(stripped):
        return "keyword"
    return "other"


def _correlation(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    flat = 1e-12 * len(xs)  # a weight that is constant up to rounding correlates with nothing
    return sxy / math.sqrt(sxx * syy) if sxx > flat and syy > flat else None


def weight_statistics(records: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """Statistics of w over every weighted token of ``records`` (None when none carries weights)."""
    w, tv, entropy, classes = [], [], [], []
    for record in records:
        tokens = record.get("token_weights")
        if not tokens:
            continue
        for stats, kind in zip(tokens["stats"], tokens["class"], strict=True):
            if stats is None:
                continue
            w.append(stats[0])
            tv.append(stats[1])
            entropy.append(stats[2])
            classes.append(kind)
    if not w:
        return None
    n = len(w)
    mean = sum(w) / n
    by_class = {}
    for kind in TOKEN_CLASSES:
        mine = [x for x, k in zip(w, classes, strict=True) if k == kind]
        by_class[kind] = {"n": len(mine), "w_mean": sum(mine) / len(mine) if mine else None}
    counts = [0] * 20
    for x in w:
        counts[min(19, int(x * 20))] += 1
    return {
        "tokens": n,
        "w_mean": mean,
        "w_std": math.sqrt(sum((x - mean) ** 2 for x in w) / (n - 1)) if n > 1 else 0.0,
        "w_below_0.1": sum(x < 0.1 for x in w) / n,
        "w_above_0.9": sum(x > 0.9 for x in w) / n,
        "by_class": by_class,
        "corr_tv": _correlation(w, tv),
        "corr_entropy": _correlation(w, entropy),
        "histogram": {"edges": [i / 20 for i in range(21)], "counts": counts},
    }


def matched_weight(records: Iterable[dict[str, Any]]) -> float | None:
    """The static w that is a DIVERSED decode's direct comparator: its head's mean w on the tokens it
    decoded, rounded to :data:`MATCHED_DECIMALS` (None when no record carries weights)."""
    statistics = weight_statistics(records)
    return None if statistics is None else round(statistics["w_mean"], MATCHED_DECIMALS)
