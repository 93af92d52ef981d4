"""One decoding setting: every knob declared once, in :class:`DecodeConfig`.

Each field is a :func:`knob`: its type, default, meaning, allowed range and CLI spellings. From
those declarations come the JSON schema (:func:`decoding_schema`, which the workflow uses to check
its method grid, so both accept exactly the same values), the CLI's flags with their help and
defaults (:func:`add_knob_flags`), and the conversion of plain values (:meth:`DecodeConfig.from_dict`).
A new knob is one new field.
"""

from __future__ import annotations

import argparse
import functools
import typing
from dataclasses import Field, asdict, dataclass, field, fields
from enum import Enum
from typing import Any

import jsonschema

from diversed.methods import ALIASES, CascadeRule, EnsembleSpace, GateSignal, Method, Schedule, parse_method

# Model dtypes a user may ask for; "auto" is resolved by diversed.devices.choose_dtype.
DTYPES = ("auto", "float32", "bfloat16", "float16")
# How a forward runs (diversed.engine.cache): eager, over a store that grows with the columns;
# fixed, over FixedKV (one shape for every step, attention over its capacity), still eager: the
# fixed-shape step that the CPU can test; graphs, that step replayed from CUDA graphs, CUDA only.
STEPS = ("eager", "fixed", "graphs")
# A positive control's damaged drafts (diversed.loading.control).
DRAFT_TRANSFORMS = ("digit_swap",)
# Attention kernels the engine can drive: both take the 4-D additive mask of its ragged rows
# (flash_attention_2 takes none, so it is refused before a model loads).
ATTENTION = ("sdpa", "eager")
# Weight storage a user may ask for; "auto" is resolved by diversed.backends.cpu.quantize.choose_quantize.
QUANTIZE = ("none", "fp16", "auto")


AUTO_MAX_DRAFT = 6  # --num-assistant-tokens auto: k in 0..6 per block (schedule cost)


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key."""


def knob(default: Any, help: str, *flags: str, **schema: Any) -> Any:
    """A field of a config dataclass: ``help`` says what it means, ``flags`` are its CLI spellings
    (the first is the one the workflow writes; default ``--name-with-dashes``), ``schema`` its JSON
    schema constraints (``minimum``, ``exclusiveMinimum``, ``maximum``; types come from the field)."""
    return field(default=default, metadata={"help": help, "flags": flags, "schema": schema})


def knob_flags(item: Field) -> tuple[str, ...]:
    return item.metadata["flags"] or ("--" + item.name.replace("_", "-"),)


def _choices(kind: type[Enum]) -> list[str]:
    values = [member.value for member in kind]
    return values + list(ALIASES) if kind is Method else values


def _base(kind: Any) -> type:
    """``float | None`` -> ``float``."""
    args = typing.get_args(kind)
    return next(a for a in args if a is not type(None)) if args else kind


def _property(item: Field, kind: Any) -> dict[str, Any]:
    """The JSON schema of one knob, from its type annotation and declared constraints."""
    default = item.default.value if isinstance(item.default, Enum) else item.default
    spec: dict[str, Any] = {"description": item.metadata["help"], "default": default}
    base = _base(kind)
    if issubclass(base, Enum):
        spec |= {"type": "string", "enum": _choices(base)}
    else:
        spec["type"] = {int: "integer", float: "number", bool: "boolean", str: "string"}[base]
    if type(None) in typing.get_args(kind):
        spec["type"] = [spec["type"], "null"]
    return spec | item.metadata["schema"]


@functools.cache
def schema_of(config_class: type) -> dict[str, Any]:
    """The JSON schema (2020-12) of a config dataclass declared with knobs (built once per class)."""
    kinds = typing.get_type_hints(config_class)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "properties": {item.name: _property(item, kinds[item.name]) for item in fields(config_class)},
    }


def decoding_schema() -> dict[str, Any]:
    """The schema of one decoding setting (CLI flags and the workflow's grid entries)."""
    return schema_of(DecodeConfig)


def validate(values: dict[str, Any], schema: dict[str, Any] | None = None) -> None:
    """Raise :class:`ConfigError` naming the first offending key."""
    schema = schema or decoding_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(values), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = ".".join(str(p) for p in err.absolute_path) or "config"
        raise ConfigError(f"{where}: {err.message}")


def add_knob_flags(parser: argparse.ArgumentParser, config_class: type) -> None:
    """One flag per knob, its help ending in the default; left as None when not given, so the
    declared default applies (and validation sees only what the user typed)."""
    kinds = typing.get_type_hints(config_class)
    for item in fields(config_class):
        spec, base = _property(item, kinds[item.name]), _base(kinds[item.name])
        convert = base if base in (int, float) else str
        shown = "" if spec["default"] is None else f" ({spec['default']})"
        choices = f": {' | '.join(spec['enum'])}" if "enum" in spec else ""
        parser.add_argument(
            *knob_flags(item), dest=item.name, type=convert, help=f"{item.metadata['help']}{choices}{shown}"
        )


def check_range(
    name: str,
    value: float | None,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: float | None = None,
    exclusive_maximum: float | None = None,
) -> None:
    """Raise :class:`ConfigError` when ``value`` is out of range, in the words the workflow's schema
    check uses for the same key, so the CLI, the library and the workflow refuse alike."""
    if value is None:
        return
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}: {value} is less than the minimum of {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name}: {value} is greater than the maximum of {maximum}")
    if exclusive_minimum is not None and value <= exclusive_minimum:
        raise ConfigError(f"{name}: {value} is less than or equal to the minimum of {exclusive_minimum}")
    if exclusive_maximum is not None and value >= exclusive_maximum:
        raise ConfigError(f"{name}: {value} is greater than or equal to the maximum of {exclusive_maximum}")


@dataclass(frozen=True)
class DecodeConfig:
    """Every knob of one decoding run."""

    method: Method = knob(Method.SD, "decoding method (original aliases accepted)")
    max_new_tokens: int = knob(
        128, "tokens to generate at most", "--max-new-tokens", "--max_tokens", "--max_new_tokens", minimum=1
    )
    num_assistant_tokens: int = knob(
        5,
        "draft length N: tokens drafted per block at most",
        "--num-assistant-tokens",
        "--num_assistant_tokens",
        minimum=1,
    )
    schedule: Schedule = knob(
        Schedule.CONSTANT,
        "draft-length schedule, as Hugging Face defines it",
        "--assistant-schedule",
        "--assistant_schedule",
    )
    confidence_threshold: float | None = knob(
        None,
        "stop drafting when the draft's probability of its token falls below this (0 = off);"
        " unset: 0.4 for dynamic, 0 otherwise",
        "--assistant-confidence-threshold",
        "--assistant_confidence_threshold",
        minimum=0,
        maximum=1,
    )
    temperature: float = knob(0.0, "0 = greedy; applied once to each model's logits", minimum=0)
    top_k: int = knob(0, "keep the k most likely tokens (0 = off)", "--top-k", "--top_k", minimum=0)
    top_p: float = knob(
        1.0, "nucleus sampling mass (1 = off)", "--top-p", "--top_p", exclusiveMinimum=0, maximum=1
    )
    target_weight: float = knob(
        0.5,
        "static ensemble weight w on the target: v = w p + (1 - w) q; w = 1 is lossless",
        minimum=0,
        maximum=1,
    )
    ensemble_space: EnsembleSpace = knob(
        EnsembleSpace.PROBS, "probs (the paper's mixture) or logits (the released code's logit mixing)"
    )
    lenience: float = knob(
        0.5,
        "lossy SD lenience l in (0, 1]: accept min(1, p / (l q)); l = 1 is standard SD",
        exclusiveMinimum=0,
        maximum=1,
    )
    cascade_rule: CascadeRule = knob(CascadeRule.OPT, "speculative-cascade deferral rule")
    cascade_alpha: float = knob(0.0, "deferral-rule parameter alpha")
    gate: GateSignal = knob(
        GateSignal.TV,
        "signal of method gate: tv / kl set w = 1 where TV(p, q) / KL(p || q) > gate_threshold, else"
        " w = 0; entropy sets w = 0 where the target's entropy (nats) >= gate_threshold, else w = 1",
    )
    gate_threshold: float = knob(
        0.1,
        "threshold of the gate: tv 0 is sd, tv 1 is static w = 0; entropy 0 is static w = 0, above"
        " log(vocabulary) it is sd",
        minimum=0,
    )
    seed: int = knob(42, "seed of the sampling generator")

    def __post_init__(self) -> None:
        if self.schedule is Schedule.COST and self.method is not Method.SD:
            raise ConfigError(
                f"method {self.method.value}: --num-assistant-tokens auto (schedule cost) is for lossless"
                " sd; a relaxed method's output distribution depends on k, so it keeps a fixed k"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DecodeConfig:
        """Validate plain values (from YAML or CLI flags) and convert them to the fields' types.

        ``None`` means "not given" (the default applies), except for knobs whose type admits it.
        """
        kinds = typing.get_type_hints(cls)
        nullable = {item.name for item in fields(cls) if type(None) in typing.get_args(kinds[item.name])}
        values = {k: v for k, v in values.items() if v is not None or k in nullable}
        validate(values, schema_of(cls))
        converted = {}
        for item in fields(cls):
            if item.name not in values:
                continue
            value, kind = values[item.name], kinds[item.name]
            if kind is Method:
                value = parse_method(value)
            elif isinstance(kind, type) and issubclass(kind, Enum):
                value = kind(value)
            elif kind is float:
                value = float(value)
            converted[item.name] = value
        return cls(**converted)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values, enums as their canonical strings."""
        return {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(self).items()}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def differing_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Keys whose values differ between two settings dicts (to say why files do not match)."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
