"""The sandbox's launcher: fences one program in, then becomes it. Standard library only.

Run as ``python -I -S jail.py CONFIG`` by :func:`diversed.sandbox.run_program` (``-S``: no
site-packages, so it starts in ~15 ms). The program's source arrives on stdin; what the launcher
achieved is written as one JSON object to the file descriptor ``CONFIG["report_fd"]``:
``{"enforced": [...], "missing": [...]}``. Steps, each optional where the kernel refuses it:

1. Namespaces. A non-root caller first enters a new *user* namespace that maps only its own uid
   and gid (nothing more is possible without privileges), which gives it the capabilities to build
   the others; root needs none. Then new mount, IPC and UTS namespaces, a network namespace with no
   interface up, and a PID namespace.
2. Processes. With a PID namespace the launcher forks: the child is PID 1 of the namespace (its
   *init*), the launcher waits for it outside and exits as it does. Init forks the program and
   waits for it; when init exits, or is killed because the launcher was (``PR_SET_PDEATHSIG``), the
   kernel kills every process left in the namespace, whatever it forked or ``setsid()``-ed.
3. Filesystem. Init mounts a small read-only tmpfs as the new root holding read-only binds of the
   interpreter, its standard library (its ``site-packages`` hidden), the system's shared
   libraries and ``/etc/ld.so.cache``; the ``null``, ``zero``, ``random`` and ``urandom`` devices;
   a fresh ``/proc`` of the new PID namespace; and two small private tmpfs, ``/tmp`` and
   ``/sandbox`` (the program's directory, where the program is written). It then moves that root
   over ``/`` and ``chroot``s into it. Nothing of the caller's files is reachable, and nothing
   the program writes outlives it.
4. The program: resource limits (CPU seconds, address space, file size, open files, processes,
   no core dumps), then, for a root caller, user ``nobody`` with no supplementary groups; its
   ``execve`` drops every capability (the uid it runs as is not 0 in its user namespace).

Without a mount namespace the program runs in ``CONFIG["dir"]`` on the real filesystem instead,
with ``CONFIG["fallback_interpreter"]`` (one that ``nobody`` can reach, for a root caller).
With ``CONFIG["strict"]`` the launcher refuses (exit status 125) when anything is missing.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_MOVE, MS_REC = 1024, 2048, 4096, 8192, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
PR_SET_PDEATHSIG = 1
NOBODY = 65534
REFUSED = 125
DEVICES = ("null", "zero", "random", "urandom")
# statvfs flag -> mount flag, for the flags a bind mount in a user namespace must keep
LOCKED_FLAGS = {8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME, 4096: MS_RELATIME}

libc = ctypes.CDLL(None, use_errno=True)


def _call(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _call(
        libc.mount(_bytes(source), _bytes(target), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data)),
        f"mount {target}",
    )


def unshare(flags: int, what: str) -> None:
    _call(libc.unshare(ctypes.c_int(flags)), what)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_namespaces(as_root: bool, wanted: list[str]) -> tuple[list[str], list[str], bool, bool]:
    """Unshare those of ``wanted`` (user, mount, network, pid) the kernel allows; return
    (enforced, missing, private mounts, PID namespace)."""
    enforced: list[str] = []
    missing: list[str] = []
    privileged = as_root
    if not as_root and "user" not in wanted:
        missing.append("user namespace (not asked for)")
    elif not as_root:
        uid, gid = os.getuid(), os.getgid()
        try:
            unshare(CLONE_NEWUSER, "user namespace")
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
            privileged = True
            enforced.append("user namespace")
        except OSError as err:
            missing.append(f"user namespace ({err.strerror})")
    steps = (
        ("mount", CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS, "private filesystem view (mount namespace)"),
        ("network", CLONE_NEWNET, "no network (network namespace)"),
        ("pid", CLONE_NEWPID, "own processes only (PID namespace)"),
    )
    done = []
    for key, flag, name in steps:
        try:
            if key not in wanted:
                raise PermissionError(1, "not asked for")
            if not privileged:
                raise PermissionError(1, "needs root or a user namespace")
            unshare(flag, name)
            enforced.append(name)
            done.append(flag)
        except OSError as err:
            missing.append(f"{name} ({err.strerror})")
    return enforced, missing, CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS in done, CLONE_NEWPID in done


def bind_readonly(source: str, target: str) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(source, target, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
    try:
        mount(None, target, None, flags)
    except PermissionError:  # a user namespace may not drop flags the original mount has
        held = os.statvfs(source).f_flag
        mount(None, target, None, flags | sum(ms for st, ms in LOCKED_FLAGS.items() if held & st))


def build_root(config: dict, source: bytes, owner: int | None, proc: bool) -> str:
    """Mount the program's whole world at ``config["dir"]``, enter it; return its directory."""
    root = config["dir"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for path in config["binds"]:
        bind_readonly(path, root + path)
    for path in config["hide"]:
        mount("tmpfs", root + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
    for link, points_to in config["links"].items():
        os.symlink(points_to, root + link)
    os.makedirs(root + "/dev")
    for device in DEVICES:
        open(f"{root}/dev/{device}", "a").close()
        mount(f"/dev/{device}", f"{root}/dev/{device}", None, MS_BIND)
    os.makedirs(root + "/proc")
    if proc:
        mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    size = f"size={config['disk_mb']}m"
    for path, mode in (("/tmp", "1777"), ("/sandbox", "755")):
        os.makedirs(root + path)
        mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode={mode}")
    with open(root + "/sandbox/program.py", "wb") as f:
        f.write(source)
    if owner is not None:
        for path in ("/sandbox", "/sandbox/program.py"):
            os.chown(root + path, owner, owner)
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    os.chdir(root)
    mount(root, "/", None, MS_MOVE)
    os.chroot(".")
    return "/sandbox"


def exec_program(config: dict, workdir: str, as_root: bool) -> None:
    """Limits, user, then ``execve`` of the interpreter on ``program.py`` (never returns)."""
    cpu = int(config["timeout"]) + 1
    memory = config["memory_mb"] * 2**20
    file_size = config["disk_mb"] * 2**20
    for limit, value in (
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_FSIZE, file_size),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, config["processes"]),
    ):
        resource.setrlimit(limit, (value, value))
    if as_root:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    os.chdir(workdir)
    env = {
        "HOME": workdir,
        "TMPDIR": "/tmp" if workdir == "/sandbox" else workdir,
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    interpreter = config["interpreter" if workdir == "/sandbox" else "fallback_interpreter"]
    os.execve(interpreter, [interpreter, "-I", "-B", "program.py"], env)


def exit_as(pid: int) -> None:
    """Wait for ``pid`` and end this process the way it ended (same status or same signal)."""
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


def main() -> None:
    config = json.loads(sys.argv[1])
    source = sys.stdin.buffer.read()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    as_root = os.geteuid() == 0
    enforced, missing, private_mounts, own_pids = enter_namespaces(as_root, config["namespaces"])
    if as_root:
        enforced.append("user nobody")
    enforced.append(f"process limit {config['processes']}")
    with os.fdopen(config["report_fd"], "w") as report:
        json.dump({"enforced": enforced, "missing": missing}, report)
    if config["strict"] and missing:
        print("sandbox --strict: not enforced here: " + "; ".join(missing), file=sys.stderr)
        os._exit(REFUSED)
    if own_pids:
        init = os.fork()
        if init:
            exit_as(init)  # the launcher stays outside and ends as the namespace's init does
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # from here on: PID 1 of the new namespace
    if private_mounts:
        workdir = build_root(config, source, NOBODY if as_root else None, own_pids)
    else:
        workdir = config["dir"]
        with open(os.path.join(workdir, "program.py"), "wb") as f:
            f.write(source)
    if not own_pids:
        exec_program(config, workdir, as_root)
    program = os.fork()
    if program == 0:
        exec_program(config, workdir, as_root)
    exit_as(program)


if __name__ == "__main__":
    main()
