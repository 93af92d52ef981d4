"""Reading the files the pipeline writes, so that nothing is lost or misread silently.

A damaged file is named (with its line, for JSON lines) in a one-line :class:`DataError` instead of
a parser's traceback; in a file we append to, only a record cut short by a kill (the last line,
without its newline) may be dropped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from diversed.data import DataError
from diversed.data.sources import parse_line


def cache_dir() -> Path:
    """Where diversed keeps what it builds once per machine (models, packed weights):
    ``$DIVERSED_CACHE``, else ``~/.cache/diversed``."""
    return Path(os.environ.get("DIVERSED_CACHE", Path.home() / ".cache" / "diversed"))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every line of ``path`` as a JSON object (blank lines skipped); the first bad one is an error."""
    path = Path(path)
    with path.open("rb") as handle:
        return [parse_line(path, number, raw) for number, raw in enumerate(handle, 1) if raw.strip()]


def read_resumable(path: Path, record_start: bytes) -> tuple[list[dict[str, Any]], int]:
    """The complete lines of a file this program appends to, and the byte length they fill.

    A last line without its newline is a record torn by a kill when it begins as this program's
    records begin (``record_start``, or a part of it): it is left out, for the caller to truncate
    and redo. Anything else that does not parse, anywhere in the file, stops with the file and line
    named: a file that holds something else is never cut down to what parses.
    """
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records = [parse_line(path, number, raw) for number, raw in enumerate(lines, 1)]
    if tail[: len(record_start)] != record_start[: len(tail)]:
        raise DataError(f"{path}:{len(lines) + 1}: the last line is cut short and is not one of our records")
    return records, len(data) - len(tail)


def require(record: dict[str, Any], keys: tuple[str, ...], where: str | Path, what: str) -> dict[str, Any]:
    """``record`` if it holds every one of ``keys``; else a :class:`DataError` naming ``where`` (a
    file, or file:line), what it should be, and the first key it lacks: a damaged or foreign file
    is refused in one line, never met later as a KeyError deep in a job."""
    missing = [key for key in keys if key not in record]
    if missing:
        raise DataError(f"{where}: not {what} (it has no {missing[0]!r})")
    return record


def read_json(path: str | Path) -> Any:
    """A JSON file (a card, a manifest), or a :class:`DataError` naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err.msg}, line {err.lineno}); it is damaged") from None


def read_tensors(path: str | Path) -> dict[str, Any]:
    """A safetensors file, or a :class:`DataError` naming it when it is damaged or cut short."""
    from safetensors import SafetensorError  # here: readers of JSON files never import torch
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except SafetensorError as err:
        raise DataError(f"{path}: not a readable safetensors file ({err}); it is damaged") from None
