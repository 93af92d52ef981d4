"""Where a record came from: the code's commit and the bytes of the head it used.

Every decode and score record names the commit of the code that wrote it (``-dirty`` when the
library's files had uncommitted changes), and a decode of a trained head names the sha256 of its weights
file, which the settings hash covers: a head retrained into the same folder is another setting.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from diversed import __version__

ROOT = Path(__file__).resolve().parent


@functools.cache
def commit() -> str:
    """The git commit of the diversed checkout this code runs from, or the package version when it
    is not a checkout (an installed wheel)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.TimeoutExpired):
        head = ""
    if not head:
        return f"diversed {__version__} (no git checkout)"
    return head[:12] + ("-dirty" if dirty else "")


def settings_hash(settings: dict[str, Any]) -> str:
    """A short content hash of a job's settings (key order does not matter): what a resumed file's
    records or traces must match to be adopted."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def head_sha256(head: str | None) -> str | None:
    """sha256 of a trained head's weights file (None for no head or a hand-made rule such as
    ``oracle:digits``)."""
    from diversed.head import WEIGHTS

    path = Path(head) / WEIGHTS if head else None
    if path is None or not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()
