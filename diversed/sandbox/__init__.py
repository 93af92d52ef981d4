"""Running model-written code: one throw-away, fenced-in process tree per program.

Threat model. The programs are what a language model wrote for a benchmark task: mostly correct
or wrong code, sometimes code that loops, allocates without bound, forks, writes files, reads
around the filesystem or opens sockets, by accident or because a prompt led it there. The sandbox
must keep such a program from changing or reading anything of the caller's (the project's source,
the evaluation references, other runs' files), from reaching the network, from outliving its run,
and from hanging or exhausting the scoring job. It is not a boundary against a determined attacker
with a kernel exploit: score untrusted models' code on a machine you can throw away.

What is enforced, per run (``SandboxResult.enforced``; what the machine could not give is in
``SandboxResult.missing``; ``strict=True`` refuses to run instead, raising :class:`SandboxError`).
The launcher, :mod:`diversed.sandbox.jail`, says how each is built:

* its own PID namespace: the program sees and can signal only its own processes, and when it
  ends, or its time is up, every process it made is killed by the kernel, whatever it forked,
  double-forked or ``setsid()``-ed; ``run_program`` returns within the time-out plus a grace of
  at most a second, and it reads the program's output from files, never pipes, so a surviving
  child holding them could not make it wait;
* a private filesystem view: read-only binds of the interpreter, its standard library and the
  system's shared libraries, nothing else of the caller's; private writable ``/tmp`` and
  ``/sandbox`` (its directory) in memory, size-limited and gone with it;
* no network (a network namespace with no interface up);
* limits: wall time, CPU seconds, address space, file size, open files, processes (so a fork bomb
  stops), no core dumps; a root caller's program runs as ``nobody``; a non-root caller gets the
  same namespaces through a user namespace where the kernel allows unprivileged ones.

Where namespaces are refused (non-Linux, a locked-down container, a cluster node without
unprivileged user namespaces), a program gets no private filesystem, no network fence and no PID
namespace. The scorer then runs generated code only in mode ``rlimits``, an explicit opt-in
(``score.sandbox: rlimits``): a process group in a fresh directory on the real filesystem, killed
as a group, with the same limits, and every score record says so. In the default mode,
``isolated`` (the old ``strict``), such a machine refuses to run generated code at all, and
:func:`probe` names it before the first job (``diversed doctor``, the workflow's data status).

A core package: it imports nothing else of diversed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

NOBODY = 65534
MAX_OUTPUT = 4000
REFUSED = 125  # the launcher's exit status when strict and something is missing
NAMESPACES = ("user", "mount", "network", "pid")
GRACE = 1.0  # seconds a killed program's launcher gets to be reaped
JAIL = Path(__file__).with_name("jail.py")
SYSTEM_LIBRARIES = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/lib32", "/etc/ld.so.cache")


# How generated code may run: isolated (every fence above, else refuse) or rlimits (whatever this
# machine gives, limits at least: an explicit opt-in for nodes that cannot isolate). "strict" is
# the earlier name of isolated.
MODES = ("isolated", "rlimits")
ALIASES = {"strict": "isolated"}


def parse_mode(name: str) -> str:
    mode = ALIASES.get(name, name)
    if mode not in MODES:
        raise ValueError(f"sandbox mode {name!r} is not one of: {', '.join([*MODES, *ALIASES])}")
    return mode


class SandboxError(ValueError):
    """The sandbox cannot give what was asked for (``strict`` and something is missing); a
    ValueError, so the CLI prints it as its one-line error."""


@dataclass
class SandboxResult:
    """Outcome of one program: ``passed`` is True only when it exited 0 within its limits."""

    passed: bool
    status: str  # "passed", "failed", "timeout"
    reason: str
    seconds: float
    enforced: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    process_group: int = 0  # the launcher's process group (empty once it has been killed)


def _readable_by_others(path: str) -> bool:
    """Can an unprivileged user reach and execute ``path`` (every parent needs o+x)?"""
    real = Path(os.path.realpath(path))
    for parent in real.parents:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(real).st_mode & stat.S_IXOTH)


@functools.cache
def _layout() -> dict:
    """The interpreter and the read-only paths its world is made of (computed once)."""
    interpreter = os.path.realpath(sys.executable)  # the base interpreter, not a venv's link to it
    prefix = os.path.realpath(sys.base_prefix)
    stdlib = {
        os.path.realpath(sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})[k])
        for k in ("stdlib", "platstdlib")
    }
    wanted = [interpreter, *stdlib]
    libdir = os.path.realpath(sysconfig.get_config_var("LIBDIR") or "")
    library = sysconfig.get_config_var("INSTSONAME")
    if library and os.path.exists(os.path.join(libdir, library)):
        wanted.append(os.path.join(libdir, library))  # libpython of a shared build
    links = {}
    for path in SYSTEM_LIBRARIES:
        if os.path.islink(path):
            links[path] = os.readlink(path)
        elif os.path.exists(path):
            wanted.append(path)
    binds = []
    for path in sorted(set(wanted)):  # parents sort first: skip what a bind above already holds
        if not any(path.startswith(b + "/") for b in binds):
            binds.append(path)
    hide = [p for s in stdlib if os.path.isdir(p := os.path.join(s, "site-packages"))]
    return {"interpreter": interpreter, "binds": binds, "links": links, "hide": hide}


def _fallback_interpreter(interpreter: str) -> str:
    """Without a private filesystem a root caller's program runs as ``nobody``, who must be able
    to reach the interpreter where it lies; else the system's ``python3``."""
    if _readable_by_others(interpreter):
        return interpreter
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system and _readable_by_others(system):
        return system
    raise SandboxError("no Python interpreter that user 'nobody' can run; cannot sandbox as root")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _tail(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text.splitlines()[-1][:MAX_OUTPUT] if text else ""


def run_program(
    source: str,
    timeout: float = 5.0,
    memory_mb: int = 1024,
    strict: bool = False,
    processes: int = 32,
    disk_mb: int = 16,
    namespaces: tuple[str, ...] = NAMESPACES,
) -> SandboxResult:
    """Run Python ``source`` in a fresh sandboxed process tree; pass = exit status 0 in time.

    ``processes`` and ``disk_mb`` bound the processes it may have and the size of any file it
    writes (and of its ``/tmp`` and directory); ``namespaces`` names those to try, all by default
    (fewer emulate a machine that refuses some, to test what the caller is told).
    """
    as_root = os.geteuid() == 0
    layout = _layout()
    workdir = Path(tempfile.mkdtemp(prefix="diversed-sandbox-"))
    fallback = layout["interpreter"]
    if as_root:
        os.chown(workdir, NOBODY, NOBODY)  # the fallback runs the program here, as nobody
        with contextlib.suppress(SandboxError):
            fallback = _fallback_interpreter(fallback)
    with contextlib.ExitStack() as stack:
        program, out, err, report = (stack.enter_context(tempfile.TemporaryFile()) for _ in range(4))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        program.write(source.encode())
        program.seek(0)
        config = {
            **layout,
            "fallback_interpreter": fallback,
            "dir": str(workdir),
            "timeout": timeout,
            "memory_mb": memory_mb,
            "disk_mb": disk_mb,
            "processes": processes,
            "strict": strict,
            "namespaces": list(namespaces),
            "report_fd": report.fileno(),
        }
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(JAIL), json.dumps(config)],
            stdin=program,
            stdout=out,
            stderr=err,
            pass_fds=(report.fileno(),),
            start_new_session=True,
            env={"LANG": "C.UTF-8"},
        )
        status = "passed"
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            status = "timeout"
        finally:
            _kill_group(proc.pid)  # the launcher and, through it, the namespace's init
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=GRACE)
        seconds = time.perf_counter() - start
        report.seek(0)
        achieved = json.loads(report.read() or b'{"enforced": [], "missing": ["the launcher did not start"]}')
        enforced = [f"wall time {timeout:g} s", f"address space {memory_mb} MB", *achieved["enforced"]]
        missing = achieved["missing"]
        err.seek(0)
        errors = err.read()
        if proc.returncode == REFUSED and strict and missing:
            raise SandboxError(_tail(errors) or "sandbox --strict: " + "; ".join(missing))
        if status == "timeout":
            reason = f"timed out after {timeout:g} s"
            return SandboxResult(False, status, reason, seconds, enforced, missing, proc.pid)
        if proc.returncode == 0:
            return SandboxResult(True, status, "", seconds, enforced, missing, proc.pid)
        last = _tail(errors)
        if proc.returncode is not None and proc.returncode < 0:
            last = f"killed by {signal.Signals(-proc.returncode).name}" + (f" ({last})" if last else "")
        reason = last or f"exit status {proc.returncode}"
        return SandboxResult(False, "failed", reason, seconds, enforced, missing, proc.pid)


@functools.cache
def probe() -> dict:
    """What this machine gives generated code: runs one empty program in the default mode;
    ``isolated`` is whether every fence holds, ``summary`` one line to print."""
    try:
        result = run_program("pass", strict=True)
    except SandboxError as err:
        return {"isolated": False, "summary": f"cannot isolate here: {err}", "missing": str(err)}
    if not result.passed:
        return {
            "isolated": False,
            "summary": f"the launcher failed: {result.reason}",
            "missing": result.reason,
        }
    return {"isolated": True, "summary": "isolated: " + "; ".join(result.enforced), "missing": ""}


def require_isolation(mode: str, job: str) -> None:
    """Stop ``job``, which will run generated code, at its start and before any model loads, where
    this node cannot isolate it and ``mode`` asks for isolation: the workflow's data_status probed
    the node snakemake runs on, and a cluster's score jobs (CPU partition) and trace and check jobs
    (GPU nodes) run elsewhere, some of them without user namespaces."""
    if parse_mode(mode) != "isolated":
        return
    found = probe()
    if not found["isolated"]:
        raise SandboxError(
            f"{job} runs generated code, and this node {found['summary']}; allow user namespaces, run"
            " as root, or opt in to limits alone with score.sandbox: rlimits (each record then says so)"
        )
