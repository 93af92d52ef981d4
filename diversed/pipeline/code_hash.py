"""Which source a workflow rule runs, read from the source itself: the import closure of the library
modules the rule's command calls, hashed, so that an edit reruns exactly the rules whose code it
changed (Snakemake reruns a job whose params changed, and the hash is one of them).

Hand-kept lists of files went stale: no rule hashed ``jobs/runner.py`` or ``config.py``, traces and
the check did not hash ``evaluation/metrics.py`` where their reward lives. Here every ``import`` of a
``diversed`` module is followed, at any depth and inside functions too (the package imports lazily
to keep light jobs light), together with the ``__init__`` of every package on the way, which
Python runs on import. The hash covers the files' bytes, so a comment edit reruns too: the price of
never missing a real change.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[1]
ROOT_PACKAGE = LIBRARY.name


def module_file(name: str, library: Path = LIBRARY) -> Path | None:
    """The source file of module ``name`` (``diversed.jobs.decode``) in ``library`` (the package's
    folder), or None if it is no module of it (a name imported *from* a module, say)."""
    path = library.parent.joinpath(*name.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def imported(path: Path, name: str) -> set[str]:
    """The library modules a file imports anywhere in it: ``from a.b import c`` names ``a.b`` and,
    where ``c`` is a module, ``a.b.c``; relative imports are resolved from ``name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] == ROOT_PACKAGE}


@functools.cache
def closure(modules: tuple[str, ...], library: Path = LIBRARY) -> tuple[Path, ...]:
    """Every file of ``library`` that importing ``modules`` can run, sorted."""
    files: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        parts = todo.pop().split(".")
        for depth in range(1, len(parts) + 1):  # a module's packages run their __init__ first
            name = ".".join(parts[:depth])
            path = module_file(name, library)
            if path is not None and name not in files:
                files[name] = path
                todo.extend(imported(path, name))
    if missing := [m for m in modules if m not in files]:
        raise ValueError(f"no library module {', '.join(missing)} (under {library})")
    return tuple(sorted(files.values()))


def code_hash(*modules: str, library: Path = LIBRARY) -> str:
    """A short content hash of the import closure of ``modules`` in ``library`` (the workflow's
    checkout: the code its jobs run), each file's path and bytes."""
    digest = hashlib.sha256()
    for path in closure(tuple(modules), library):
        digest.update(str(path.relative_to(library)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]
