"""Generated code on a node that cannot isolate it: a non-root user with user namespaces off.

The node is made for real: a user namespace whose own limit on nested user namespaces is 0, entered
as uid 1000 (mapped onto the caller's uid, so files stay readable). There the sandbox gets no
namespace at all, as on a cluster node without unprivileged user namespaces. ``data status`` (the
workflow's first job) must name the node and stop; ``--sandbox rlimits`` is the explicit opt-in, and
then every score record says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent

NO_USERNS = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
ready_r, ready_w = os.pipe()
child = os.fork()
if child == 0:
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        sys.exit(f"unshare: {os.strerror(ctypes.get_errno())}")
    os.write(ready_w, b"x")
    os.read(r, 1)  # the parent wrote the maps
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")  # user namespaces off below this one
    os.setresgid(1000, 1000, 1000)
    os.setresuid(1000, 1000, 1000)  # a non-root user: no capability left
    os.execvp(sys.argv[1], sys.argv[1:])
os.read(ready_r, 1)
for name, text in (("setgroups", "deny"), ("uid_map", "1000 0 1"), ("gid_map", "1000 0 1")):
    with open(f"/proc/{child}/{name}", "w") as f:
        f.write(text)
os.write(w, b"x")
sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
"""


@pytest.fixture(scope="module")
def as_user_without_userns(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root to build the node (a user namespace with uid 1000 mapped)")
    script = tmp_path_factory.mktemp("node") / "no_userns.py"
    script.write_text(NO_USERNS)

    def run(*command: str, cwd: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(script), *command], cwd=cwd, capture_output=True, text=True, timeout=300
        )

    probe = run("sh", "-c", "id -u; unshare -U true", cwd=script.parent)
    if probe.stdout.split()[:1] != ["1000"] or probe.returncode == 0:
        pytest.skip(f"could not build a node without user namespaces here: {probe.stderr.strip()[:200]}")
    return run


def test_a_node_that_cannot_isolate_is_named_before_any_job(as_user_without_userns, tmp_path):
    done = as_user_without_userns(
        str(BIN / "diversed"), "data", "status", "--datasets", "humaneval", cwd=tmp_path
    )
    assert done.returncode == 2
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1
    assert "humaneval run generated code, and this node cannot isolate here" in message
    assert "score.sandbox: rlimits" in message


def test_rlimits_is_an_opt_in_that_every_record_states(
    as_user_without_userns, tmp_path, canonical_decode_file
):
    status = as_user_without_userns(
        str(BIN / "diversed"),
        "data",
        "status",
        "--datasets",
        "humaneval",
        "--sandbox",
        "rlimits",
        cwd=tmp_path,
    )
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["sandbox"]["mode"] == "rlimits"
    canonical_decode_file(2, "in.jsonl")
    score = [str(BIN / "diversed"), "score", "--dataset", "humaneval", "--in", "in.jsonl", "--out", "m.json"]
    refused = as_user_without_userns(*score, cwd=tmp_path)
    assert refused.returncode == 2 and "not enforced here" in refused.stderr
    scored = as_user_without_userns(*score, "--sandbox", "rlimits", cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr
    result = json.loads((tmp_path / "m.json").read_text())
    assert result["sandbox"] == "rlimits" and result["pass@1"] == 100.0
    for row in result["per_example"]:
        assert row["sandbox"].startswith("rlimits: missing ") and "network namespace" in row["sandbox"]


@pytest.mark.parametrize(
    "command",
    [
        ("collect-traces", "--dataset", "mbpp", "--out", "traces"),
        ("score", "--dataset", "humaneval", "--in", "in.jsonl", "--out", "m.json"),
    ],
)
def test_every_job_that_runs_generated_code_probes_its_own_node_first(
    as_user_without_userns, tmp_path, canonical_decode_file, command
):
    """data_status probed the node snakemake runs on; a cluster's trace, check and score jobs run on
    other nodes. Each stops at its start, before any model loads (the target named here does not
    exist: the sandbox is refused first) and before it reads any data."""
    canonical_decode_file(2, "in.jsonl")
    models = ("--target", "no/such-model", "--draft", "no/such-draft") if command[0] != "score" else ()
    done = as_user_without_userns(str(BIN / "diversed"), *command, *models, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    message = done.stderr.strip().splitlines()[-1]
    assert f"{command[0]} {command[2]} runs generated code, and this node cannot isolate here" in message
    assert not (tmp_path / "traces").exists()
