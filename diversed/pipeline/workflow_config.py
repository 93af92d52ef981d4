"""The workflow's config, checked by the library: one line naming the offending key, no schema dump.

Snakemake's own ``validate`` prints the whole sub-schema under its message (75-511 lines for a
misspelt key); this check reports the first error as ``data.n_exemples: ...`` or
``decode.grid[2]: ...`` and fills in the schema's defaults as Snakemake's would. Each grid entry is
then expanded into decoding settings, which :class:`~diversed.config.DecodeConfig` validates
against the same rules as the CLI, with the entry named.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from diversed.config import ConfigError
from diversed.data.sizes import Draw


def _fill_defaults(validator_class: type) -> type:
    """A validator that also writes each property's ``default`` into the instance where it is
    missing (the recipe of jsonschema's FAQ), as ``snakemake.utils.validate`` does."""
    check_properties = validator_class.VALIDATORS["properties"]

    def properties(validator, schema_properties, instance, schema) -> Iterator[Any]:
        if isinstance(instance, dict):
            for name, sub in schema_properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = sub["default"]
        yield from check_properties(validator, schema_properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": properties})


def where(path: Any) -> str:
    """``['decode', 'grid', 2, 'target_weight']`` -> ``decode.grid[2].target_weight``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or "config"


def validate_config(config: dict[str, Any], schema_path: str | Path) -> None:
    """Check ``config`` against the workflow schema and fill its defaults; raise
    :class:`ConfigError` with the key at fault and the reason, in one line."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = _fill_defaults(jsonschema.Draft202012Validator)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        path = list(error.absolute_path)
        if error.validator == "additionalProperties":  # name the unexpected key itself
            extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
            path += extra[:1]
            allowed = ", ".join(error.schema["properties"])
            raise ConfigError(f"{where(path)}: unknown key (allowed: {allowed})")
        raise ConfigError(f"{where(path)}: {error.message}")


def trace_prompts(head: dict[str, Any], dataset: str) -> int:
    """Train prompts a round of traces on ``dataset`` samples: ``head.n_examples``, or the task's
    own number in ``head.n_examples_by_task`` (MBPP's train split holds 374)."""
    return head["n_examples_by_task"].get(dataset, head["n_examples"])


def config_draws(
    config: dict[str, Any], settings: dict[str, dict[str, Any]], datasets: list[str], sources: list[str]
) -> dict[str, Draw]:
    """What a run of ``config`` takes from each split: every evaluated dataset its largest cell's
    examples; every head's training source (``name.split``) its trace prompts over all rounds (a
    round seeds its own subset: at most that many) plus the check's prompts, which no trace may hold."""
    data, head = config["data"], config["head"]
    draws: dict[str, Draw] = {}
    largest = max(values.get("n_examples", data["n_examples"]) for values in settings.values())
    for dataset in datasets:
        draws.setdefault(f"{dataset}.{data['split']}", Draw()).add(largest, "examples per cell")
    for source in sources:
        name = source.partition(".")[0]
        rounds = head["rounds"]
        draw = draws.setdefault(source, Draw())
        draw.add(
            rounds * trace_prompts(head, name),
            "trace prompts" + (f" over {rounds} rounds" if rounds > 1 else ""),
        )
        if head["check_examples"]:
            draw.add(head["check_examples"], "check prompts")
    return draws


def job_device(device: str, gpus: int) -> str:
    """The ``--device`` of a model job: a job that holds a GPU (``resources.gpu`` >= 1) runs on CUDA
    or stops, in one line saying why (``devices.no_cuda_reason``), never on the CPU beside its idle
    GPU (`auto` resolves to the CPU wherever torch sees no GPU: a CPU build of torch, a driver
    mismatch); a job without one keeps the configured device."""
    if gpus < 1:
        return device
    if device == "cpu":
        raise ConfigError(
            "models.device: cpu, but resources.gpu gives every model job a GPU; use auto or cuda"
        )
    return "cuda" if device == "auto" else device


def reference(schema_path: str | Path) -> str:
    """``config/README.md``: every key of the workflow's config, its type, default and meaning, from
    the schema itself (a test keeps the file equal to this, so it cannot go stale)."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    lines = [
        "# The workflow's configuration",
        "",
        "Generated from `workflow/schemas/config.schema.yaml` by",
        "`diversed.pipeline.workflow_config.reference` (`tests/test_cluster_path.py` checks that this file",
        "is current). `config/config.yaml` is the",
        "laptop default, read only when no `--configfile` is given; any other config file stands alone,",
        "what it leaves out taking the defaults below. A decoding setting of `decode.grid` takes the",
        "CLI's knobs (`diversed decode --help`).",
    ]
    for section, spec in schema["properties"].items():
        lines += ["", f"## `{section}`", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for key, sub in spec.get("properties", {}).items():
            kind = sub.get("type", "one of the forms below" if "oneOf" in sub else "")
            if "enum" in sub:
                kind = " \\| ".join(f"`{v}`" for v in sub["enum"] if v is not None) or kind
            kind = " or ".join(kind) if isinstance(kind, list) else kind
            default = f"`{json.dumps(sub['default'])}`" if "default" in sub else "required"
            meaning = " ".join(str(sub.get("description", "")).split()).replace("|", "\\|")
            lines.append(f"| `{section}.{key}` | {kind} | {default} | {meaning} |")
    return "\n".join(lines) + "\n"
