"""The one canonical list of decoding methods, with the spellings the original project used.

Everything that names a method (CLI, config files, workflow wildcards, result files) goes through
:func:`parse_method`, so an alias can never silently select a different algorithm.
"""

from __future__ import annotations

from enum import Enum


class Method(str, Enum):
    """Decoding methods of the DIVERSED paper."""

    AUTO = "auto"  # autoregressive target decoding, no draft model
    SD = "sd"  # standard speculative decoding (Leviathan et al. 2023), lossless
    LOSSY = "lossy"  # lossy SD with lenience l: accept min(1, p / (l q))
    STATIC = "static"  # static ensemble: verify against v = w p + (1 - w) q
    DIVERSED = "diversed"  # dynamic ensemble: w per token from a learned head
    CASCADE = "cascade"  # speculative cascades: verify against a deferral-rule target
    GATE = "gate"  # training-free per-token ensemble: w = 1 or 0 by a threshold on TV, KL or entropy

    @property
    def speculative(self) -> bool:
        return self is not Method.AUTO


ALIASES: dict[str, Method] = {
    "sd_lossy": Method.LOSSY,
    "sd_static": Method.STATIC,
    "static_en": Method.STATIC,
    "sd_en": Method.DIVERSED,
    "spe_cas": Method.CASCADE,
}


def method_choices() -> list[str]:
    """All accepted spellings, canonical names first."""
    return [m.value for m in Method] + list(ALIASES)


def parse_method(name: str | Method) -> Method:
    """Map a canonical name or an original-project alias to a :class:`Method`."""
    if isinstance(name, Method):
        return name
    key = name.strip().lower()
    if key in ALIASES:
        return ALIASES[key]
    try:
        return Method(key)
    except ValueError:
        raise ValueError(f"unknown method {name!r}; choose one of: {', '.join(method_choices())}") from None


class CascadeRule(str, Enum):
    """Deferral rules of speculative cascades (Narasimhan et al. 2024)."""

    CHOW = "chow"  # defer to the target iff max q < 1 - alpha
    DIFF = "diff"  # defer iff max q < max p - alpha
    OPT = "opt"  # defer iff max q < max p - alpha * TV(p, q)
    TOKEN = "token"  # token-level: keep q on tokens the target rates near its best, else p


class GateSignal(str, Enum):
    """What a training-free gate reads per position, all of it already at the verifier's hand.

    ``tv`` and ``kl`` protect where the models disagree: w = 1 (verify against the target) where
    TV(p, q) or KL(p || q) exceeds the threshold, w = 0 (take the draft's distribution) elsewhere,
    the "fuzzy" / KL-threshold rules (arXiv 2502.20704, 2601.04766). ``entropy`` is FLy's gate
    (arXiv 2511.22972) without its deferred window: relax (w = 0) where the target is uncertain,
    its entropy H(p) in nats at least the threshold, and verify exactly where it is sure.
    """

    TV = "tv"
    KL = "kl"
    ENTROPY = "entropy"


class Schedule(str, Enum):
    """Draft-length schedules, with Hugging Face's semantics."""

    CONSTANT = "constant"
    HEURISTIC = "heuristic"
    HEURISTIC_TRANSIENT = "heuristic_transient"
    DYNAMIC = "dynamic"
    COST = "cost"  # k per block from a measured cost profile (--num-assistant-tokens auto); 0 = plain step


class EnsembleSpace(str, Enum):
    """Where the static/dynamic ensemble mixes the two models."""

    PROBS = "probs"  # v = w p + (1 - w) q: the paper's theory
    LOGITS = "logits"  # v = softmax(w z_p + (1 - w) z_q): the released code
