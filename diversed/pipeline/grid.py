"""The workflow's method grid: config entries -> named, validated decoding settings -> CLI flags.

A grid entry is a partial decoding setting (knobs of :class:`~diversed.config.DecodeConfig`) whose values
may be lists, which are swept; every entry is crossed with the configured draft lengths and
temperatures, unless it names its own ``temperature`` (a value or a list), which then replaces them.
An entry may also name its own ``n_examples`` (a workflow key, not a decoding one: it is not among
its flags), e.g. fewer examples for secondary cells of a study, a ``diversed`` entry its own
``head`` (a hand-made one such as ``oracle:digits``, or a head folder with a ``label`` that names
its cell, instead of the trained head), and a ``static``
entry ``matched_to: diversed``: its w is then the mean weight the trained head put on the tokens of
the ``diversed`` cell with the same draft length and temperature (the head's direct comparator).
With several head seeds (``head_seeds``), every entry that uses the trained head (``diversed``
without its own head, and its matched static cells) becomes one setting per seed, named ``s<seed>``.
Each setting is validated by :class:`DecodeConfig`, so the workflow accepts exactly what the CLI
accepts, and gets a stable, readable name used in file names and tables.
"""

from __future__ import annotations

import itertools
from dataclasses import fields
from typing import Any

from diversed.config import ConfigError, DecodeConfig, knob_flags
from diversed.methods import Method

# Short names for the keys that vary between settings (file names stay readable).
ABBREVIATIONS = {
    "target_weight": "w",
    "lenience": "l",
    "cascade_rule": "",
    "cascade_alpha": "a",
    "gate": "",
    "gate_threshold": "t",
    "ensemble_space": "",
    "num_assistant_tokens": "k",
    "temperature": "T",
    "schedule": "",
    "confidence_threshold": "ct",
    "top_k": "topk",
    "top_p": "topp",
}
# Grid-entry keys that belong to the workflow, not to the decoding setting.
WORKFLOW_KEYS = ("n_examples", "head", "label", "matched_to", "head_seed")


def _name(values: dict[str, Any]) -> str:
    parts = [values["method"]]
    if "head_seed" in values:
        parts.append(f"s{values['head_seed']}")
    if "label" in values:
        parts.append(values["label"])
    elif "head" in values:
        parts.append(values["head"].replace(":", "-"))
    if "matched_to" in values:
        parts.append(f"matched-{values['matched_to']}")
    for key, abbreviation in ABBREVIATIONS.items():
        if key in values:
            parts.append(
                f"{abbreviation}{values[key]:g}"
                if isinstance(values[key], float)
                else f"{abbreviation}{values[key]}"
            )
    return "-".join(parts)


def expand(
    entries: list[dict[str, Any]],
    draft_lengths: list[int],
    temperatures: list[float],
    common: dict[str, Any],
    head_seeds: list[int] | None = None,
) -> dict[str, dict[str, Any]]:
    """name -> setting (plain values, validated) for every grid point, per head seed when several."""
    settings: dict[str, dict[str, Any]] = {}
    for number, entry in enumerate(entries):
        try:
            settings.update(_expand_entry(entry, draft_lengths, temperatures, common))
        except ConfigError as err:
            raise ConfigError(f"decode.grid[{number}] {entry}: {err}") from None
    if not head_seeds or len(head_seeds) == 1:
        return settings
    seeded: dict[str, dict[str, Any]] = {}
    for values in settings.values():
        uses_head = (values["method"] == "diversed" and "head" not in values) or "matched_to" in values
        for seed in head_seeds if uses_head else [None]:
            point = values if seed is None else {**values, "head_seed": seed}
            seeded[_name(point)] = point
    return seeded


def _expand_entry(
    entry: dict[str, Any], draft_lengths: list[int], temperatures: list[float], common: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    settings: dict[str, dict[str, Any]] = {}
    own_keys = {k: entry[k] for k in WORKFLOW_KEYS if k in entry}
    sweeps = {k: v if isinstance(v, list) else [v] for k, v in entry.items() if k not in own_keys}
    for combo in itertools.product(*sweeps.values()):
        point = dict(zip(sweeps, combo, strict=True))
        method = DecodeConfig.from_dict({"method": point["method"]}).method
        lengths = [None] if method is Method.AUTO else draft_lengths
        own = [point["temperature"]] if "temperature" in point else temperatures
        for k, temperature in itertools.product(lengths, own):
            values = {**point, "temperature": float(temperature)}
            if k is not None:
                values["num_assistant_tokens"] = k
            values["method"] = method.value
            DecodeConfig.from_dict({**common, **values})  # raises ConfigError naming the key
            if "head" in own_keys and ":" not in own_keys["head"] and "label" not in own_keys:
                raise ConfigError(f"head: a head folder ({own_keys['head']}) needs a label to name its cell")
            if own_keys.get("matched_to") not in (None, "diversed") or (
                "matched_to" in own_keys and method is not Method.STATIC
            ):
                raise ConfigError("matched_to: only a static entry can be matched, and only to diversed")
            settings[_name({**values, **own_keys})] = {**values, **own_keys}
    return settings


def cli_flags(values: dict[str, Any]) -> str:
    """The ``diversed decode`` flags of a setting, in the schema's key order (so the same setting
    written in another key order gives the same command, and Snakemake sees no change)."""
    flag_of = {item.name: knob_flags(item)[0] for item in fields(DecodeConfig)}
    order = list(flag_of)
    keys = sorted((k for k in values if k not in WORKFLOW_KEYS), key=order.index)
    return " ".join(f"{flag_of[key]} {values[key]}" for key in keys)
