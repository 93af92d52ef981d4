"""oneDNN-packed linear weights kept on disk, so a model is packed once per machine, not per job.

Why: packing writes every linear weight into fresh memory in oneDNN's blocked layout, and fresh
memory is paid page fault by page fault. On a 2-core VM that was 1-4 s for the 1.5B model and
another ~1 s for the 0.5B, more than half of a decode job's start. The first job that packs a
model writes the packed bytes here; every later job maps the file and hands oneDNN views of it:
no packing, no fresh memory, and jobs running at once share one copy in the page cache.

Layout: ``<root>/<key>/index.json`` (per packed linear: name, dtype, shape, strides, byte offset,
byte count and oneDNN's serialized memory descriptor) and ``weights.bin`` (the bytes, each linear
at a 2 MiB boundary). The key hashes what decides the bytes: the model folder and its files'
sizes and times, the dtype, torch's version (it ships oneDNN) and the CPU (oneDNN picks a layout
for the ISA it finds). A folder is written under a temporary name and renamed, so a reader never
sees half of one and two jobs writing at once leave one.

Making a tensor from bytes oneDNN packed uses AOTInductor's C shim (``aoti_torch_create_tensor_
from_blob_v2``, the call an AOT-compiled model uses for its packed constants) through ctypes.
Where this torch lacks it, :func:`supported` is False and models are packed as before.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import mmap
import os
import platform
import shutil
import warnings
from pathlib import Path

import torch

from diversed.backends.cpu.memory import MADV_POPULATE_READ, madvise

FORMAT = 1
ALIGN = 2 << 20  # a huge page: the kernel can map each weight's start with one


def _shim() -> ctypes.CDLL | None:
    """torch's C library when it exports what reading a store needs, else None."""
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        lib.aoti_torch_create_tensor_from_blob_v2.restype = ctypes.c_int32
        lib.aoti_torch_layout__mkldnn.restype = ctypes.c_int32
    except (OSError, AttributeError):
        return None
    needed = (
        hasattr(torch._C, "_aoti") and hasattr(torch._C._aoti, "alloc_tensor_by_stealing_from_void_ptr"),
        hasattr(torch.ops.mkldnn, "_get_mkldnn_serialized_md"),
    )
    return lib if all(needed) else None


_LIB = _shim()
_CAPSULE = ctypes.pythonapi.PyCapsule_New  # how torch takes ownership of the tensor the shim made
_CAPSULE.restype, _CAPSULE.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def supported() -> bool:
    return _LIB is not None


def _cpu() -> str:
    """The CPU as oneDNN sees it: model name and the ISA level torch dispatches to."""
    name = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}|{torch.backends.cpu.get_cpu_capability()}|{torch.cpu._is_amx_tile_supported()}"


def root() -> Path | None:
    """``$DIVERSED_PACKED_CACHE`` (``off`` turns the store off), else ``packed/`` in diversed's cache."""
    setting = os.environ.get("DIVERSED_PACKED_CACHE")
    if setting == "off":
        return None
    if setting:
        return Path(setting)
    from diversed.files import cache_dir

    return cache_dir() / "packed"


class PackedStore:
    """The packed linears of the model in one local folder, for one dtype, torch and CPU."""

    def __init__(self, base: Path, model_dir: Path, dtype: torch.dtype) -> None:
        files = sorted(p for p in model_dir.iterdir() if p.is_file())
        identity = {
            "format": FORMAT,
            "model": str(model_dir.resolve()),
            "files": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files],
            "dtype": str(dtype),
            "torch": torch.__version__,
            "cpu": _cpu(),
        }
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
        self.dir = base / f"{model_dir.name}-{digest}"

    @classmethod
    def for_model(cls, source: str, dtype: torch.dtype) -> PackedStore | None:
        """The store of a model loaded from the local folder ``source``; None for a hub id, where
        the store is off, or where this torch cannot read one."""
        base = root()
        if base is None or not supported() or not Path(source).is_dir():
            return None
        return cls(base, Path(source), dtype)

    def load(self) -> dict[str, torch.Tensor] | None:
        """Every stored linear as a packed tensor over the mapped file, by module name; None when
        there is no complete store. The tensors keep the mapping alive."""
        try:
            index = json.loads((self.dir / "index.json").read_text())
            with open(self.dir / "weights.bin", "rb") as file:
                needed = max((e["offset"] + e["nbytes"] for e in index), default=0)
                if os.fstat(file.fileno()).st_size < needed:
                    return None
                mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
        except (OSError, ValueError, KeyError, TypeError):  # ValueError: also an empty file
            return None
        anchor = ctypes.c_char.from_buffer(mapping)  # holds the mapping open while tensors use it
        base = ctypes.addressof(anchor)
        madvise(base, base + len(mapping), MADV_POPULATE_READ)  # every page now, in one call: truly ready
        packed = {}
        for entry in index:
            try:
                tensor = _from_blob(base + entry["offset"], entry)
            except (AttributeError, KeyError, TypeError, RuntimeError):
                return None  # an index this code did not write: pack again
            if torch.ops.mkldnn._nbytes(tensor) != entry["nbytes"]:
                return None  # oneDNN reads this descriptor differently: pack again
            tensor.store_mapping = anchor
            packed[entry["name"]] = tensor
        return packed

    def save(self, packed: dict[str, torch.Tensor]) -> None:
        """Write ``packed`` (module name -> oneDNN-packed tensor); a failure only warns: the job
        has its packed model and the next one will pack again."""
        staging = self.dir.with_name(f"{self.dir.name}.{os.getpid()}.tmp")
        try:
            staging.mkdir(parents=True, exist_ok=True)
            index, offset = [], 0
            with open(staging / "weights.bin", "wb") as out:
                for name, tensor in packed.items():
                    nbytes = torch.ops.mkldnn._nbytes(tensor)
                    out.seek(offset)
                    out.write((ctypes.c_char * nbytes).from_address(torch.ops.mkldnn.data_ptr(tensor)))
                    descriptor = torch.ops.mkldnn._get_mkldnn_serialized_md(tensor).tolist()
                    index.append(
                        {
                            "name": name,
                            "dtype": str(tensor.dtype).removeprefix("torch."),
                            "shape": list(tensor.shape),
                            "stride": list(tensor.stride()),
                            "offset": offset,
                            "nbytes": nbytes,
                            "descriptor": descriptor,
                        }
                    )
                    offset = -(-(offset + nbytes) // ALIGN) * ALIGN
            (staging / "index.json").write_text(json.dumps(index))
            os.rename(staging, self.dir)
        except OSError as err:
            if not self.dir.exists():
                warnings.warn(f"could not store packed weights in {self.dir}: {err}", stacklevel=2)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _from_blob(address: int, entry: dict) -> torch.Tensor:
    """A oneDNN tensor over ``entry["nbytes"]`` bytes at ``address`` in the layout its descriptor names."""
    int64s = ctypes.c_int64 * len(entry["shape"])
    descriptor = bytes(entry["descriptor"])
    handle = ctypes.c_void_p()
    status = _LIB.aoti_torch_create_tensor_from_blob_v2(
        ctypes.c_void_p(address),
        ctypes.c_int64(len(entry["shape"])),
        int64s(*entry["shape"]),
        int64s(*entry["stride"]),
        ctypes.c_int64(0),
        ctypes.c_int32(_code(f"aoti_torch_dtype_{entry['dtype']}")),
        ctypes.c_int32(_code("aoti_torch_device_type_cpu")),
        ctypes.c_int32(0),
        ctypes.byref(handle),
        ctypes.c_int32(_code("aoti_torch_layout__mkldnn")),
        ctypes.c_char_p(descriptor),
        ctypes.c_int64(len(descriptor)),
    )
    if status != 0:
        raise RuntimeError(f"torch could not read a stored packed weight ({entry['name']})")
    return torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr(_CAPSULE(handle.value, None, None))


@functools.cache
def _code(symbol: str) -> int:
    """The value of one of the shim's enum getters (dtype, device, layout codes)."""
    getter = getattr(_LIB, symbol)
    getter.restype = ctypes.c_int32
    return getter()
