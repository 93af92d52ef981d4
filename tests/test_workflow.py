"""The Snakemake workflow on .test/config/config.yaml: end to end (jobs logging to a real MLflow server),
incremental reruns, config errors.

The workflow files and the library source are copied into a temporary folder, so the tests can edit
config values and library modules and ask Snakemake (dry runs) what it would rerun.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def snakemake(
    workdir: Path, *args: str, check: bool = True, tracking_uri: str | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    done = subprocess.run(
        [str(BIN / "snakemake"), *args], cwd=workdir, env=env, capture_output=True, text=True, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(done.stdout[-3000:] + done.stderr[-3000:])
    return done


def planned(output: str) -> dict[str, int]:
    """The dry run's 'Job stats' table as {rule: count}."""
    if "Nothing to be done" in output:
        return {}
    table = output.split("Job stats:")[1].split("Reasons:")[0]
    return {m[0]: int(m[1]) for m in re.findall(r"^(\w+)\s+(\d+)$", table, re.MULTILINE) if m[0] != "total"}


def write_config(workdir: Path, name: str, edit) -> str:
    config = yaml.safe_load((workdir / ".test" / "config" / "config.yaml").read_text())
    edit(config)
    path = workdir / "config" / name
    path.write_text(yaml.safe_dump(config))
    return f"config/{name}"


def copy_workflow(root: Path) -> Path:
    for item in ("Snakefile", "workflow", "config", ".test", "profiles", "diversed", "environment.yml"):
        source = REPO / item
        (shutil.copytree if source.is_dir() else shutil.copy)(source, root / item)
    return root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rest(server: str, endpoint: str, body: dict | None = None) -> dict:
    """One call of the MLflow REST API (GET, or POST with a JSON body)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{server}/api/2.0/mlflow/{endpoint}", data=data)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> Iterator[str]:
    """A real `mlflow server` on 127.0.0.1 with its own store, as users browse runs."""
    store = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
    server = subprocess.Popen(
        [
            str(BIN / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{store / 'mlflow.db'}",
            "--default-artifact-root",
            (store / "artifacts").as_uri(),
        ],
        cwd=store,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(store / "server.log", "w"),  # noqa: SIM115
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((store / "server.log").read_text()[-3000:]) from None
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, mlflow_server) -> Path:
    """The whole ci workflow, two jobs at a time, every job logging to the real server."""
    root = copy_workflow(tmp_path_factory.mktemp("wf"))
    snakemake(root, "--configfile", ".test/config/config.yaml", "--cores", "2", tracking_uri=mlflow_server)
    return root


def test_whole_dag_produces_tables_plots_and_report(workdir):
    for path in ("results/tables/main.md", "results/tables/main.csv", "results/tables/main.tex"):
        assert (workdir / path).stat().st_size > 0
    plots = ["quality_vs_acceptance", "quality_vs_time", "speedup_vs_draft_length"]
    with_head = bool(os.environ.get("DIVERSED_DATA_DIR"))  # without MBPP train, diversed is skipped
    for name in plots + ["w_test_histogram"] * with_head:
        assert (workdir / "results" / "plots" / f"{name}.png").exists()
        assert (workdir / "results" / "plots" / f"{name}.svg").exists()
    table = (workdir / "results/tables/main.md").read_text()
    for method in ("auto", "sd", "lossy", "static w=0.5", "cascade"):
        assert method in table
    assert "95% bootstrap interval" in table and "humaneval n = 2" in table and " [" in table
    weights = (workdir / "results/tables/weights.md").read_text()  # the head's w on its test tokens
    if with_head:
        assert "humaneval" in weights and "w digit (n)" in weights
    else:
        assert "No setting with per-token weights ran." in weights
    paired = (workdir / "results/tables/paired_vs_sd.md").read_text()
    assert "| pass@1 " in paired and "delta quality" in paired and "delta acceptance" in paired
    assert "lossy" in paired
    verdict = (workdir / "results/tables/frontier.md").read_text()  # declared, so in the HTML report too
    assert verdict.startswith("Each relaxed rule minus the static frontier")
    snakemake(workdir, "--configfile", ".test/config/config.yaml", "--report", "results/report.html")
    assert (workdir / "results/report.html").stat().st_size > 100_000


def test_head_rounds_chain_and_the_diversed_cell_uses_the_last(workdir):
    if not os.environ.get("DIVERSED_DATA_DIR"):
        pytest.skip("HumanEval's head trains on MBPP train: set DIVERSED_DATA_DIR (.ci/run does)")
    heads = workdir / "results" / "heads" / "mbpp"
    card = json.loads((heads / "s42" / "r2" / "head.json").read_text())
    assert card["init"] == "results/heads/mbpp/s42/r1" and len(card["traces"]) == 2
    assert card["selection"]["chosen"] in card["selection"]["candidates"]
    check = card["check"]  # checked on-policy against the static rule at its own mean w, and kept
    assert "verdict" in check and (check["rollouts"] == 4 or card["untrained"])  # 2 prompts x 1 x 2 arms
    assert {"w_mean", "w_std", "w_below_0.1", "w_above_0.9"} <= set(card["metrics"])
    assert (heads / "s42" / "r2" / "w_histogram.png").stat().st_size > 0
    second = json.loads((workdir / "results" / "traces" / "mbpp" / "r2" / "manifest.json").read_text())
    assert second["settings"]["head"] == "results/heads/mbpp/s42/r1"  # round 2 sampled from round 1's head
    decoded = json.loads((workdir / "results" / "scores" / "humaneval" / "diversed-k3-T0.json").read_text())
    assert decoded["settings"]["head"] == "results/heads/mbpp/s42/r2"
    assert decoded["head_check"] == {"untrained": card["untrained"], "verdict": check["verdict"]}
    table = (workdir / "results/tables/main.md").read_text()
    label = "untrained head = static w=0.5" if card["untrained"] else "diversed s42"
    assert f"| {label} k=3 T=0 " in table and "DIVERSED heads learned on: humaneval <- mbpp" in table


def test_second_run_has_nothing_to_do(workdir):
    done = snakemake(workdir, "-n", "--configfile", ".test/config/config.yaml")
    assert "Nothing to be done" in done.stdout + done.stderr


def test_changed_setting_reruns_only_its_jobs(workdir):
    def more_lenient(config):
        config["decode"]["grid"][2] = {"method": "lossy", "lenience": 0.7}

    done = snakemake(workdir, "-n", "--configfile", write_config(workdir, "lenient.yaml", more_lenient))
    assert planned(done.stdout) == {"decode": 1, "score": 1, "tables_and_plots": 1, "all": 1}


def test_changed_param_reruns_dependents_only(workdir):
    def fewer_tokens(config):
        config["decode"]["max_new_tokens"] = 7

    done = snakemake(workdir, "-n", "--configfile", write_config(workdir, "tokens.yaml", fewer_tokens))
    jobs = planned(done.stdout)
    assert jobs["decode"] == jobs["score"] > 1
    assert "prepare_models" not in jobs and "collect_traces" not in jobs and "train_head" not in jobs


def test_a_grown_cell_decodes_only_its_new_examples(workdir, tmp_path):
    """n_examples 2 -> 3: the decode job adopts the two rows it has (their batch timings unchanged,
    so they were not decoded again) and decodes the third; the other cells are not touched."""
    grown = shutil.copytree(workdir, tmp_path / "wf")  # the module's workdir stays as it was
    cell = "results/decode/humaneval/sd-k3-T0.jsonl"
    before = [json.loads(line) for line in (grown / cell).read_text().splitlines()]

    def more(config):
        config["data"]["n_examples"] = 3

    snakemake(grown, "--configfile", write_config(grown, "more.yaml", more), "--cores", "2", cell)
    after = [json.loads(line) for line in (grown / cell).read_text().splitlines()]
    assert len(before) == 2 and len(after) == 3
    assert [(r["id"], r["batch"], r["token_ids"]) for r in after[:2]] == [
        (r["id"], r["batch"], r["token_ids"]) for r in before
    ]
    assert {r["settings"]["n_examples"] for r in after} == {3}


def own_code_changed(output: str) -> set[str]:
    """The rules a dry run reruns because their own params changed (the code hash is one), not
    because a job upstream of them reruns."""
    reasons = output.split("Reasons:")[1] if "Reasons:" in output else ""
    found = re.search(r"params have changed since last execution:\n\s+(.*)\n", reasons)
    return set(found[1].split(", ")) if found else set()


HEAD_RULES = {"collect_traces"}  # check_head reruns too, after the traces (input updated)


@pytest.mark.parametrize(
    ("module", "own", "with_head"),
    [
        # the issue's three: the runner's users, the reward's users, the plots' one user
        ("jobs/runner.py", {"decode"}, HEAD_RULES),
        ("evaluation/metrics.py", {"score"}, HEAD_RULES),
        ("evaluation/plots.py", {"tables_and_plots"}, set()),
        ("evaluation/report.py", {"tables_and_plots"}, set()),
        # every model job reads the config; prepare_models is the first, all others follow it
        ("config.py", {"prepare_models"}, set()),
    ],
)
def test_library_change_reruns_the_rules_whose_imports_reach_it(workdir, module, own, with_head):
    """No list of files is kept by hand: a rule's code hash is the import closure of the modules
    its command calls (diversed/pipeline/code_hash.py), so each edit reruns exactly its users."""
    output = dry_run_after_editing(workdir, module)
    head = (workdir / "results" / "traces").is_dir()
    assert own_code_changed(output) == own | (with_head if head else set())
    if module == "evaluation/plots.py":
        assert set(planned(output)) == {"tables_and_plots", "all"}


def test_a_cuda_backend_change_reruns_every_model_job(workdir):
    """GPU cells compute with backends/cuda: a change there reruns them (and what they feed) even
    where the DAG itself ran on a CPU. The head's jobs are in the DAG only where MBPP is found."""
    jobs = planned_after_editing(workdir, "backends/cuda/graphs.py")
    head = (workdir / "results" / "traces").is_dir()
    expected = {"decode", "score", "tables_and_plots", "all"}
    assert set(jobs) == expected | ({"collect_traces", "train_head", "check_head"} if head else set())


def dry_run_after_editing(workdir: Path, module: str) -> str:
    """The dry run's output with one library module edited (and restored after)."""
    path = workdir / "diversed" / module
    original = path.read_text()
    try:
        path.write_text(original + "\n# an edit\n")
        return snakemake(workdir, "-n", "--configfile", ".test/config/config.yaml").stdout
    finally:
        path.write_text(original)


def planned_after_editing(workdir: Path, module: str) -> dict[str, int]:
    """The dry run's jobs with one library module edited (and restored after)."""
    return planned(dry_run_after_editing(workdir, module))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["decode"]["grid"].append({"method": "static", "target_weight": 1.5}), "target_weight"),
        (lambda c: c["data"].update(datasets=["humaneval"], n_exemples=3), "n_exemples"),
        (lambda c: c["decode"]["grid"].append({"method": "medusa"}), "medusa"),
    ],
)
def test_bad_config_stops_naming_the_key(workdir, edit, message):
    done = snakemake(workdir, "-n", "--configfile", write_config(workdir, "bad.yaml", edit), check=False)
    assert done.returncode != 0
    output = done.stdout + done.stderr
    line = next(line for line in output.splitlines() if message in line)
    assert line.startswith(("data.", "decode.grid[")), line  # the key or grid entry, in one line
    assert "Failed validating" not in output and len(output.splitlines()) < 15  # no schema dump


def test_every_job_is_a_finished_child_run_on_the_mlflow_server(workdir, mlflow_server):
    """Through the REST API, as the UI reads it: the invocation run and one FINISHED child per
    tracked job, each with its params, metrics and artifacts."""
    experiment = rest(mlflow_server, "experiments/get-by-name?experiment_name=diversed")["experiment"]
    runs = rest(
        mlflow_server, "runs/search", {"experiment_ids": [experiment["experiment_id"]], "max_results": 1000}
    )
    runs = runs["runs"]
    tags = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs}
    invocations = [r for r in runs if r["info"]["run_name"] == "snakemake-invocation"]
    assert len(invocations) == 1 and invocations[0]["info"]["status"] == "FINISHED"
    parent = invocations[0]["info"]["run_id"]
    assert {m["key"]: m["value"] for m in invocations[0]["data"]["metrics"]}["jobs_failed_to_log"] == 0
    children = [r for r in runs if tags[r["info"]["run_id"]].get("mlflow.parentRunId") == parent]
    assert len(children) == len(runs) - 1  # nothing logged outside the invocation
    per_stage = Counter(tags[r["info"]["run_id"]]["stage"] for r in children)
    decoded = sorted(p.stem for p in (workdir / "results" / "decode" / "humaneval").glob("*.jsonl"))
    # each run is named by its cell, as a user finds it in the UI's list, not by its rule
    names = {r["info"]["run_name"] for r in children}
    assert {f"decode humaneval {cell}" for cell in decoded} | {
        f"score humaneval {cell}" for cell in decoded
    } <= names
    decoded = len(decoded)
    assert per_stage["decode"] == per_stage["score"] == decoded and per_stage["report"] == 1
    if os.environ.get("DIVERSED_DATA_DIR"):  # the head's two rounds
        assert per_stage["collect_traces"] == per_stage["train_head"] == 2
    for run in children:
        name = run["info"]["run_name"]
        assert run["info"]["status"] == "FINISHED", run["info"]
        assert run["data"].get("params"), name
        assert run["data"].get("metrics") or name == "report", name  # the report's products are files
    for stage in ("decode", "report"):
        run = next(r for r in children if tags[r["info"]["run_id"]]["stage"] == stage)
        files = rest(mlflow_server, f"artifacts/list?run_id={run['info']['run_id']}").get("files", [])
        assert files, f"the {stage} run has no artifacts"


def test_a_job_that_could_not_log_is_counted_and_printed(tmp_path, monkeypatch):
    from diversed.pipeline import tracking

    root = tmp_path / "mlflow"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store.db'}")
    assert tracking.start_invocation(root) is not None
    with tracking.job_run("decode", root) as run:
        run.metrics({"acceptance": 0.5})  # a job that logs fine
    with tracking.job_run("score", root) as run:
        run.metrics({"bad name!": 1.0})  # MLflow rejects the metric name
    assert "score:" in (root / tracking.FAILED_LOGS).read_text()
    assert tracking.end_invocation("FINISHED", root) == 1
