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
picks native bf16 kernels where the CPU has them). The dense weight is released (kept as a
shape-only tensor on the ``meta`` device) unless another module shares it, such as a tied input
embedding, so memory does not double. Results equal ``F.linear`` up to summation order. Call it
last: the model cannot be moved or trained afterwards.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from diversed.config import DTYPES


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def native_bf16() -> str | None:
    """The CPU feature that gives native bf16 dot products (AMX or avx512_bf16), or None."""
    if torch.cpu._is_amx_tile_supported():
        return "AMX"
    if torch.cpu._is_avx512_bf16_supported():
        return "avx512_bf16"
    return None


def choose_dtype(name: str, device: str = "cpu") -> tuple[str, str]:
    """The dtype to run in, and why: ``auto`` is bf16 on CUDA and on CPUs with native bf16 dot
    products, fp32 elsewhere (oneDNN would emulate bf16 there, slower than fp32)."""
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not one of: {', '.join(DTYPES)}")
    if name != "auto":
        return name, "asked for"
    if device.startswith("cuda"):
        return "bfloat16", "CUDA device"
    feature = native_bf16()
    if feature:
        return "bfloat16", f"the CPU has native bf16 dot products ({feature})"
    return "float32", "the CPU has no native bf16 dot products (no avx512_bf16, no AMX)"


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def use_onednn_linear(model: nn.Module) -> int:
    """Switch the model's CPU fp32/bf16 linears to pre-packed oneDNN weights; return how many."""
    if not available():
        return 0
    counts: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        counts[param.data_ptr()] = counts.get(param.data_ptr(), 0) + 1
    patched = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        packable = weight is not None and weight.dtype in (torch.float32, torch.bfloat16)
        if type(module) is not nn.Linear or weight.device.type != "cpu" or not packable:
            continue
        shared = counts.get(weight.data_ptr(), 0) > 1
        with torch.no_grad():
            module.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        if not shared:
            module.weight = nn.Parameter(torch.empty(weight.shape, device="meta"), requires_grad=False)
        module.forward = types.MethodType(_packed_forward, module)
        patched += 1
    return patched
