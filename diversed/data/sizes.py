"""What a run draws from each split, checked against what the split holds before any job starts.

A config asks each evaluated split for the largest cell's examples, and each training split for its
trace prompts plus the check's prompts, which must be disjoint. A split that holds fewer fails a
model job hours into a cluster run (MBPP's train split has 374 prompts; the paper's release drew
400 plus 48), so the workflow refuses the run up front, in one line naming every short split with
what it has and what it needs. The Snakefile checks the local copies when it is read (a line count:
it is read again inside every job); ``data status`` checks every split after fetching it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from diversed.data.registry import get_task
from diversed.data.sources import DataError, data_dir


@dataclass
class Draw:
    """What a run takes from one split: the examples and, in words, what for."""

    needed: int = 0
    uses: list[str] = field(default_factory=list)

    def add(self, n: int, use: str) -> None:
        self.needed += n
        self.uses.append(f"{n} {use}")


def parse_draws(entries: list[str]) -> dict[str, Draw]:
    """``["gsm8k.test=100:test examples", "mbpp.train=326:trace prompts", ...]`` (the
    ``--draws`` flag's words) as draws by ``name.split``; the same split twice adds up."""
    draws: dict[str, Draw] = {}
    for entry in entries:
        key, _, rest = entry.partition("=")
        count, _, use = rest.partition(":")
        if "." not in key or not count.isdigit():
            raise DataError(
                f"--draws {entry!r}: expected NAME.SPLIT=N:WHAT, e.g. mbpp.train=326:trace-prompts"
            )
        draws.setdefault(key, Draw()).add(int(count), use.replace("-", " ") or "examples")
    return draws


def draw_flags(draws: dict[str, Draw]) -> str:
    """The inverse of :func:`parse_draws`, for the workflow's ``data status`` command line."""
    return " ".join(
        f"{key}={use.split(' ', 1)[0]}:{use.split(' ', 1)[1].replace(' ', '-')}"
        for key, draw in draws.items()
        for use in draw.uses
    )


def local_size(name: str, split: str, directory: str | Path | None = None) -> int | None:
    """Usable examples of a local copy, by counting its lines (the few-shot examples a split lends
    itself are not usable); None when the split is not a local file."""
    task = get_task(name)
    if task.name == "humaneval":
        return None
    root = data_dir(directory)
    path = root / task.local_file(split) if root is not None else None
    if path is None or not path.is_file():
        return None
    if task.fewshot_split == split:  # e.g. GSM8K train: read it, to find the shots it lends
        from diversed.data import load_examples

        return len(load_examples(name, split, None, directory=directory, allow_hub=False))
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def check_draws(draws: dict[str, Draw], sizes: dict[str, int | None]) -> None:
    """Refuse, in one line, every split whose known size (``sizes`` by ``name.split``; None:
    not known yet) is smaller than its draw."""
    short = [
        f"{key} holds {sizes[key]}, needs {draw.needed} ({' + '.join(draw.uses)})"
        for key, draw in draws.items()
        if sizes.get(key) is not None and sizes[key] < draw.needed
    ]
    if short:
        raise DataError(
            "the data are too small for this config: "
            + "; ".join(short)
            + " (lower data.n_examples, head.n_examples or head.check_examples, or give larger copies)"
        )
