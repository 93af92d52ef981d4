"""Synthetic studies with a known answer, to measure how often a frontier interval covers the truth.

A study has static settings at fixed true (acceptance, quality) points and one rule whose true
quality lies ``delta`` above or below the true static frontier (the upper concave envelope) at its
acceptance. Each of n examples gets, per setting, a pass/fail outcome with the setting's success
probability, correlated across settings through one latent difficulty per example (a Gaussian
copula: an example hard for one setting is hard for all, as on real data, where paired intervals
are much narrower than unpaired ones), and drafted/accepted token counts. The interval methods of
:mod:`diversed.evaluation.frontier` then run on those columns exactly as on a real cell's.
``benchmarks/frontier_coverage.py`` runs the full grid; a fast version is a test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from diversed.evaluation import frontier

# True static points (acceptance, accuracy in points), sd first, w = 0 last.
CURVES: dict[str, list[tuple[float, float]]] = {
    "concave": [(0.64, 32.0), (0.70, 31.5), (0.79, 29.5), (0.88, 25.0), (1.0, 14.0)],
    "convex": [(0.64, 32.0), (0.70, 25.0), (0.79, 19.0), (0.88, 15.5), (1.0, 14.0)],
    # the verdict's measured GSM8K sweep: not monotone in w, and w 0.150 above its neighbours
    "non-monotone": [(0.639, 32.0), (0.702, 27.5), (0.789, 19.0), (0.882, 13.5), (0.931, 18.0), (1.0, 14.5)],
}


@dataclass(frozen=True)
class Case:
    """One cell of the simulation grid."""

    curve: str
    delta: float  # the rule's true quality minus the true frontier at its acceptance, in points
    n: int
    rule_acceptance: float = 0.76
    correlation: float = 0.5  # of the latent difficulty across settings

    def truth(self) -> float:
        return self.delta

    def rule_quality(self) -> float:
        points = CURVES[self.curve]
        a, q = np.array([[p[0] for p in points]]), np.array([[p[1] for p in points]])
        return float(frontier.envelope_at(a, q, np.array([self.rule_acceptance]))[0]) + self.delta


def study(case: Case, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """The rule's and the static settings' per-example columns of one synthetic study."""
    points = [(case.rule_acceptance, case.rule_quality()), *CURVES[case.curve]]
    normal = NormalDist()
    difficulty = rng.standard_normal(case.n)
    drafted = 40 + rng.poisson(80, case.n).astype(float)
    settings = []
    for acceptance, quality in points:
        latent = np.sqrt(case.correlation) * difficulty + np.sqrt(1 - case.correlation) * rng.standard_normal(
            case.n
        )
        passed = latent < normal.inv_cdf(quality / 100)
        settings.append(
            {
                "accepted": rng.binomial(drafted.astype(int), acceptance).astype(float),
                "drafted": drafted,
                "quality": 100.0 * passed,
                "count": np.ones(case.n),
            }
        )
    return settings[0], settings[1:]


def _bias_corrected(*args: Any, **kwargs: Any) -> dict[str, Any]:
    found = frontier.above_frontier(*args, **kwargs)
    if found["gap"] is None:
        return found
    return {"gap": found["gap_bias_corrected"], "gap_ci": found["gap_bias_corrected_ci"]}


METHODS: dict[str, Callable[..., dict[str, Any]]] = {
    "envelope (percentile)": frontier.above_frontier,
    "envelope, bias-corrected": _bias_corrected,
    "cross-fitted (percentile)": frontier.crossfit_above_frontier,
}


def coverage(case: Case, studies: int, seed: int = 0, resamples: int = 400) -> dict[str, dict[str, float]]:
    """Per method: the share of ``studies`` whose 95% interval holds the true gap, whose lower end
    lies above 0 (a rule called above the frontier), and the mean estimate's bias."""
    rng = np.random.default_rng(seed)
    found: dict[str, list[tuple[bool, bool, float]]] = {name: [] for name in METHODS}
    for number in range(studies):
        mine, statics = study(case, rng)
        for name, method in METHODS.items():
            result = method(mine, statics, seed=seed + number, resamples=resamples)
            if result["gap"] is None:
                continue
            low, high = result["gap_ci"]
            found[name].append((low <= case.truth() <= high, low > 0, result["gap"] - case.truth()))
    return {
        name: {
            "coverage": float(np.mean([c for c, _, _ in rows])),
            "called_above": float(np.mean([a for _, a, _ in rows])),
            "bias": float(np.mean([b for _, _, b in rows])),
            "studies": len(rows),
        }
        for name, rows in found.items()
    }
