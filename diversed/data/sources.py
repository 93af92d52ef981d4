"""Finding a task's split: a local JSONL folder, else the Hugging Face hub, else a clear error.

Local layout: ``<data_dir>/<task>/<split>.jsonl``, one record per line in the Hugging Face field
schema. ``data_dir`` comes from the caller or ``DIVERSED_DATA_DIR``. Data is never substituted:
a split that cannot be found is an error naming the file to place.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """A split could not be resolved; the message says which file to place where."""


@dataclass(frozen=True)
class HubSource:
    """Where the paper loaded a split from: ``load_dataset(path, name, split=...)``."""

    path: str
    name: str | None
    splits: dict[str, str]  # our split name -> the hub's (e.g. WMT19 has no test split)


def data_dir(explicit: str | Path | None = None) -> Path | None:
    chosen = explicit or os.environ.get("DIVERSED_DATA_DIR")
    return Path(chosen).expanduser() if chosen else None


def hub_offline() -> bool:
    """Whether the user turned the hub off (``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` set to 1)."""
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def hub_cached(hub: HubSource) -> bool:
    """Whether ``load_dataset`` can serve ``hub`` from the local caches alone: its prepared copy in
    the datasets cache (``HF_DATASETS_CACHE``, else ``$HF_HOME/datasets``). Only folders are looked
    at: this runs at every parse of the workflow."""
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")).expanduser()
    cache = Path(os.environ.get("HF_DATASETS_CACHE", home / "datasets")).expanduser()
    prepared = cache / hub.path.replace("/", "___")
    return prepared.is_dir() and any(prepared.iterdir())


def parse_line(path: Path, number: int, raw: bytes | str) -> dict[str, Any]:
    """One line as a JSON object, or a :class:`DataError` naming ``path`` and line ``number``."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{number}: not a JSON line ({err.msg}, column {err.colno})") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}:{number}: a JSON line that is not an object")
    return value


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A local split's records; a line that is not a JSON object is named with its file and number."""
    with path.open("rb") as handle:
        return [parse_line(path, number, raw) for number, raw in enumerate(handle, 1) if raw.strip()]


def load_split(
    task: str,
    split: str,
    hub: HubSource | None,
    directory: str | Path | None = None,
    allow_hub: bool = True,
    local_file: str | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """Records of ``task``/``split`` and a description of where they came from (``local_file``: its
    path under the data folder, ``<task>/<split>.jsonl`` unless the task keeps another name)."""
    local_file = local_file or f"{task}/{split}.jsonl"
    root = data_dir(directory)
    if root is not None:
        path = root / local_file
        if path.exists():
            return read_jsonl(path), f"local {path}"
    hub_error = "the hub is not allowed"
    if hub is not None and allow_hub and split in hub.splits:
        try:
            from datasets import load_dataset

            dataset = load_dataset(hub.path, hub.name, split=hub.splits[split])
            return [dict(r) for r in dataset], f"hub {hub.path}:{hub.name or ''}:{hub.splits[split]}"
        except Exception as err:  # noqa: BLE001 - offline, missing package, unknown split: all mean "not there"
            whole = " ".join(str(err).split())  # a gated dataset's message holds the link to ask for access
            hub_error = f"the hub failed: {type(err).__name__}: {whole}"
    elif hub is None or split not in (hub.splits if hub else {}):
        hub_error = f"the hub has no {split!r} split for it"
    where = root if root is not None else "$DIVERSED_DATA_DIR (unset)"
    raise DataError(
        f"no data for {task}/{split}: place {local_file} (Hugging Face field schema) under {where}"
        f" or set DIVERSED_DATA_DIR; {hub_error}"
    )
