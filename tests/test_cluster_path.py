"""The paper's run as a cluster user starts it, read through Snakemake's dry run of
``--profile profiles/slurm --configfile config/paper.yaml``, offline, with the shared data:
every model job names its device and holds the only GPUs, score jobs go to the CPU partition, no
socket leaves the machine while the Snakefile is read, and the run gets what paper.yaml says and
nothing of the laptop's config/config.yaml."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_workflow import copy_workflow

from diversed.pipeline.workflow_config import validate_config

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
MODEL_RULES = {"decode", "collect_traces", "train_head", "check_head"}
DATA = Path(os.environ.get("DIVERSED_DATA_DIR") or REPO.parent / "shared" / "data")

# Imported first by every Python process of the dry run (PYTHONPATH): a connection or name lookup
# for anything but loopback raises and is counted, one line per process into NET_LOG.
BLOCK_NETWORK = """
import atexit, os, socket
attempts = []
_connect, _lookup = socket.socket.connect, socket.getaddrinfo
def connect(self, address):
    if isinstance(address, tuple) and not str(address[0]).startswith(("127.", "::1", "localhost")):
        attempts.append(address)
        raise OSError(f"network blocked by the test: {address}")
    return _connect(self, address)
def lookup(host, *args, **kwargs):
    if host not in (None, "localhost", "127.0.0.1", "::1"):
        attempts.append(host)
        raise socket.gaierror(f"network blocked by the test: {host}")
    return _lookup(host, *args, **kwargs)
socket.socket.connect, socket.getaddrinfo = connect, lookup
atexit.register(lambda: open(os.environ["NET_LOG"], "a").write(f"{len(attempts)} {attempts[:3]}\\n"))
"""


def fitting_data(tmp: Path) -> Path:
    """The shared copies, with the splits too small for paper.yaml grown by records made up here
    (new ids): the cluster path is then rendered whole; the shared copies alone are refused."""
    data = tmp / "data"
    shutil.copytree(DATA, data)
    for task, split, key, wanted in (
        ("cnndm", "test", "id", 100),
        ("wmt", "train", None, 448),
        ("xsum", "train", "id", 460),
    ):
        path = data / task / f"{split}.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for i in range(len(records), wanted):
            extra = dict(records[i % len(records)])
            if key:
                extra[key] = f"made-up-{i}"
            else:
                extra = {"translation": {k: f"{v} ({i})" for k, v in extra["translation"].items()}}
            records.append(extra)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return data


def dry_run(workdir: Path, tmp: Path, *args: str, data: Path = DATA, ok: bool = True) -> str:
    site = tmp / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCK_NETWORK)
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(site),
        "NET_LOG": str(tmp / "net.log"),
        "HF_HOME": str(tmp / "hf-home"),  # an empty cache: nothing may come from a user's own
        "DIVERSED_DATA_DIR": str(data),
    }
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    done = subprocess.run(
        [str(BIN / "snakemake"), "-n", "-p", *args], cwd=workdir, env=env, capture_output=True, text=True
    )
    assert (done.returncode == 0) == ok, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def jobs(output: str) -> list[dict[str, str]]:
    """Each job of a dry run: its rule, resources line and shell command."""
    found = []
    # a grouped job's rules are indented under their "Group job" line
    for block in re.split(r"\n(?=\s*\[[^\n]*\]\n\s*(?:local)?rule )", output):
        rule = re.search(r"^\s*(?:local)?rule (\w+):", block, re.MULTILINE)
        if rule is None:
            continue
        resources = re.search(r"^\s+resources: (.*)$", block, re.MULTILINE)
        command = re.search(r"^Shell command: (.*)$", block, re.MULTILINE)
        found.append(
            {
                "rule": rule[1],
                "resources": resources[1] if resources else "",
                "command": command[1] if command else "",
            }
        )
    return found


@pytest.fixture(scope="module")
def paper(tmp_path_factory) -> tuple[list[dict[str, str]], Path]:
    if not (DATA / "gsm8k" / "test.jsonl").exists():
        pytest.skip(f"the shared data copies are not at {DATA} (set DIVERSED_DATA_DIR)")
    tmp = tmp_path_factory.mktemp("cluster")
    workdir = copy_workflow(tmp)
    # A laptop config with values of its own: none of them may reach the paper run.
    laptop = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    laptop["head"].update(check_examples=7, check_rollouts=1, rounds=3, n_examples=11)
    laptop["models"]["quantize"] = "fp16"
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(laptop))
    output = dry_run(
        workdir,
        tmp,
        "--profile",
        "profiles/slurm",
        "--configfile",
        "config/paper.yaml",
        data=fitting_data(tmp),
    )
    (tmp / "dry-run.txt").write_text(output)
    return jobs(output), tmp


def test_the_paper_run_on_data_too_small_is_refused_before_any_job_naming_each_split(tmp_path):
    """The shared copies hold 5 XSum and 99 WMT train records and 10 CNN/DM test ones: the dry run
    stops as the Snakefile is read, in one line naming each short split, what it has and needs."""
    if not (DATA / "xsum" / "train.jsonl").exists():
        pytest.skip(f"the shared data copies are not at {DATA} (set DIVERSED_DATA_DIR)")
    workdir = copy_workflow(tmp_path)
    output = dry_run(
        workdir, tmp_path, "--profile", "profiles/slurm", "--configfile", "config/paper.yaml", ok=False
    )
    line = next(line for line in output.splitlines() if line.startswith("the data are too small"))
    assert "xsum.train holds 3, needs 448 (400 trace prompts + 48 check prompts)" in line
    assert "cnndm.test holds 10, needs 100" in line and "wmt.train holds 99" in line
    assert "mbpp" not in line  # paper.yaml's MBPP draw fits its 374 train prompts


def test_every_model_job_names_its_device_and_holds_the_only_gpus(paper):
    found, _ = paper
    counts: dict[str, int] = {}
    for job in found:
        counts[job["rule"]] = counts.get(job["rule"], 0) + 1
        model_job = job["rule"] in MODEL_RULES
        assert ("--device cuda" in job["command"]) == model_job, job  # a GPU job never falls back to the CPU
        assert ("gpu=1" in job["resources"]) == model_job, job
    # six tasks x 92 settings; one head per task on its own train split (HumanEval's on MBPP's)
    assert counts == {
        "prepare_models": 1,
        "data_status": 1,
        "collect_traces": 5,
        "train_head": 5,
        "check_head": 5,
        "decode": 552,
        "score": 552,
        "tables_and_plots": 1,
        "all": 1,
    }


def test_the_552_score_jobs_go_to_slurm_in_groups_of_24(paper):
    """One-minute jobs, one submission each, would queue 552 SLURM jobs: the profile groups them."""
    _, tmp = paper
    output = (tmp / "dry-run.txt").read_text()
    assert output.count("Group job scores") == 23  # 552 / 24


def test_score_jobs_go_to_the_cpu_partition_and_model_jobs_to_the_gpu_one(paper):
    found, _ = paper
    for job in found:
        if job["rule"] == "score":
            assert "slurm_partition=<your-cpu-partition>" in job["resources"]
        if job["rule"] in MODEL_RULES:
            assert "slurm_partition=<your-gpu-partition>" in job["resources"]


def test_downloads_and_bookkeeping_run_where_snakemake_runs():
    text = (REPO / "Snakefile").read_text()
    block = text.split("localrules:")[1].split("\n\n")[0]
    local = {name.strip(" ,") for name in block.split() if name.strip(" ,")}
    assert local == {"all", "prepare_models", "data_status", "tables_and_plots", "specbench_table"}


def test_no_socket_leaves_the_machine_while_the_workflow_is_read(paper):
    _, tmp = paper
    lines = (tmp / "net.log").read_text().splitlines()
    assert lines, "the network guard did not run"
    assert all(line.startswith("0 ") for line in lines), lines


def test_jobs_after_the_downloads_never_ask_the_hub(paper):
    found, _ = paper
    for job in found:
        if job["rule"] in MODEL_RULES - {"train_head"} | {"score"}:
            assert job["command"].lstrip("(").startswith("HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "), job


def test_the_run_gets_what_paper_yaml_says_and_nothing_of_the_laptop_config(paper):
    found, _ = paper
    by_rule: dict[str, list[str]] = {}
    for job in found:
        by_rule.setdefault(job["rule"], []).append(job["command"])
    for command in by_rule["check_head"]:
        assert "--n-examples 48 --rollouts 2" in command
    traces = by_rule["collect_traces"]
    assert all("/r1 " in c for c in traces)  # rounds: 1
    # the release's 400 prompts per task; MBPP's 326 (with the check's 48: all 374 of its train split)
    assert sorted(c.split("--n-examples ")[1].split()[0] for c in traces) == [
        "326",
        "400",
        "400",
        "400",
        "400",
    ]
    assert sorted(re.search(r"--dataset (\w+) --split (\w+)", c).groups() for c in traces) == [
        (task, "train") for task in ("cnndm", "gsm8k", "mbpp", "wmt", "xsum")
    ]
    for command in by_rule["decode"]:
        assert "--quantize none" in command and "--n-examples 100" in command
    everything = " ".join(job["command"] for job in found)
    assert "fp16" not in everything and "--n-examples 7 " not in everything and "/r3" not in everything


@pytest.mark.parametrize("path", sorted((REPO / "config").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_resolves_to_what_its_file_says(path):
    written = yaml.safe_load(path.read_text())
    resolved = yaml.safe_load(path.read_text())
    validate_config(resolved, SCHEMA)

    def leaves(tree, prefix=()):
        for key, value in tree.items():
            if isinstance(value, dict) and value:
                yield from leaves(value, (*prefix, key))
            else:
                yield (*prefix, key), value

    for keys, value in leaves(written):
        node = resolved
        for key in keys:
            node = node[key]
        assert node == value, ".".join(keys)
    schema = yaml.safe_load(SCHEMA.read_text())
    for section, spec in schema["properties"].items():  # the rest are the schema's own defaults
        for key, sub in spec.get("properties", {}).items():
            if key not in written.get(section, {}) and "default" in sub:
                assert resolved[section][key] == sub["default"], f"{section}.{key}"


def test_several_gpus_per_job_are_refused_in_one_line():
    """Parallelism is one job per GPU: a job holding two would leave one idle (no rule launches
    several processes), so the schema refuses it rather than allocate it."""
    from diversed.config import ConfigError

    config = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    config["resources"]["gpu"] = 2
    with pytest.raises(ConfigError, match=r"^resources\.gpu: 2 is greater than the maximum of 1$"):
        validate_config(config, SCHEMA)


def test_config_readme_documents_every_key_as_the_schema_says():
    from diversed.pipeline.workflow_config import reference

    expected = reference(SCHEMA)
    assert (REPO / "config" / "README.md").read_text() == expected, (
        'config/README.md is stale: python -c "from diversed.pipeline.workflow_config import reference;'
        " open('config/README.md', 'w').write(reference('workflow/schemas/config.schema.yaml'))\""
    )
    schema = yaml.safe_load(SCHEMA.read_text())
    for section, spec in schema["properties"].items():
        for key, sub in spec.get("properties", {}).items():
            assert sub.get("description"), f"{section}.{key} has no description"


def test_the_readme_gpu_install_replaces_a_cpu_torch_in_a_venv_make_built():
    """README: `make CONSTRAINTS=/dev/null test` keeps PyPI's CUDA torch. In a venv that plain
    `make` built, its stamp must not count (the file /dev/null is never newer than it), and the
    recipe must uninstall a CPU build of torch, which pip would otherwise keep."""
    command = next(
        line.split("#")[0].strip()
        for line in (REPO / "README.md").read_text().splitlines()
        if "CONSTRAINTS=/dev/null" in line and line.lstrip().startswith("make ")
    )
    assert command == "make CONSTRAINTS=/dev/null test"
    plan = subprocess.run(
        ["make", "-n", *command.split()[1:]], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert ".venv/.installed-null" in plan and "pip uninstall --quiet -y torch" in plan
    assert "-c /dev/null torch" in plan
