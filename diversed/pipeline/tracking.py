"""MLflow tracking for workflow jobs: one parent run per invocation, one child run per job.

Used by the CLI (``diversed --track STAGE ...``), never by the decoding core. The store is
``MLFLOW_TRACKING_URI``, else SQLite at ``results/mlflow/mlruns.db``; the parent run's id is read
from ``results/mlflow/parent_run_id`` (written by the Snakefile's ``onstart``), which reaches jobs
on any executor through the shared file system. Telemetry is off. Tracking never fails a job: any
error becomes a warning, and a line in ``results/mlflow/failed_logs``; at the end of the run the
invocation records how many jobs failed to log (``jobs_failed_to_log``) and ``snakemake`` prints
it, so a run whose jobs are missing from the UI says so.

A job's run is kept by a process of its own (``python -m diversed.pipeline.tracking``), fed one JSON line
per call: importing MLflow and opening its store cost ~1.3 s of one core, which a decode job spent
before loading its models; in a second process they overlap the job's own imports on the other
core. The job's exit closes the run (FINISHED, or FAILED if it raised); a job killed outright
closes the pipe without a word, and its run ends KILLED instead of staying RUNNING forever.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EXPERIMENT = "diversed"
DEFAULT_DIR = Path("results") / "mlflow"
FAILED_LOGS = "failed_logs"


def record_failure(stage: str, err: Exception, root: Path = DEFAULT_DIR) -> None:
    """One line per job that could not be logged (an append of one short line is atomic)."""
    warnings.warn(f"MLflow logging failed for {stage}: {err}", stacklevel=3)
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        first_line = (str(err).splitlines() or [type(err).__name__])[0][:200]
        with (root / FAILED_LOGS).open("a") as log:
            log.write(f"{os.getpid()} {stage}: {first_line}\n")


def tracking_uri(root: Path = DEFAULT_DIR) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(root / 'mlruns.db').resolve()}"


# A tracking server that refuses or hangs must cost a job seconds, not minutes: MLflow's own defaults
# (7 retries with backoff 2, 120 s per request) held a 2-example decode for 251 s before it warned,
# a GPU idle all that time. Two quick retries and 5 s per request; set them to override.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
}


def _mlflow(root: Path = DEFAULT_DIR):
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    import mlflow

    root.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(tracking_uri(root))
    if mlflow.get_experiment_by_name(EXPERIMENT) is None:
        mlflow.create_experiment(EXPERIMENT, artifact_location=(root / "artifacts").resolve().as_uri())
    mlflow.set_experiment(EXPERIMENT)
    return mlflow


def start_invocation(root: Path = DEFAULT_DIR, tags: dict[str, str] | None = None) -> str | None:
    """Create the store and the parent run, before any job starts.

    A new SQLite store must be created once: parallel first writes to it fail in migrations.
    """
    try:
        mlflow = _mlflow(root)
        run = mlflow.MlflowClient().create_run(
            mlflow.get_experiment_by_name(EXPERIMENT).experiment_id,
            run_name="snakemake-invocation",
            tags=tags or {},
        )
        (root / "parent_run_id").write_text(run.info.run_id)
        (root / FAILED_LOGS).unlink(missing_ok=True)
        return run.info.run_id
    except Exception as err:  # noqa: BLE001 - tracking must never fail the workflow
        warnings.warn(f"MLflow tracking is off for this invocation: {err}", stacklevel=2)
        return None


def end_invocation(status: str, root: Path = DEFAULT_DIR) -> int:
    """Close the parent run with how many jobs failed to log (returned, and printed when any)."""
    failed_log = root / FAILED_LOGS
    failed = (
        {line.split(":")[0] for line in failed_log.read_text().splitlines()} if failed_log.exists() else set()
    )
    if failed:
        print(f"MLflow: {len(failed)} job(s) could not be logged; see {failed_log}")
    try:
        path = root / "parent_run_id"
        if path.exists():
            client = _mlflow(root).MlflowClient()
            run_id = path.read_text().strip()
            client.log_metric(run_id, "jobs_failed_to_log", len(failed))
            client.set_terminated(run_id, status)
    except Exception as err:  # noqa: BLE001
        warnings.warn(f"could not close the MLflow parent run: {err}", stacklevel=2)
    return len(failed)


class JobRun:
    """What a job logs; every call is a no-op when tracking is unavailable."""

    def __init__(self, mlflow: Any | None, stage: str = "", root: Path = DEFAULT_DIR) -> None:
        self.mlflow = mlflow
        self.stage = stage
        self.root = root
        self.failed = False
        self.error = ""

    def _safe(self, fn, *args, **kwargs) -> None:
        if self.mlflow is None:
            return
        try:
            fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            if not self.failed:  # one line per job
                record_failure(self.stage, err, self.root)
                self.error = (str(err).splitlines() or [type(err).__name__])[0]
            self.failed = True

    def params(self, values: dict[str, Any]) -> None:
        flat = {k: str(v)[:500] for k, v in values.items() if v is not None}
        self._safe(lambda: self.mlflow.log_params(flat))

    def metrics(self, values: dict[str, Any], step: int | None = None) -> None:
        numeric = {k: float(v) for k, v in values.items() if isinstance(v, int | float)}
        for key, value in values.items():  # a figure's interval "<f>_ci": [low, high]
            if key.endswith("_ci") and isinstance(value, list) and len(value) == 2:
                numeric[f"{key}_low"], numeric[f"{key}_high"] = (float(v) for v in value)
        numeric = {k.replace("@", "_at_"): v for k, v in numeric.items()}
        self._safe(lambda: self.mlflow.log_metrics(numeric, step=step))

    def end(self, status: str) -> None:
        """Close the run; one whose logging failed part-way ends FAILED with the reason as a tag,
        so the UI never shows an incomplete record as a finished job."""
        if self.failed and self.mlflow is not None:
            with contextlib.suppress(Exception):
                self.mlflow.set_tag("diversed.logging", f"incomplete: {self.error}"[:500])
            status = "FAILED"
        self._safe(lambda: self.mlflow.end_run(status))

    def artifact(self, path: str | Path) -> None:
        """A file or a folder (a head: its weights, card and plot; a trace collection logs only
        its manifest, see the CLI)."""
        path = Path(path)
        if path.is_file():
            self._safe(lambda: self.mlflow.log_artifact(str(path)))
        elif path.is_dir():
            self._safe(lambda: self.mlflow.log_artifacts(str(path), artifact_path=path.name))


def tracking_off(stage: str, err: Exception, root: Path) -> None:
    """Warn that a job runs untracked; inside a tracked invocation, count it as a job that failed to log."""
    warnings.warn(f"MLflow tracking is off for this job: {err}", stacklevel=3)
    if (root / "parent_run_id").exists():
        record_failure(stage, err, root)


def _start_run(stage: str, root: Path, start_ms: int) -> JobRun:
    """The job's MLflow run, started at ``start_ms`` (when the job began, not when this process got
    there, so stage times stay whole); a :class:`JobRun` that logs nothing when the store fails."""
    try:
        mlflow = _mlflow(root)
        parent_file = root / "parent_run_id"
        tags = {"stage": stage.split()[0]}  # the rule; the run's name also names its cell
        if parent_file.exists():
            tags["mlflow.parentRunId"] = parent_file.read_text().strip()
        experiment = mlflow.get_experiment_by_name(EXPERIMENT).experiment_id
        run = mlflow.MlflowClient().create_run(experiment, start_time=start_ms, tags=tags, run_name=stage)
        mlflow.start_run(run_id=run.info.run_id)
    except Exception as err:  # noqa: BLE001
        tracking_off(stage, err, root)
        return JobRun(None)
    return JobRun(mlflow, stage, root)


def serve(stage: str, root: Path, start_ms: int, lines: Iterator[str]) -> str:
    """The tracking process: apply each ``[method, *args]`` line to the job's run until
    ``["end", status]``, or end the run KILLED when the job's pipe closes first; return the status."""
    run = _start_run(stage, root, start_ms)
    status = "KILLED"
    for line in lines:
        method, *args = json.loads(line)
        if method == "end":
            status = args[0]
            break
        getattr(run, method)(*args)
    run.end(status)
    return status


class _PipedRun:
    """The job's side of :class:`JobRun`: each call becomes one line to the tracking process (none
    when it could not start: then every call is a no-op, as for a broken store)."""

    def __init__(self, process: subprocess.Popen | None) -> None:
        self.process = process

    def _send(self, *call: Any) -> None:
        if self.process is None:
            return
        with contextlib.suppress(OSError):  # the tracking process is gone: it recorded why
            self.process.stdin.write(json.dumps(call, default=str) + "\n")
            self.process.stdin.flush()

    def params(self, values: dict[str, Any]) -> None:
        self._send("params", values)

    def metrics(self, values: dict[str, Any], step: int | None = None) -> None:
        self._send("metrics", values, step)

    def artifact(self, path: str | Path) -> None:
        self._send("artifact", str(path))

    def close(self, status: str) -> None:
        if self.process is None:
            return
        self._send("end", status)
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        self.process.wait()


@contextlib.contextmanager
def job_run(stage: str, root: Path = DEFAULT_DIR) -> Iterator[_PipedRun]:
    """A child run of the invocation's parent (or a plain run when there is none), kept by a
    tracking process beside the job (see above); it ends FINISHED, or FAILED if the job raised."""
    command = [
        sys.executable,
        "-m",
        "diversed.pipeline.tracking",
        stage,
        str(root),
        str(int(time.time() * 1000)),
    ]
    try:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, text=True)
    except OSError as err:
        tracking_off(stage, err, root)
        process = None
    run = _PipedRun(process)
    status = "FAILED"
    try:
        yield run
        status = "FINISHED"
    finally:
        run.close(status)


def stage_times(root: Path = DEFAULT_DIR) -> dict[str, dict[str, float]]:
    """Jobs and summed wall seconds per stage over every finished run of the store: the per-stage
    times a study's record reports (jobs that ran in parallel each count their own time)."""
    client = _mlflow(root).MlflowClient()
    experiment = client.get_experiment_by_name(EXPERIMENT)
    times: dict[str, dict[str, float]] = {}
    for run in client.search_runs([experiment.experiment_id], max_results=50_000):
        stage = run.data.tags.get("stage")
        if stage and run.info.status == "FINISHED" and run.info.end_time:
            entry = times.setdefault(stage, {"jobs": 0, "seconds": 0.0})
            entry["jobs"] += 1
            entry["seconds"] += (run.info.end_time - run.info.start_time) / 1000
    return times


if __name__ == "__main__":  # the tracking process of one job (see job_run)
    for signum in (signal.SIGINT, signal.SIGTERM):  # outlive the job's signals: its closed pipe ends the run
        signal.signal(signum, signal.SIG_IGN)
    serve(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), iter(sys.stdin))
