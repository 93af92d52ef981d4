"""Every task by name: the paper's six and Spec-Bench."""

from __future__ import annotations

from diversed.data.sources import DataError
from diversed.data.specbench import SpecBench
from diversed.data.tasks import CNNDM, GSM8K, MBPP, WMT, HumanEval, Task, XSum

TASKS: dict[str, Task] = {
    t.name: t for t in (GSM8K(), CNNDM(), XSum(), WMT(), MBPP(), HumanEval(), SpecBench())
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise DataError(f"unknown dataset {name!r}; choose one of: {', '.join(TASKS)}")
    return TASKS[name]
