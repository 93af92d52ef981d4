"""Running model-written code: one throw-away process per program, fenced in as far as the OS allows.

What is enforced (``SandboxResult.enforced`` lists it per run):

* a separate process in its own session and process group, killed as a group on time-out and
  after it finishes, so children it forks die with it;
* a wall-clock time-out and an RLIMIT_CPU limit;
* RLIMIT_AS (address space, so a 50 GB allocation fails), RLIMIT_FSIZE (no file over a few MB),
  RLIMIT_NOFILE and no core dumps;
* a fresh temporary working directory, deleted afterwards, and a scrubbed environment (no
  proxies, tokens or user paths; HOME and TMPDIR point into that directory);
* when started as root: a new network namespace with no interfaces up (no network at all), and
  the program runs as ``nobody`` with RLIMIT_NPROC, so it cannot write or delete the caller's
  files and a fork bomb hits the process limit. As root, the interpreter is the system
  ``/usr/bin/python3`` when the caller's one lives where ``nobody`` cannot read it.

Not enforced: a non-root caller gets no network namespace or user switch (the program then runs
as the caller with the limits above), and nothing here is a security boundary against a
determined attacker: run untrusted code on a machine you can throw away.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

NOBODY = 65534
CLONE_NEWNET = 0x40000000
MAX_OUTPUT = 4000


@dataclass
class SandboxResult:
    """Outcome of one program: ``passed`` is True only when it exited 0 within its limits."""

    passed: bool
    status: str  # "passed", "failed", "timeout"
    reason: str
    seconds: float
    enforced: list[str] = field(default_factory=list)
    process_group: int = 0  # the program's process group (empty once it has been killed)


def _readable_by_others(path: str) -> bool:
    """Can an unprivileged user reach and execute ``path`` (every parent needs o+x)?"""
    real = Path(os.path.realpath(path))
    for parent in real.parents:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(real).st_mode & stat.S_IXOTH)


def _interpreter(as_nobody: bool) -> str:
    if not as_nobody or _readable_by_others(sys.executable):
        return sys.executable
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system and _readable_by_others(system):
        return system
    raise RuntimeError("no Python interpreter that user 'nobody' can run; cannot sandbox as root")


def _limits(timeout: float, memory_mb: int, as_nobody: bool, isolate_network: bool):
    """The function run in the child between fork and exec."""

    def apply() -> None:
        os.setsid()
        if isolate_network and ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
        cpu = int(timeout) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        memory = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 * 1024 * 1024, 8 * 1024 * 1024))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if as_nobody:
            resource.setrlimit(resource.RLIMIT_NPROC, (16, 16))
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)

    return apply


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


_network_isolation: bool | None = None  # learnt on first use: can this process unshare its netns?


def _start(program: Path, env: dict[str, str], preexec, as_root: bool) -> subprocess.Popen:
    return subprocess.Popen(
        [_interpreter(as_root), "-I", "-B", str(program)],
        cwd=program.parent,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=preexec,
    )


def run_program(source: str, timeout: float = 5.0, memory_mb: int = 1024) -> SandboxResult:
    """Run Python ``source`` in a fresh sandboxed process; pass = exit status 0 in time."""
    global _network_isolation
    as_root = os.geteuid() == 0
    if _network_isolation is None:
        _network_isolation = as_root
    enforced = ["own process group", f"wall time {timeout:g} s", f"address space {memory_mb} MB", "fresh dir"]
    if as_root:
        enforced += ["user nobody", "process limit 16"]
    if _network_isolation:
        enforced.append("no network (new netns)")
    workdir = Path(tempfile.mkdtemp(prefix="diversed-sandbox-"))
    try:
        program = workdir / "program.py"
        program.write_text(source)
        if as_root:
            os.chown(workdir, NOBODY, NOBODY)
            os.chown(program, NOBODY, NOBODY)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(workdir),
            "TMPDIR": str(workdir),
            "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        start = time.perf_counter()
        try:
            proc = _start(program, env, _limits(timeout, memory_mb, as_root, _network_isolation), as_root)
        except subprocess.SubprocessError:
            if not _network_isolation:
                raise
            _network_isolation = False  # e.g. a container without CAP_SYS_ADMIN: say so, go on
            enforced.remove("no network (new netns)")
            proc = _start(program, env, _limits(timeout, memory_mb, as_root, False), as_root)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.communicate()
            seconds = time.perf_counter() - start
            return SandboxResult(
                False, "timeout", f"timed out after {timeout:g} s", seconds, enforced, proc.pid
            )
        finally:
            _kill_group(proc.pid)
        seconds = time.perf_counter() - start
        if proc.returncode == 0:
            return SandboxResult(True, "passed", "", seconds, enforced, proc.pid)
        text = err.decode("utf-8", "replace").strip()
        last = text.splitlines()[-1] if text else ""
        if proc.returncode < 0:
            last = f"killed by {signal.Signals(-proc.returncode).name}" + (f" ({last})" if last else "")
        return SandboxResult(
            False, "failed", last[:MAX_OUTPUT] or f"exit status {proc.returncode}", seconds, enforced
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
