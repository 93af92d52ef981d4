"""The embedded pair in every layout a machine's cache may hold: what `models fetch` writes on a CPU
with native bf16 (bf16 only), on one without (fp32 only), and after a fetch for the other dtype
(both). CI runs on one kind of CPU; these tests walk the other kinds' path through the cache
layout they would write: `generate`, `decode` and `doctor` on a tiny pair stored as the embedded
models."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from diversed.cli import main
from diversed.loading.embedded import PAIR, PREFIX, model_dir
from diversed.loading.tiny import write_tiny_pair

TARGET, DRAFT = (PREFIX + name for name in PAIR)
LAYOUTS = {"bf16 only": ("bfloat16",), "fp32 only": ("float32",), "both": ("float32", "bfloat16")}


def store(tmp_path, monkeypatch, dtypes: tuple[str, ...]) -> None:
    """A tiny pair stored as the embedded pair, in each of ``dtypes`` (as a fetch would write it)."""
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    tiny = write_tiny_pair(tmp_path / "tiny")
    for name, source in zip((TARGET, DRAFT), tiny, strict=True):
        for dtype in dtypes:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype))
            model.save_pretrained(model_dir(name, dtype))
            for tokenizer_file in source.glob("*token*"):
                shutil.copy(tokenizer_file, model_dir(name, dtype))


def machine_runs(monkeypatch, dtype: str) -> None:
    """This machine's `--dtype auto`, as a CPU with (bf16) or without (fp32) native bf16 picks it."""
    import diversed.devices

    monkeypatch.setattr(
        diversed.devices,
        "choose_dtype",
        lambda name, device="cpu": (
            (dtype, "the CPU this test stands for") if name == "auto" else (name, "asked")
        ),
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_generate_decode_and_doctor_work_in_every_stored_layout(layout, tmp_path, monkeypatch, capsys):
    dtypes = LAYOUTS[layout]
    store(tmp_path, monkeypatch, dtypes)
    runs = "bfloat16" if "bfloat16" in dtypes else "float32"  # what fetch stored is what the CPU runs
    machine_runs(monkeypatch, runs)
    pair = ("--target", TARGET, "--draft", DRAFT, "--dtype", "auto", "--max-new-tokens", "6")
    assert main(["generate", *pair, "--method", "sd", "--prompt", "def f(x):", "--json"]) == 0
    generated = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert len(generated["token_ids"]) > 0
    out = tmp_path / "he.jsonl"
    argv = ["decode", *pair, "--dataset", "humaneval", "--n-examples", "2", "--method", "sd"]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    assert len(out.read_text().splitlines()) == 2
    capsys.readouterr()
    main(["doctor"])
    doctor = capsys.readouterr().out
    for name in (TARGET, DRAFT):
        line = next(line for line in doctor.splitlines() if name + " " in line)
        assert line.startswith("[ok]") and f"stored in {', '.join(dtypes)}" in line, line


def test_a_wider_dtype_than_stored_is_refused_with_the_command_that_builds_it(tmp_path, monkeypatch, capsys):
    """bf16 weights widened to fp32 are other numbers than the fp32 conversion's: never silently."""
    store(tmp_path, monkeypatch, ("bfloat16",))
    machine_runs(monkeypatch, "float32")
    pair = ("--target", TARGET, "--draft", DRAFT, "--dtype", "float32", "--max-new-tokens", "4")
    with pytest.raises(SystemExit):
        main(["generate", *pair, "--prompt", "def f(x):"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "stored in bfloat16 only" in err and "models fetch qwen2.5-coder-1.5b --dtype float32" in err
    main(["doctor"])
    line = next(line for line in capsys.readouterr().out.splitlines() if TARGET + " " in line)
    assert line.startswith("[!!]") and "not for float32 jobs" in line
