"""Code hashes from the import closure (diversed/pipeline/code_hash.py): which source each rule's
command can run, read from the imports, relative and lazy ones included."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diversed.pipeline.code_hash import closure, code_hash

REPO = Path(__file__).resolve().parents[1]


def rule_entries() -> dict[str, tuple[str, ...]]:
    """The library modules each rule's code hash starts from, read from workflow/rules/*.smk."""
    entries = {}
    for path in (REPO / "workflow" / "rules").glob("*.smk"):
        for rule, body in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", path.read_text(), re.M | re.S):
            if found := re.search(r"src=code_hash\(([^)]*)\)", body):
                entries[rule] = tuple(m.strip().strip('"') for m in found[1].split(","))
    return entries


RULES = rule_entries()


def users(module: str) -> set[str]:
    """The model and result rules whose code reaches ``module``."""
    reached = {rule for rule, entry in RULES.items() if any(str(p).endswith(module) for p in closure(entry))}
    return reached - {"prepare_models", "data_status"}


def test_each_edit_reaches_exactly_the_rules_whose_imports_reach_it():
    assert users("jobs/runner.py") == {"decode", "collect_traces", "check_head"}
    assert users("evaluation/metrics.py") == {
        "collect_traces",
        "check_head",
        "score",
        "tables_and_plots",
        "specbench_table",
    }
    assert users("evaluation/plots.py") == {"tables_and_plots"}
    # the algorithm and both devices' speed paths, for every model job (CUDA graphs load lazily)
    for module in ("engine/loop.py", "backends/cuda/graphs.py", "backends/cpu/quantize.py"):
        assert users(module) == {"decode", "collect_traces", "check_head"}, module


def test_relative_lazy_and_package_imports_are_followed(tmp_path):
    library = tmp_path / "diversed"
    (library / "sub").mkdir(parents=True)
    (library / "__init__.py").write_text("")
    (library / "sub" / "__init__.py").write_text("from . import helper\n")
    (library / "sub" / "helper.py").write_text("X = 1\n")
    (library / "sub" / "job.py").write_text("def run():\n    from ..lazy import Y\n    return Y\n")
    (library / "lazy.py").write_text("import os\nY = 2\n")
    (library / "unused.py").write_text("Z = 3\n")
    names = {str(p.relative_to(library)) for p in closure(("diversed.sub.job",), library)}
    assert names == {"__init__.py", "sub/__init__.py", "sub/helper.py", "sub/job.py", "lazy.py"}
    before = code_hash("diversed.sub.job", library=library)
    (library / "unused.py").write_text("Z = 4\n")
    assert code_hash("diversed.sub.job", library=library) == before
    (library / "sub" / "helper.py").write_text("X = 2\n")
    assert code_hash("diversed.sub.job", library=library) != before


def test_a_module_that_is_not_there_is_named():
    with pytest.raises(ValueError, match="no library module diversed.jobs.nothing"):
        closure(("diversed.jobs.nothing",), Path(__file__).resolve().parents[1] / "diversed")
