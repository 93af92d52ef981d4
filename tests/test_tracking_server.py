"""The README's tracking server, started as the README shows it (its own lines, read from it, on a
free port): a job reaching it by this node's name logs a run named by its cell, a request without
the user and password is refused, and a cluster run without a server is refused before any job."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from diversed.config import ConfigError
from diversed.pipeline.server import require_server

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# What a job does once the README's lines have run: log through the library, as `--track` does,
# then read the run back over REST by this node's name, with and without the credentials.
CHECK = r"""
import base64, json, os, socket, time, urllib.error, urllib.request
from pathlib import Path
from diversed.pipeline import tracking

uri = os.environ["MLFLOW_TRACKING_URI"]
assert socket.gethostname() in uri, uri

def call(endpoint, body=None, auth=True):
    data = json.dumps(body).encode() if body else None
    request = urllib.request.Request(f"{uri}/api/2.0/mlflow/{endpoint}", data=data)
    request.add_header("Content-Type", "application/json")
    if auth:
        pair = f"{os.environ['MLFLOW_TRACKING_USERNAME']}:{os.environ['MLFLOW_TRACKING_PASSWORD']}"
        request.add_header("Authorization", "Basic " + base64.b64encode(pair.encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())

for _ in range(120):  # the server starts in a few seconds (its first start creates the stores)
    try:
        call("experiments/search", {"max_results": 1})
        break
    except (urllib.error.URLError, ConnectionError):
        time.sleep(0.5)
root = Path(os.environ["ROOT"])
assert tracking.start_invocation(root) is not None
with tracking.job_run("decode gsm8k sd-k4-T1", root) as run:
    run.metrics({"acceptance_rate": 0.6})
tracking.end_invocation("FINISHED", root)
experiment = call("experiments/get-by-name?experiment_name=diversed")["experiment"]["experiment_id"]
runs = call("runs/search", {"experiment_ids": [experiment]})["runs"]
names = {r["info"]["run_name"]: r for r in runs}
assert "decode gsm8k sd-k4-T1" in names and names["decode gsm8k sd-k4-T1"]["info"]["status"] == "FINISHED"
try:
    call("experiments/search", {"max_results": 1}, auth=False)
    raise SystemExit("a request without credentials was answered")
except urllib.error.HTTPError as err:
    assert err.code == 401, err.code
print("CHECKED")
"""


def readme_server_lines(port: int) -> list[str]:
    """The README's lines that set the credentials, start the server and point the jobs at it."""
    block = re.search(
        r"\*\*On a SLURM GPU cluster\*\*.*?```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S
    )
    assert block, "README: the cluster block is gone"
    wanted = ("export MLFLOW_TRACKING_USERNAME", "diversed tracking-server", "export MLFLOW_TRACKING_URI")
    lines = [line.split("  #")[0].strip() for line in block[1].splitlines() if line.startswith(wanted)]
    assert [next(w for w in wanted if line.startswith(w)) for line in lines] == list(wanted), lines
    return [line.replace("5000", str(port)) for line in lines]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def test_the_readme_server_takes_runs_by_hostname_and_refuses_strangers(tmp_path):
    if subprocess.run(["openssl", "version"], capture_output=True).returncode != 0:
        pytest.skip("openssl is not installed (the README's password line uses it)")
    credentials, server, uri = readme_server_lines(free_port())
    script = "\n".join(
        [
            "set -e",
            credentials,
            f"{server.rstrip('&').strip()} > {tmp_path}/server.log 2>&1 &",
            "server=$!",
            "trap 'kill $server' EXIT",  # the process this script started, by its PID
            uri,
            'python -c "$CHECK"',
        ]
    )
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "CHECK": CHECK,
        "ROOT": str(tmp_path / "job"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "USER": os.environ.get("USER") or "tester",  # a login shell sets it; CI's may not
    }
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(name, None)
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=240)
    log = (tmp_path / "server.log").read_text() if (tmp_path / "server.log").exists() else ""
    assert done.returncode == 0 and "CHECKED" in done.stdout, done.stdout + done.stderr[-3000:] + log[-3000:]
    store = tmp_path / "diversed-mlflow"
    assert (
        oct(store.stat().st_mode & 0o777) == "0o700"
        and oct((store / "auth.ini").stat().st_mode & 0o777) == "0o600"
    )


def test_a_cluster_run_without_a_server_is_refused_and_a_local_one_is_not(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    require_server(local=True)
    with pytest.raises(ConfigError, match="a cluster run needs MLFLOW_TRACKING_URI"):
        require_server(local=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://login:5000")
    require_server(local=False)


def test_the_server_wants_the_credentials_the_jobs_use(monkeypatch, tmp_path):
    from diversed.pipeline.server import server_command

    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    with pytest.raises(ConfigError, match="set MLFLOW_TRACKING_PASSWORD first"):
        server_command(tmp_path / "store", 5000)
