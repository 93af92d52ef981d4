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
