"""``diversed tracking-server``: the MLflow server a cluster run logs to, as the README starts it.

Three things a plain ``mlflow server --host 0.0.0.0`` gets wrong on a login node, each seen there:

- MLflow 3 answers 403 "Invalid Host header" to every request whose Host is not localhost or a
  private IP: a job on another node reaching ``http://$(hostname):5000`` is refused, warns "tracking
  is off" and runs untracked. The server here allows this node's own names (``--allowed-hosts``).
- An unauthenticated server on a shared login node is open to every user of it, and to every node
  that reaches it. This one runs MLflow's basic-auth app: every request needs the user and password
  of ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``, which the jobs inherit and MLflow's
  client sends; other users get 401 and see nothing (``default_permission = NO_PERMISSIONS``).
- The auth app needs a stable secret key for its CSRF checks; it is made once, kept in the store
  folder (mode 600) with the auth settings, so a restarted server accepts the same sessions.

The UI is reached from a laptop through an SSH tunnel to the login node's loopback
(``ssh -N -L 5000:localhost:5000 login-node``), where the Host header is localhost.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
from pathlib import Path

from diversed.config import ConfigError

CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def allowed_hosts(port: int) -> list[str]:
    """The Host headers a job or a tunnel sends: this node's short and full names, and loopback."""
    names = dict.fromkeys([socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1"])
    return [host for name in names for host in (name, f"{name}:{port}")]


def _private(path: Path, text: str) -> None:
    """Write ``text`` readable by its owner alone (it holds a password or a key)."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text)


def server_command(store: Path, port: int, host: str = "0.0.0.0") -> tuple[list[str], dict[str, str]]:
    """The ``mlflow server`` command line and environment for ``store`` (created, owner-only):
    basic auth with the admin the credentials name, this node's names allowed, the runs in SQLite
    (one writer: the server) under ``store``."""
    missing = [name for name in CREDENTIALS if not os.environ.get(name)]
    if missing:
        raise ConfigError(
            f"set {' and '.join(missing)} first: the server admits only that user, and the jobs log in"
            " with the same two variables (README: On a SLURM GPU cluster)"
        )
    mlflow = shutil.which("mlflow")
    if mlflow is None:
        raise ConfigError("mlflow is not on PATH: run from the venv `make` builds (.venv/bin)")
    store = store.expanduser().resolve()
    store.mkdir(parents=True, exist_ok=True)
    store.chmod(0o700)
    key_file = store / "secret_key"
    if not key_file.exists():
        _private(key_file, secrets.token_hex(32))
    auth = store / "auth.ini"
    _private(
        auth,
        "[mlflow]\n"
        "default_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{store / 'auth.db'}\n"
        f"admin_username = {os.environ[CREDENTIALS[0]]}\n"
        f"admin_password = {os.environ[CREDENTIALS[1]]}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n",
    )
    env = {
        **os.environ,
        "MLFLOW_AUTH_CONFIG_PATH": str(auth),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": key_file.read_text().strip(),
    }
    argv = [
        mlflow,
        "server",
        "--app-name",
        "basic-auth",
        "--backend-store-uri",
        f"sqlite:///{store / 'mlruns.db'}",
        "--host",
        host,
        "--port",
        str(port),
        "--allowed-hosts",
        ",".join(allowed_hosts(port)),
    ]
    return argv, env


def require_server(local: bool) -> None:
    """A run whose jobs go to a cluster needs a tracking server: without ``MLFLOW_TRACKING_URI``
    ~50 concurrent jobs would write one SQLite file on a shared file system, whose locks NFS and
    Lustre often do not honour ("database is locked", or a corrupt store), and a job only warns."""
    if not local and not os.environ.get("MLFLOW_TRACKING_URI"):
        raise ConfigError(
            "a cluster run needs MLFLOW_TRACKING_URI (a tracking server: `diversed tracking-server`,"
            " README): its jobs would otherwise all write one SQLite file on the shared file system"
        )
