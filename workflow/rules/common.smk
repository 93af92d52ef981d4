# Helpers shared by the rules: config validation, the dataset list, the method grid, code hashes,
# and the MLflow invocation hooks. All logic lives in the diversed library; this file only wires it.
import json
import os
import warnings
from pathlib import Path

from diversed.data import resolve
from diversed.pipeline import code_hash as hashes
from diversed.pipeline.grid import cli_flags, expand
from diversed.data.sizes import check_draws, draw_flags, local_size
from diversed.pipeline.workflow_config import config_draws, job_device, trace_prompts, validate_config

validate_config(config, Path(workflow.current_basedir).parent / "schemas" / "config.schema.yaml")

MODELS = config["models"]
DATA = config["data"]
DECODE = config["decode"]
HEAD = config["head"]
GPU = config["resources"]["gpu"]
DEVICE = job_device(MODELS["device"], GPU)  # a job that holds a GPU runs on it or stops, never on the CPU
SANDBOX = config["score"]["sandbox"]
# Jobs after prepare_models and data_status find models and data in the local caches: they never
# ask the hub (cluster nodes often cannot reach it, and 1,000 jobs should not try).
OFFLINE = "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1"


REPO = Path(workflow.basedir)  # the checkout, where the Snakefile is
# Every rule's software: the diversed package and its pinned stack. `make` installs it into .venv,
# which jobs use as they are; `--software-deployment-method conda` builds this environment instead.
SOFTWARE = str(REPO / "environment.yml")


def code_hash(*modules):
    """params.src of a rule: the import closure of the library modules its command calls, read from
    this checkout's source (diversed/pipeline/code_hash.py), so an edit reruns exactly its users."""
    return hashes.code_hash(*modules, library=REPO / "diversed")


def _resolve_datasets():
    """Where each dataset comes from, read from local files only (this runs at every parse, inside
    every cluster job too): "hub" ones are fetched once by the data_status rule before any job."""
    status = {d: resolve(d, DATA["split"], DATA["dir"], DATA["allow_hub"]) for d in DATA["datasets"]}
    missing = [d for d, where in status.items() if where == "missing"]
    if missing and DATA["missing"] == "error":
        raise ValueError(
            f"datasets that cannot be had: {', '.join(missing)} (data.dir={DATA['dir']!r}, "
            f"allow_hub={DATA['allow_hub']}, HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE')!r});"
            " `diversed doctor` shows how to provide them"
        )
    for d in missing:
        warnings.warn(f"skipping dataset {d}: no local copy under data.dir and no hub access (see `diversed doctor`)")
    return status


DATA_STATUS = _resolve_datasets()
DATASETS = [d for d, where in DATA_STATUS.items() if where != "missing"]
# Head seeds: each trains its own head (and MLflow run) on the same traces; several need one round,
# since round r > 1 samples its traces from round r - 1's head.
SEEDS = HEAD["seeds"] or [HEAD["seed"]]
if len(SEEDS) > 1 and HEAD["rounds"] > 1:
    raise ValueError("head.seeds: several seeds need head.rounds: 1 (later rounds sample from one head)")
SETTINGS = expand(
    DECODE["grid"],
    DECODE["draft_lengths"],
    DECODE["temperatures"],
    {"max_new_tokens": DECODE["max_new_tokens"]},
    SEEDS,
)


wildcard_constraints:
    round=r"\d+",
    seed=r"\d+",
    train_dataset=r"[\w.]+",


def as_list(value):
    return value if isinstance(value, list) else [value]


def head_path(train_dataset, round, seed=None):
    """The checked head of a training dataset, round and seed (the first seed by default)."""
    return f"results/heads/{train_dataset}/s{SEEDS[0] if seed is None else seed}/r{round}"


def previous_head(wildcards):
    """Round r > 1 trains from round r - 1's head of its seed (and samples its traces from it)."""
    r = int(wildcards.round)
    seed = getattr(wildcards, "seed", None)
    return [head_path(wildcards.train_dataset, r - 1, seed)] if r > 1 else []


def head_dataset(dataset):
    """The traces that train the head used on ``dataset``: "name" (its ``head.split``) or
    "name.split", e.g. HumanEval's head learns on "mbpp" (it has no train split of its own)."""
    return HEAD["train_dataset"].get(dataset, dataset)


def head_source(source):
    """(dataset, split) of a head's training source "name" or "name.split"."""
    name, _, split = source.partition(".")
    return name, split or HEAD["split"]


def head_sources():
    """Every training source "name.split" a head of this run learns on (for data_status to fetch)."""
    if not HEAD["enabled"] or not any(v["method"] == "diversed" for v in SETTINGS.values()):
        return []
    return sorted({".".join(head_source(head_dataset(d))) for d in DATASETS if head_available(d)})


def head_available(dataset):
    name, split = head_source(head_dataset(dataset))
    return HEAD["enabled"] and resolve(name, split, DATA["dir"], DATA["allow_hub"]) != "missing"


def data_draws():
    """What this run takes from each split; the local copies are sized now (a line count), before
    any job, and data_status sizes every split again once the hub's are fetched."""
    draws = config_draws(config, SETTINGS, DATASETS, head_sources())
    sizes = {}
    for key in draws:
        name, _, split = key.partition(".")
        sizes[key] = local_size(name, split, DATA["dir"])
    check_draws(draws, sizes)
    return draw_flags(draws)


def decode_targets():
    """The score files of the main table: every dataset's cells but Spec-Bench's, which its own table
    reads (specbench.smk)."""
    targets = []
    for dataset in [d for d in DATASETS if d != "specbench"]:
        for name, values in SETTINGS.items():
            if values["method"] == "diversed" and "head" not in values and not head_available(dataset):
                warnings.warn(f"skipping diversed on {dataset}: no train split to train its head on")
                continue
            targets.append(f"results/scores/{dataset}/{name}.json")
    return targets


def run_flags():
    """How decode, trace and check jobs run their models (diversed.jobs.runner.RunOptions): one
    setting for all three."""
    return f"--prefix-cache {'on' if DECODE['prefix_cache'] else 'off'} --step {DECODE['step']}"


def transform_flag():
    return f"--draft-transform {MODELS['draft_transform']}" if MODELS["draft_transform"] else ""


def own_head(setting):
    """The head a grid entry names: oracle:NAME as it is, a folder relative to the repository (a
    committed head), seen from the run's working directory (``--directory runs/...``)."""
    own = SETTINGS[setting].get("head")
    if not own or ":" in own or os.path.isabs(own):
        return own
    return os.path.relpath(REPO / own)


def head_flag(wildcards, input):
    """The trained head of a diversed cell, or the one its grid entry names."""
    own = own_head(wildcards.setting)
    if own:
        return f"--head {own}"
    return f"--head {input.head}" if "head" in input.keys() else ""


def data_flags():
    flags = f"--data-dir {DATA['dir']}" if DATA["dir"] else ""
    return flags + ("" if DATA["allow_hub"] else " --no-hub")


def subset_flags():
    """A benchmark's stratified subset (specbench): its categories and questions per category."""
    flags = f" --per-category {DATA['per_category']}" if DATA["per_category"] else ""
    return flags + (f" --categories {' '.join(DATA['categories'])}" if DATA["categories"] else "")


def specbench_baseline():
    """The plain-decoding cell the speed-ups are over: the grid's `auto` setting."""
    plain = [name for name, values in SETTINGS.items() if values["method"] == "auto"]
    if "specbench" in DATASETS and len(plain) != 1:
        raise ValueError(f"decode.grid: Spec-Bench needs exactly one auto setting (its baseline), not {plain}")
    return plain[0] if plain else ""


def final_targets():
    """What `snakemake` builds: the main table and plot where datasets other than Spec-Bench are
    decoded, Spec-Bench's leaderboard where it is, and the data status always."""
    targets = ["results/data/status.json"]
    if any(d != "specbench" for d in DATASETS):
        targets += ["results/tables/main.md", "results/plots/quality_vs_acceptance.png"]
    if "specbench" in DATASETS:
        targets.append("results/tables/specbench.md")
    return targets


def model_flags():
    """The flags every command that runs the pair shares: models, device, dtype, weights, prompts."""
    chat = " --chat" if DATA["chat"] else ""
    stop = f" --stop {DATA['stop']}" if DATA["stop"] != "paper" else ""
    return (
        f"--target {MODELS['target']} --draft {MODELS['draft']} {transform_flag()} --device {DEVICE}"
        f" --dtype {MODELS['dtype']} --quantize {MODELS['quantize']}{chat}{stop}"
    )


def start_tracking():
    from diversed.pipeline.server import require_server
    from diversed.pipeline.tracking import start_invocation

    require_server(workflow.local_exec)  # a cluster run logs to a server, never to SQLite on NFS
    start_invocation(tags={"config": json.dumps(config, sort_keys=True)[:4000]})


def end_tracking(status):
    from diversed.pipeline.tracking import end_invocation

    end_invocation(status)


def matched_cell(name):
    """The diversed cell (trained head, same k and T) whose head's mean w a matched static cell uses."""
    mine = SETTINGS[name]
    for other, values in SETTINGS.items():
        if values["method"] == "diversed" and "head" not in values and all(
            values.get(k) == mine.get(k) for k in ("num_assistant_tokens", "temperature", "head_seed")
        ):
            return other
    raise ValueError(f"decode.grid: {name} is matched to diversed, but no diversed cell has its k and T")


def decode_inputs(wildcards):
    inputs = {"models": "results/models/ready.json", "data": "results/data/status.json"}
    if "matched_to" in SETTINGS[wildcards.setting]:
        inputs["matched"] = f"results/decode/{wildcards.dataset}/{matched_cell(wildcards.setting)}.jsonl"
    own = own_head(wildcards.setting)
    if own and ":" not in own:  # a head folder of its own: rerun when it changes
        inputs["own_head"] = own
    if SETTINGS[wildcards.setting]["method"] == "diversed" and "head" not in SETTINGS[wildcards.setting]:
        setting = SETTINGS[wildcards.setting]
        inputs["head"] = head_path(head_dataset(wildcards.dataset), HEAD["rounds"], setting.get("head_seed"))
    return inputs
