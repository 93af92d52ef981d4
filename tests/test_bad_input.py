"""Bad input loses nothing and says what is wrong in one line: files that are not ours, damaged
files, counts out of range, records of another dataset, a draft with another vocabulary, and
workflow configs with a wrong key or grid entry. Each case names the file (and line) or the key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from diversed.cli import main
from diversed.config import DTYPES, QUANTIZE, ConfigError
from diversed.engine.cache import STEPS
from diversed.jobs.traces import TraceJob
from diversed.pipeline.grid import expand
from diversed.pipeline.workflow_config import validate_config


def decode(model_dirs, out, *extra: str) -> list[str]:
    target, draft = model_dirs
    return [
        *("decode", "--dataset", "humaneval", "--n-examples", "2", "--method", "sd", "--quiet"),
        *("--target", str(target), "--draft", str(draft), "--max-new-tokens", "6", "--out", str(out), *extra),
    ]


def error_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "content",
    ['{\n  "pass@1": 12.0,\n  "n_examples": 20\n}\n', "notes I want to keep\n", "no newline at the end"],
    ids=["score-json", "text", "text-without-newline"],
)
def test_decode_refuses_an_out_file_that_is_not_its_own(model_dirs, tmp_path, capsys, content):
    out = tmp_path / "results.json"
    out.write_text(content)
    err = error_of(decode(model_dirs, out), capsys)
    assert str(out) in err and err.count("\n") == 1
    assert out.read_text() == content


def test_a_corrupt_line_in_the_middle_stops_and_keeps_every_record(model_dirs, tmp_path, capsys):
    out = tmp_path / "he.jsonl"
    assert main(decode(model_dirs, out, "--n-examples", "3")) == 0
    lines = out.read_text().splitlines(keepends=True)
    damaged = lines[0] + '{"id": "HumanEval/x", "broken\n' + "".join(lines[1:])
    out.write_text(damaged)
    err = error_of(decode(model_dirs, out, "--n-examples", "3"), capsys)
    assert f"{out}:2" in err
    assert out.read_text() == damaged


@pytest.mark.parametrize("n", ["-3", "0"])
def test_decode_refuses_a_count_below_one_before_writing(model_dirs, tmp_path, capsys, n):
    out = tmp_path / "he.jsonl"
    err = error_of(decode(model_dirs, out, "--n-examples", n), capsys)
    assert f"n_examples: {n} is less than the minimum of 1" in err
    assert not out.exists()


def test_graphs_off_cuda_are_refused_by_flag_before_anything_is_written(model_dirs, tmp_path, capsys):
    out = tmp_path / "he.jsonl"
    err = error_of(decode(model_dirs, out, "--step", "graphs"), capsys)
    assert "--step graphs replays CUDA graphs: it needs --device cuda, not 'cpu'" in err
    assert not out.exists()


def test_library_jobs_refuse_what_the_schema_refuses():
    with pytest.raises(ConfigError, match="n_examples: 0 is less than the minimum of 1"):
        TraceJob(dataset="mbpp", n_examples=0)
    with pytest.raises(ConfigError, match="behaviour_weights: 1.5 is greater than the maximum of 1"):
        TraceJob(dataset="mbpp", behaviour_weights=(0.5, 1.5))
    with pytest.raises(ConfigError, match="rollouts: 0 is less than the minimum of 1"):
        TraceJob(dataset="mbpp", rollouts=0)


def test_a_corrupt_head_is_named(model_dirs, tmp_path, capsys):
    head = tmp_path / "head"
    head.mkdir()
    (head / "head.json").write_text(json.dumps({"d_draft": 64, "d_target": 64, "hidden": 0}))
    (head / "head.safetensors").write_bytes(b"\x00" * 40)
    target, draft = model_dirs
    argv = [
        *("generate", "--target", str(target), "--draft", str(draft), "--method", "diversed"),
        *("--head", str(head), "--prompt", "x", "--max-new-tokens", "2"),
    ]
    last = error_of(argv, capsys).splitlines()[-1]  # above it: only the model loader's progress bars
    assert last.startswith("diversed generate: error: ")
    assert f"{head / 'head.safetensors'}: not a readable safetensors file" in last


def test_a_corrupt_trace_file_is_named_on_resume_and_on_training(model_dirs, tmp_path, capsys, mbpp_dir):
    target, draft = model_dirs
    traces = tmp_path / "traces"
    collect = [
        *("collect-traces", "--dataset", "mbpp", "--n-examples", "2", "--max-new-tokens", "4"),
        *("--target", str(target), "--draft", str(draft), "--behaviour-weights", "0.5"),
        *("--data-dir", str(mbpp_dir), "--no-hub", "--quiet", "--out", str(traces)),
    ]
    assert main(collect) == 0
    damaged = traces / "seq-00001.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:-10])
    assert str(damaged) in error_of(collect, capsys)
    err = error_of(["train-head", "--traces", str(traces), "--out", str(tmp_path / "h"), "--quiet"], capsys)
    assert str(damaged) in err


def test_score_names_the_file_and_line_of_a_corrupt_record(canonical_decode_file, tmp_path, capsys):
    path = canonical_decode_file(4)
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace('"HumanEval/2"', '"HumanEval/2\\q"')
    path.write_text("".join(lines))
    err = error_of(
        ["score", "--dataset", "humaneval", "--in", str(path), "--out", str(tmp_path / "s.json")], capsys
    )
    assert f"{path}:3: not a JSON line" in err


def test_score_refuses_records_of_another_dataset(model_dirs, tmp_path, capsys):
    out = tmp_path / "he.jsonl"
    assert main(decode(model_dirs, out)) == 0
    err = error_of(
        ["score", "--dataset", "xsum", "--in", str(out), "--out", str(tmp_path / "s.json")], capsys
    )
    assert f"{out}:1 is a humaneval record, not xsum" in err
    assert not (tmp_path / "s.json").exists()


def test_a_draft_with_a_reordered_vocabulary_is_refused(model_dirs, tmp_path, capsys):
    target, draft = model_dirs
    swapped = tmp_path / "draft"
    shutil.copytree(draft, swapped)
    tokenizer = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]  # same size, another vocabulary
    (swapped / "tokenizer.json").write_text(json.dumps(tokenizer))
    argv = [
        "generate",
        "--target",
        str(target),
        "--draft",
        str(swapped),
        "--prompt",
        "x",
        "--max-new-tokens",
        "2",
    ]
    err = error_of(argv, capsys)
    assert "target and draft tokenizers differ in 2 tokens, e.g. 'a' is id" in err


WORKFLOW_SCHEMA = "workflow/schemas/config.schema.yaml"


def workflow_config() -> dict:
    return {
        "models": {"target": "t", "draft": "d"},
        "data": {"datasets": ["humaneval"]},
        "decode": {"grid": [{"method": "sd"}]},
        "head": {},
        "resources": {},
    }


def test_workflow_config_errors_are_one_line_naming_the_key():
    config = workflow_config()
    validate_config(config, WORKFLOW_SCHEMA)
    assert config["data"]["n_examples"] == 5 and config["head"]["rounds"] == 1  # defaults filled in
    config = workflow_config()
    config["data"]["n_exemples"] = 3
    with pytest.raises(ConfigError) as err:
        validate_config(config, WORKFLOW_SCHEMA)
    assert str(err.value).startswith("data.n_exemples: unknown key (allowed: datasets,") and "\n" not in str(
        err.value
    )
    config = workflow_config()
    config["data"]["n_examples"] = -3
    with pytest.raises(ConfigError, match=r"^data.n_examples: -3 is less than the minimum of 1$"):
        validate_config(config, WORKFLOW_SCHEMA)


def test_the_workflow_schema_offers_the_choices_the_cli_offers():
    """The workflow schema's hand-written enums are the CLI's tuples: a choice added to one is added
    to the other, or this fails."""
    properties = yaml.safe_load(Path(WORKFLOW_SCHEMA).read_text())["properties"]
    assert properties["decode"]["properties"]["step"]["enum"] == list(STEPS)
    assert properties["models"]["properties"]["dtype"]["enum"] == list(DTYPES)
    assert properties["models"]["properties"]["quantize"]["enum"] == list(QUANTIZE)


def test_a_bad_grid_entry_is_named():
    grid = [{"method": "sd"}, {"method": "static", "target_weight": [0.5, 1.5]}]
    with pytest.raises(
        ConfigError, match=r"decode.grid\[1\] .*target_weight: 1.5 is greater than the maximum of 1"
    ):
        expand(grid, [4], [0.0], {"max_new_tokens": 8})


@pytest.fixture
def mbpp_dir(tmp_path):
    rows = [
        {
            "task_id": 600 + i,
            "text": f"Return {i}.",
            "code": f"def f():\n    return {i}\n",
            "test_list": [f"assert f() == {i}"],
            "test_setup_code": "",
            "challenge_test_list": [],
        }
        for i in range(4)
    ]
    (tmp_path / "mbpp").mkdir()
    (tmp_path / "mbpp" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


@pytest.mark.parametrize("path", sorted(Path("config").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates_and_expands(path):
    config = yaml.safe_load(path.read_text())
    validate_config(config, WORKFLOW_SCHEMA)
    decode, head = config["decode"], config["head"]
    settings = expand(
        decode["grid"],
        decode["draft_lengths"],
        decode["temperatures"],
        {"max_new_tokens": decode["max_new_tokens"]},
        head["seeds"] or [head["seed"]],
    )
    assert settings and all(v["method"] for v in settings.values())


def test_a_negative_weight_spread_threshold_is_named_before_any_trace_is_read(tmp_path, capsys):
    argv = ["train-head", "--traces", str(tmp_path / "absent"), "--out", str(tmp_path / "h")]
    err = error_of([*argv, "--min-weight-std", "-0.1", "--quiet"], capsys)
    assert "min_weight_std" in err and "absent" not in err
