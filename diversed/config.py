"""One decoding setting, validated against the JSON schema the workflow uses too.

The schema (``schemas/decoding.schema.yaml``) is the single source of allowed keys, ranges and
defaults; :class:`DecodeConfig` is its typed view for the library.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
import yaml

from diversed.methods import CascadeRule, EnsembleSpace, Method, Schedule, parse_method

# Model dtypes a user may ask for; "auto" is resolved by diversed.engine.cpu.choose_dtype.
DTYPES = ("auto", "float32", "bfloat16", "float16")
# Weight storage a user may ask for; "auto" is resolved by diversed.engine.quantize.choose_quantize.
QUANTIZE = ("none", "fp16", "auto")


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key."""


@cache
def decoding_schema() -> dict[str, Any]:
    text = resources.files("diversed.schemas").joinpath("decoding.schema.yaml").read_text()
    return yaml.safe_load(text)


def validate(values: dict[str, Any], schema: dict[str, Any] | None = None) -> None:
    """Raise :class:`ConfigError` naming the first offending key."""
    schema = schema or decoding_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(values), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = ".".join(str(p) for p in err.absolute_path) or "config"
        raise ConfigError(f"{where}: {err.message}")


@dataclass(frozen=True)
class DecodeConfig:
    """Every knob of one decoding run (see the schema for meanings)."""

    method: Method = Method.SD
    max_new_tokens: int = 128
    num_assistant_tokens: int = 5
    schedule: Schedule = Schedule.CONSTANT
    confidence_threshold: float | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    target_weight: float = 0.5
    ensemble_space: EnsembleSpace = EnsembleSpace.PROBS
    lenience: float = 0.5
    cascade_rule: CascadeRule = CascadeRule.OPT
    cascade_alpha: float = 0.0
    seed: int = 42

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DecodeConfig:
        """Validate plain values (from YAML or CLI flags) and convert them to enums."""
        values = {k: v for k, v in values.items() if v is not None or k == "confidence_threshold"}
        validate(values)
        defaults = {k: spec.get("default") for k, spec in decoding_schema()["properties"].items()}
        merged = {**defaults, **values}
        return cls(
            method=parse_method(merged["method"]),
            max_new_tokens=merged["max_new_tokens"],
            num_assistant_tokens=merged["num_assistant_tokens"],
            schedule=Schedule(merged["schedule"]),
            confidence_threshold=merged["confidence_threshold"],
            temperature=float(merged["temperature"]),
            top_k=merged["top_k"],
            top_p=float(merged["top_p"]),
            target_weight=float(merged["target_weight"]),
            ensemble_space=EnsembleSpace(merged["ensemble_space"]),
            lenience=float(merged["lenience"]),
            cascade_rule=CascadeRule(merged["cascade_rule"]),
            cascade_alpha=float(merged["cascade_alpha"]),
            seed=merged["seed"],
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values, enums as their canonical strings."""
        return {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(self).items()}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def differing_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Keys whose values differ between two settings dicts (to say why files do not match)."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
