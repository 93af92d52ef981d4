"""Device resolution with CUDA faked present and absent: ``--device auto`` picks the GPU where torch
sees one, ``dtype auto`` picks bf16 only where the card computes in it, and the CLI resolves all
three knobs for the device before anything loads."""

from __future__ import annotations

import argparse

import pytest
import torch

from diversed.cli import resolve_choices
from diversed.config import ConfigError
from diversed.devices import choose_dtype, resolve_device


def fake_cuda(monkeypatch, present: bool, name: str = "NVIDIA H100 80GB HBM3", bf16: bool = True) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: present)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(present))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)


@pytest.mark.parametrize(("present", "expected"), [(True, "cuda"), (False, "cpu")])
def test_auto_is_the_gpu_where_there_is_one(monkeypatch, present, expected):
    fake_cuda(monkeypatch, present)
    assert resolve_device("auto") == expected
    assert resolve_device("cpu") == "cpu"


def test_a_gpu_that_is_not_there_is_refused_in_one_line(monkeypatch):
    fake_cuda(monkeypatch, False)
    with pytest.raises(ConfigError, match="--device cuda: torch") as err:
        resolve_device("cuda")
    assert "\n" not in str(err.value)
    fake_cuda(monkeypatch, True)
    assert resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(ConfigError, match="has 1 GPU"):
        resolve_device("cuda:1")
    with pytest.raises(ConfigError, match="expected auto, cpu, cuda or cuda:N"):
        resolve_device("gpu")


@pytest.mark.parametrize(
    ("card", "bf16", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", True, "bfloat16"),
        ("Tesla T4", False, "float16"),
        ("Tesla V100", False, "float16"),
    ],
)
def test_dtype_auto_is_bf16_only_on_cards_that_compute_in_it(monkeypatch, card, bf16, expected):
    fake_cuda(monkeypatch, True, card, bf16)
    dtype, why = choose_dtype("auto", "cuda")
    assert dtype == expected and card in why


@pytest.mark.parametrize("present", [True, False])
def test_the_cli_resolves_device_then_dtype_and_weights_for_it(monkeypatch, present):
    fake_cuda(monkeypatch, present)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    args = argparse.Namespace(device="auto", dtype="auto", quantize="auto")
    resolve_choices(args)
    if present:  # the GPU's own bf16 weights; fp16 weight storage is a CPU option
        assert (args.device, args.dtype, args.quantize) == ("cuda", "bfloat16", "none")
    else:
        assert (args.device, args.dtype) == ("cpu", "float32")
        assert args.quantize in ("fp16", "none")  # fp16 where this torch has fbgemm


def test_graphs_are_refused_off_cuda_once_auto_resolved_to_the_cpu(monkeypatch, capsys):
    from diversed.cli import main

    fake_cuda(monkeypatch, False)
    with pytest.raises(SystemExit) as stop:
        main(
            ["generate", "--target", "nowhere/model", "--method", "auto", "--prompt", "x", "--step", "graphs"]
        )
    assert stop.value.code == 2
    assert "needs --device cuda, not 'cpu'" in capsys.readouterr().err


def test_flash_attention_is_refused_before_a_model_loads(capsys):
    from diversed.cli import main

    with pytest.raises(SystemExit) as stop:
        main(
            [
                "generate",
                "--target",
                "nowhere/model",
                "--prompt",
                "x",
                "--attn-implementation",
                "flash_attention_2",
            ]
        )
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--attn-implementation" in err and "flash_attention_2" in err


def test_no_gpu_names_the_cause_and_the_fix(monkeypatch):
    """A CPU build of torch (what plain `make` installs) and a CUDA build without a usable GPU
    read differently, each with what fixes it."""
    fake_cuda(monkeypatch, False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(
        ConfigError, match=r"is a CPU build \(torch.version.cuda is None\).*CONSTRAINTS=/dev/null"
    ):
        resolve_device("cuda")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(ConfigError, match="CUDA 12.8.*finds no usable GPU.*nvidia-smi"):
        resolve_device("cuda")


def test_a_job_that_holds_a_gpu_runs_on_cuda_or_not_at_all():
    from diversed.pipeline.workflow_config import job_device

    assert job_device("auto", 1) == "cuda" and job_device("cuda:0", 1) == "cuda:0"
    assert job_device("auto", 0) == "auto" and job_device("cpu", 0) == "cpu"
    with pytest.raises(ConfigError, match="models.device: cpu, but resources.gpu"):
        job_device("cpu", 1)
