"""Where the models run: the device a job uses, the dtype it can run fast, and timers that wait for it.

Every command that runs a model takes ``--device`` (``auto`` by default): CUDA when torch sees a
GPU, else the CPU. It is resolved once, before anything loads, so a record names the device that
ran it and ``--dtype auto`` / ``--quantize auto`` are chosen for that device, not for the machine
that parsed the workflow. ``dtype auto`` is bf16 only where the device computes in it natively
(Ampere or newer on CUDA; AMX or avx512_bf16 on a CPU); a V100 or T4 gets fp16, a CPU without
native bf16 fp32 (bf16 would be emulated there, slower than fp32).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from diversed.config import DTYPES, ConfigError

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def resolve_device(name: str = "auto") -> str:
    """``auto`` -> ``cuda`` where torch sees a GPU, else ``cpu``; an explicit CUDA device that
    this machine lacks is refused in one line before any model loads."""
    if not DEVICE_PATTERN.match(name):
        raise ConfigError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: {no_cuda_reason()}")
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s)")
    return name


def no_cuda_reason() -> str:
    """Why torch sees no GPU, and the fix: a CPU build of torch (what plain `make` installs), or a
    CUDA build that finds no usable device (driver, CUDA_VISIBLE_DEVICES, a node without one)."""
    if torch.version.cuda is None:
        return (
            f"torch {torch.__version__} is a CPU build (torch.version.cuda is None); on a GPU machine"
            " `make CONSTRAINTS=/dev/null test` installs PyPI's CUDA build into .venv"
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU"
        f" (CUDA_VISIBLE_DEVICES={visible!r}); check `nvidia-smi` on this node: a driver older than"
        f" CUDA {torch.version.cuda} needs, or a job without a GPU allocated"
    )


def is_cuda(device: str | torch.device) -> bool:
    return str(device).startswith("cuda")


def device_name(device: str) -> str:
    """What a record says it ran on: ``cpu``, or ``cuda:0 (NVIDIA H100 80GB HBM3)``."""
    if not is_cuda(device):
        return str(device)
    index = torch.device(device).index or 0
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def native_bf16() -> str | None:
    """The CPU feature that gives native bf16 dot products (AMX or avx512_bf16), or None."""
    if torch.cpu._is_amx_tile_supported():
        return "AMX"
    if torch.cpu._is_avx512_bf16_supported():
        return "avx512_bf16"
    return None


def choose_dtype(name: str, device: str = "cpu") -> tuple[str, str]:
    """The dtype to run in, and why: ``auto`` is bf16 where ``device`` has native bf16 arithmetic,
    fp16 on older GPUs, fp32 on CPUs without it."""
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not one of: {', '.join(DTYPES)}")
    if name != "auto":
        return name, "asked for"
    if is_cuda(device):
        gpu = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bfloat16", f"{gpu} computes in bf16"
        return "float16", f"{gpu} has no native bf16 (compute capability < 8.0)"
    feature = native_bf16()
    if feature:
        return "bfloat16", f"the CPU has native bf16 dot products ({feature})"
    return "float32", "the CPU has no native bf16 dot products (no avx512_bf16, no AMX)"


def sync(device: str | torch.device) -> None:
    """Wait for the device's queued work, so wall-clock times cover it (CUDA runs asynchronously)."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


@contextmanager
def timed(device: str | torch.device, into: list[float]) -> Iterator[None]:
    """Append the wall seconds of the block to ``into``, the device synchronised at both ends."""
    sync(device)
    start = time.perf_counter()
    yield
    sync(device)
    into.append(time.perf_counter() - start)


def synced_seconds(device: str | torch.device, start: float) -> float:
    """Wall seconds since ``start`` (a ``time.perf_counter()``), once the device's queue is done."""
    sync(device)
    return time.perf_counter() - start
