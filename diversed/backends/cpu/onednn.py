"""Fast linear layers for CPU inference: oneDNN with pre-packed weights instead of MKL's sgemm.

Speculative decoding pays only if a target forward over k + 1 tokens costs about as much as over
one token: both stream the same weights from memory. On the project's reference CPU (2-core AMD
EPYC, torch 2.13) it did not: an 8-token forward of Qwen2.5-Coder-1.5B cost about 2-2.8 one-token
forwards. The cause is the BLAS kernel behind ``F.linear``: MKL's sgemm, which on this AMD CPU
runs small-M products (2-16 rows) at a fraction of memory bandwidth, and even the one-row product
below it. oneDNN, which torch also ships, JIT-compiles kernels for the CPU it finds; with the
weight re-ordered once into oneDNN's blocked layout, one 8960x1536 projection takes ~1.6 ms for
1 row and ~2.3 ms for 8 rows, against ~3.3 ms and ~5-10 ms through ``F.linear``.

``use_onednn_linear`` re-packs every fp32 or bf16 ``nn.Linear`` of a model for inference (oneDNN
picks native bf16 kernels where the CPU has them; it cannot pack bf16 at all on AVX2-only CPUs).
The dense weight is released (kept as a shape-only tensor on the ``meta`` device) unless another
module shares it, such as a tied input embedding, so memory does not double. Results equal
``F.linear`` up to summation order. Call it last: the model cannot be moved or trained afterwards.

Memory and load time. ``from_pretrained`` memory-maps the safetensors file, so a dense weight is a
view of the page cache; dropping the Parameter does not unmap it (the mapping lives while any
tensor of the file does, e.g. the tied embedding), and every page read for packing stays in the
process's resident set: a 1.5B fp32 model peaked at 12.6 GB, 6.2 GB of it file pages no longer
used. After packing a weight that lies in a *file* mapping, its pages are dropped from the process
with ``madvise(MADV_DONTNEED)``: for a private file mapping that only forgets the process's view (a
later read would fault the unchanged file contents back in), so it can never corrupt a tensor, not
even one shared with another model. Anonymous memory is never touched this way. Before packing,
the file's pages are mapped in one call (``MADV_POPULATE_READ``) instead of one fault per 4 KiB page.
Packing itself is one-threaded and bound by page faults on the fresh memory it writes, so the
linears are packed by as many Python threads as torch has (torch releases the GIL in its ops):
~1.6x faster on 2 cores. The CLI also asks torch's allocator for transparent huge pages
(``THP_MEM_ALLOC_ENABLE``), 512x fewer faults where the kernel grants them.
Even so, packing was half of a decode job's start on a 2-core VM; with a
:class:`~diversed.backends.cpu.packed_store.PackedStore` a model is packed once and later loads map the
stored bytes (``pack`` then never reads the dense weight, so its file pages are not touched).

Sibling linears. At one token per row a forward is ~200 matrix-vector products, and a small one
streams its weights further below bandwidth than a large one (on a 2-core Xeon with AMX, bf16:
a 256x1536 key projection at 19 GB/s, the 2048x1536 query/key/value product at 29 GB/s).
Linears of one block that read the same input (``q_proj``, ``k_proj``, ``v_proj``; ``gate_proj``,
``up_proj``, the names of Llama, Qwen2 and Mistral) are therefore packed as one product over their
stacked weights (by every packing route: oneDNN here, fbgemm fp16 in :mod:`diversed.backends.cpu.quantize`);
the first sibling called computes it and each sibling returns its columns. The
product is recomputed whenever the input is not the very tensor of the last call (same object,
no in-place change since: inference-mode tensors carry no version counter, so there identity alone
decides) or the sibling already took its columns, so a sibling called alone, twice, or in another
order is still exact.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import torch
from torch import nn

from diversed.backends.cpu.memory import LIBC, MADV_DONTNEED, MADV_POPULATE_READ, madvise


class WeightStore(Protocol):
    """Where packed weights are kept between jobs (``packed_store.PackedStore``)."""

    def load(self) -> dict[str, torch.Tensor] | None: ...

    def save(self, packed: dict[str, torch.Tensor]) -> None: ...


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_bf16() -> bool:
    """Whether oneDNN can pack bf16 weights here: it needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT,
    and refuses on plain AVX2, where bf16 linears then stay on ``F.linear`` (correct, slow)."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def _file_mappings() -> list[tuple[int, int]]:
    """Address ranges of this process's file-backed mappings (Linux ``/proc/self/maps``)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


class _FilePages:
    """The file-mapped pages behind tensors: populate them in bulk, drop them once packed."""

    def __init__(self) -> None:
        self.ranges = _file_mappings() if LIBC is not None else []

    def _advise(self, tensor: torch.Tensor, advice: int) -> None:
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        if any(lo <= start and end <= hi for lo, hi in self.ranges):
            madvise(start, end, advice)  # whole pages inside the tensor only

    def populate(self, tensor: torch.Tensor) -> None:
        self._advise(tensor, MADV_POPULATE_READ)

    def drop(self, tensor: torch.Tensor) -> None:
        self._advise(tensor, MADV_DONTNEED)

    def release(self, module: nn.Module) -> None:
        """Drop the file pages of ``module``'s weight and keep it only as a shape on ``meta``."""
        self.drop(module.weight.detach())
        module.weight = _shape_only(module.weight)


def _shape_only(tensor: torch.Tensor) -> nn.Parameter:
    """A parameter that keeps ``tensor``'s shape on ``meta`` and no memory (its data lives packed)."""
    return nn.Parameter(torch.empty(tensor.shape, device="meta"), requires_grad=False)


SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _SiblingProduct:
    """One product standing for sibling linears that read the same input (see above). It is held
    only until every sibling has taken its columns, so no activations outlive the block."""

    def __init__(self, fused: nn.Linear, sizes: list[int]) -> None:
        self.fused, self.sizes = fused, sizes
        self.last: tuple[torch.Tensor, int | None, tuple[torch.Tensor, ...]] | None = None
        self.taken: set[int] = set()

    def output(self, x: torch.Tensor, index: int) -> torch.Tensor:
        version = None if x.is_inference() else x._version  # inference tensors keep no version
        if self.last is None or self.last[0] is not x or self.last[1] != version or index in self.taken:
            self.last, self.taken = (x, version, self.fused(x).split(self.sizes, dim=-1)), set()
        out = self.last[2][index]
        self.taken.add(index)
        if len(self.taken) == len(self.sizes):
            self.last = None
        return out


def _sibling_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return self.sibling_product.output(x, self.sibling_index)


def _sibling_groups(
    model: nn.Module, dtypes: tuple[torch.dtype, ...]
) -> list[tuple[str, nn.Module, tuple[str, ...]]]:
    """(parent's name, parent, names) of every group of :data:`SIBLINGS` that can share one
    product: plain CPU linears of one dtype in ``dtypes``, one input width, all with a bias or none."""
    groups = []
    for parent_name, parent in model.named_modules():
        for names in SIBLINGS:
            members = [getattr(parent, name, None) for name in names]
            if not all(type(m) is nn.Linear for m in members):
                continue
            kinds = {(m.weight.dtype, m.weight.device.type, m.in_features, m.bias is None) for m in members}
            dtype, device = next(iter(kinds))[:2]
            if len(kinds) == 1 and dtype in dtypes and device == "cpu":
                groups.append((parent_name, parent, names))
    return groups


class _Scratch(threading.local):
    """One buffer per packing thread that a group of siblings is stacked into before it is packed.
    Packing copies out of it, so the buffer serves every group the thread packs: fresh memory is
    faulted in page by page (on a 2-core VM, a 2 MiB huge page costs ~1.5 ms), and stacking each
    group into its own new weight cost the 1.5B model 2.2 GB of it, as much time as packing."""

    buffer: torch.Tensor | None = None

    def take(self, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        if self.buffer is None or self.buffer.numel() < rows * cols or self.buffer.dtype != dtype:
            self.buffer = torch.empty(rows * cols, dtype=dtype)
        return self.buffer[: rows * cols].view(rows, cols)


Pack = Callable[[str, nn.Linear, Callable[[], torch.Tensor]], None]


def pack_linears(model: nn.Module, dtypes: tuple[torch.dtype, ...], pack: Pack) -> int:
    """Give every CPU ``nn.Linear`` of ``model`` whose weight has one of ``dtypes`` a packed form
    (``pack(name, module, weight)`` stores it and sets ``module.forward``; ``weight()`` gives the
    dense weight to pack, which ``pack`` must copy, and is not read if ``pack`` never calls it),
    each group of :data:`SIBLINGS` as one product over their stacked weights, named
    ``PARENT.fused_q_proj_k_proj_v_proj``; release the dense weights nothing else shares; return
    how many of the model's linears now run packed. Threads, pages and siblings: see above."""
    pages = _FilePages()
    counts: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        counts[param.data_ptr()] = counts.get(param.data_ptr(), 0) + 1
    groups = _sibling_groups(model, dtypes)
    grouped = {id(getattr(parent, name)) for _, parent, names in groups for name in names}
    linears = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        packable = weight is not None and weight.dtype in dtypes and id(module) not in grouped
        if type(module) is nn.Linear and weight.device.type == "cpu" and packable:
            linears.append((name, module))
    scratch = _Scratch()

    def pack_group(group: tuple[str, nn.Module, tuple[str, ...]]) -> nn.Linear:
        parent_name, parent, names = group
        members = [getattr(parent, name) for name in names]
        weights = [m.weight.detach() for m in members]
        with torch.device("meta"):  # the product keeps only its shape: its weight lives packed
            product = nn.Linear(weights[0].shape[1], sum(w.shape[0] for w in weights), bias=False)

        def stacked() -> torch.Tensor:
            for weight in weights:
                pages.populate(weight)
            out = scratch.take(product.out_features, product.in_features, weights[0].dtype)
            return torch.cat(weights, out=out)

        with torch.no_grad():
            if members[0].bias is not None:
                product.bias = nn.Parameter(
                    torch.cat([m.bias.detach() for m in members]), requires_grad=False
                )
            pack(f"{parent_name}.fused_{'_'.join(names)}".lstrip("."), product, stacked)
        for member in members:  # now, not after the last group: the file pages leave the resident set
            pages.release(member)
            if member.bias is not None:  # the product carries it
                member.bias = _shape_only(member.bias)
        return product

    def pack_one(item: tuple[str, nn.Linear]) -> None:
        name, module = item
        weight = module.weight.detach()

        def dense() -> torch.Tensor:
            pages.populate(weight)
            return weight

        with torch.no_grad():  # per thread: grad mode is thread-local
            pack(name, module, dense)
        if counts.get(weight.data_ptr(), 0) == 1:
            pages.release(module)

    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        products = list(pool.map(pack_group, groups))  # list(): re-raises the first error of any thread
        list(pool.map(pack_one, linears))
    for (_, parent, names), product in zip(groups, products, strict=True):
        parent.add_module("fused_" + "_".join(names), product)
        shared = _SiblingProduct(product, [getattr(parent, name).out_features for name in names])
        for index, name in enumerate(names):
            member = getattr(parent, name)
            member.sibling_product, member.sibling_index = shared, index
            member.forward = types.MethodType(_sibling_forward, member)
    return len(linears) + len(grouped)


def use_onednn_linear(model: nn.Module, store: WeightStore | None = None) -> int:
    """Switch the model's CPU fp32/bf16 linears to pre-packed oneDNN weights, siblings stacked;
    return how many of the model's linears now run on them. With a ``store``, the packed weights
    are read from it when it has them, and written to it when it has not (see
    :mod:`diversed.backends.cpu.packed_store`)."""
    if not available():
        return 0
    stored = store.load() if store is not None else None
    packed: dict[str, torch.Tensor] = {}

    def pack(name: str, module: nn.Linear, weight: Callable[[], torch.Tensor]) -> None:
        shape = (module.out_features, module.in_features)
        kept = stored.get(name) if stored is not None else None
        if kept is None or tuple(kept.shape) != shape:  # the store's key fixes the dtype
            kept = torch.ops.mkldnn._reorder_linear_weight(weight(), None)
        module.packed_weight = packed[name] = kept
        module.forward = types.MethodType(_packed_forward, module)

    dtypes = (torch.float32, torch.bfloat16) if onednn_bf16() else (torch.float32,)
    count = pack_linears(model, dtypes, pack)
    if store is not None and stored is None and packed:
        store.save(packed)
    return count
