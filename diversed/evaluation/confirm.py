"""The preregistered confirmatory test (docs/results/verdict/PREREGISTRATION.md), as it was written
before its cells: each rule of the family minus the chord through static vertices fixed in advance,
paired over the examples every cell decoded, a percentile interval at 1 - alpha/m (Bonferroni over
the m rules), the 80%-power effect at that level, and one preregistered sentence per outcome.
Nothing here chooses anything on the examples it judges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from diversed.evaluation import frontier
from diversed.evaluation.comparisons import aligned_columns

SENTENCES = {
    "above": "{rule} lies above the static frontier on fresh GSM8K examples: a per-token rule beats every"
    " mixture of static weights at its acceptance, by {gap} points {interval}",
    "below": "{rule} lies below the static frontier on fresh GSM8K examples: a mixture of static weights"
    " reaches its acceptance with more accuracy, by {minus_gap} points {interval}",
    "neither": "{rule} is not distinguishable from the static frontier on fresh GSM8K examples; a gap of"
    " {effect} points or more, either way, would have been detected with 80% power",
}


def confirm(
    rules: dict[str, dict[str, Any]],
    vertices: Sequence[dict[str, Any]],
    alpha: float = 0.05,
    resamples: int = 10_000,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """``rules`` (name -> score file) against the chord through ``vertices`` (score files), each on
    the examples it and every vertex decoded: gap, family-wise interval, 80%-power effect, outcome
    and its preregistered sentence."""
    level = 1 - alpha / len(rules)
    found = []
    for name, rule in rules.items():
        aligned = aligned_columns(rule, vertices)
        if aligned is None:
            raise ValueError(f"{name} shares no example with every vertex")
        n, (mine, *theirs) = aligned
        result = frontier.above_fixed_chord(mine, theirs, seed=seed, resamples=resamples, level=level)
        result.update(rule=name, n=n, level=level)
        if result["gap"] is None:
            result["outcome"] = "neither"
            result["sentence"] = f"{name}: {result['outside']} (counted as not distinguishable)"
        else:
            low, high = result["gap_ci"]
            result["outcome"] = "above" if low > 0 else "below" if high < 0 else "neither"
            result["sentence"] = SENTENCES[result["outcome"]].format(
                rule=name,
                gap=f"{result['gap']:+.1f}",
                minus_gap=f"{-result['gap']:.1f}",
                interval=f"[{low:+.1f}, {high:+.1f}] ({100 * level:.2f}%, n = {n})",
                effect=f"{result['effect_80']:.1f}" if result["effect_80"] is not None else "--",
            )
        found.append(result)
    return found
