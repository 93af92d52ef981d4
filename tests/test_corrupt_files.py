"""Every kind of file the package reads, damaged: each is refused in one line that names it (and
its line, for JSONL), never a traceback: a head's weights and card, a trace manifest, decode
records, score files, dataset lines and the workflow's config."""

from __future__ import annotations

import json
import shutil

import pytest

from diversed.cli import main
from diversed.pipeline.workflow_config import validate_config


def refused(argv: list[str], capsys) -> str:
    """Run the CLI; it must exit 2 with one error line, which is returned."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]  # progress bars aside
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


def head_argv(model_dirs, head) -> list[str]:
    target, draft = model_dirs
    models = ["--target", str(target), "--draft", str(draft)]
    return [
        "generate",
        *models,
        "--method",
        "diversed",
        "--head",
        str(head),
        "--prompt",
        "x",
        "--max-new-tokens",
        "2",
    ]


@pytest.mark.parametrize(
    ("card", "weights", "named", "says"),
    [
        ("", b"", "head.json", "not valid JSON"),
        ('{"d_draft": 64}', b"", "head.json", "not a head card (it has no 'd_target')"),
        ('{"d_draft": "x", "d_target": 64}', b"", "head.json", "must be hidden sizes"),
        (None, b"garbage", "head.safetensors", "not a readable safetensors file"),
    ],
)
def test_a_damaged_head_is_named(model_dirs, tmp_path, capsys, card, weights, named, says):
    head = tmp_path / "head"
    head.mkdir()
    if card is None:  # a card that fits the tiny pair, beside weights that are not a safetensors file
        import transformers

        size = transformers.AutoConfig.from_pretrained(model_dirs[0]).hidden_size
        draft_size = transformers.AutoConfig.from_pretrained(model_dirs[1]).hidden_size
        card = json.dumps({"d_draft": draft_size, "d_target": size})
    (head / "head.json").write_text(card)
    (head / "head.safetensors").write_bytes(weights)
    line = refused(head_argv(model_dirs, head), capsys)
    assert str(head / named) in line and says in line


def test_a_damaged_trace_manifest_is_named(tmp_path, capsys):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "manifest.json").write_text("{bad")
    line = refused(["train-head", "--traces", str(traces), "--out", str(tmp_path / "h")], capsys)
    assert f"{traces / 'manifest.json'}: not valid JSON" in line
    (traces / "manifest.json").write_text(json.dumps({"sequences": [{"id": "a", "tokens": 3}]}))
    line = refused(["train-head", "--traces", str(traces), "--out", str(tmp_path / "h")], capsys)
    assert f"{traces / 'manifest.json'}: sequence 1: not a trace sequence (it has no 'reward')" in line


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        ('{"id": "1"}\n{bad\n', ":2: not a JSON line"),
        (
            '{"id": "1", "x": 1}\n',
            ":1: not a decode record (`diversed decode` writes them) (it has no 'prediction')",
        ),
        ("[1, 2]\n", ":1: a JSON line that is not an object"),
    ],
)
def test_damaged_decode_records_are_named_with_their_line(tmp_path, capsys, lines, says):
    records = tmp_path / "rows.jsonl"
    records.write_text(lines)
    line = refused(
        ["score", "--dataset", "gsm8k", "--in", str(records), "--out", str(tmp_path / "s.json")], capsys
    )
    assert f"{records}{says}" in line


@pytest.mark.parametrize(
    ("text", "says"),
    [("{bad", "not valid JSON"), ('{"dataset": "gsm8k"}', "not a score file (`diversed score` writes them)")],
)
def test_a_damaged_score_file_is_named(tmp_path, capsys, text, says):
    score = tmp_path / "s.json"
    score.write_text(text)
    tables, plots = str(tmp_path / "t" / "main"), str(tmp_path / "p")
    line = refused(["report", "--scores", str(score), "--tables", tables, "--plots", plots], capsys)
    assert f"{score}: {says}" in line


def test_a_damaged_dataset_line_is_named_with_its_line(tmp_path, capsys):
    import os

    shared = os.environ.get("DIVERSED_DATA_DIR")
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    good = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}
    (folder / "test.jsonl").write_text(json.dumps(good) + "\nnot json\n")
    if shared and (train := os.path.join(shared, "gsm8k", "train.jsonl")) and os.path.exists(train):
        shutil.copy(train, folder / "train.jsonl")  # the few-shot split
    else:
        (folder / "train.jsonl").write_text("")
    line = refused(["data", "show", "--dataset", "gsm8k", "--data-dir", str(tmp_path)], capsys)
    assert f"{folder / 'test.jsonl'}:2: not a JSON line" in line or f"{folder / 'train.jsonl'}" in line


def test_a_config_value_of_the_wrong_kind_is_named_by_its_key(tmp_path):
    from pathlib import Path

    import yaml

    from diversed.config import ConfigError

    repo = Path(__file__).resolve().parents[1]
    config = yaml.safe_load((repo / "config" / "config.yaml").read_text())
    config["data"]["n_examples"] = "twenty"
    with pytest.raises(ConfigError, match=r"^data.n_examples: 'twenty' is not of type 'integer'$"):
        validate_config(config, repo / "workflow" / "schemas" / "config.schema.yaml")
