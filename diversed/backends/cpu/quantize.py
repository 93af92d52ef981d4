"""fp16 weights for CPU decoding: half the bytes of fp32, fp32 activations and accumulation.

Why. Single-stream decoding on a CPU streams every weight once per forward, so bytes per weight
set the speed (``../shared/reference/cpu-speed.md``). On CPUs without native bf16 (AVX2 only),
oneDNN cannot run bf16 at all and fp32 streams 4 bytes per weight. torch ships fbgemm's
"dynamic fp16" linear: the weight is stored once as fp16 in fbgemm's packed layout and widened to
fp32 inside the kernel (F16C), activations and sums stay fp32. Measured on a 2-core AVX2 EPYC
(``benchmarks/results/quantize-look.json``): one 1536 -> 8960 projection ~2.3x faster than the
oneDNN fp32 linear at 1 and 5 rows, ~1.4x at 20.

Why not int8. Int8 weights with 7-bit activations scaled per row (fbgemm, 4.7x faster at 5 rows)
looked better still, but quantizing *activations* makes the model a discontinuous function of its
inputs: a relative perturbation of 1e-7 in the first layer's output (the size of the summation-order
differences between a 1-token step and a k-token verification) moved the 1.5B model's logits by
3.8, where fp32 moves them by 6e-5. Speculative decoding verifies k + 1 tokens in one forward, so
its "target" would differ from the autoregressive one by that much: greedy ``sd`` left ``auto`` at
the second token of the first HumanEval prompt. Weight-only fp16 keeps the model continuous: its
logits move as little as fp32's do, and ``sd`` stays the target's decoding.

Cost. fp16 rounds each weight to 11 significant bits (bf16 keeps 8): a small, fixed change of the
model, the same for every method. Results equal ``F.linear`` on the fp16-rounded weight up to
summation order. Call it last, like :func:`diversed.backends.cpu.onednn.use_onednn_linear`: the model
cannot be trained or moved afterwards.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable

import torch
from torch import nn

from diversed.backends.cpu.onednn import pack_linears
from diversed.config import QUANTIZE


def available() -> bool:
    """fbgemm's fp16 linear (x86 CPUs)."""
    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(
        torch.ops.quantized, "linear_dynamic_fp16"
    )


def choose_quantize(name: str, dtype: str, device: str = "cpu") -> tuple[str, str]:
    """The weight storage to use, and why: ``auto`` is fp16 where the models would otherwise run
    fp32 linears on a CPU (no native bf16 there) and fbgemm is at hand, ``none`` elsewhere."""
    if name not in QUANTIZE:
        raise ValueError(f"quantize {name!r} is not one of: {', '.join(QUANTIZE)}")
    if name == "fp16" and device != "cpu":
        raise ValueError(f"--quantize fp16 runs on CPU only (fbgemm), not on {device}: use --dtype there")
    if name != "auto":
        return name, "asked for"
    if device != "cpu":
        return "none", f"{device} runs the models' own dtype"
    if dtype != "float32":
        return "none", f"the models run in {dtype}, already 2 bytes per weight"
    if not available():
        return "none", "this torch has no fbgemm fp16 kernels"
    return "fp16", "fp32 models on a CPU: fp16 weights stream half the bytes"


def pack_fp16(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.ScriptObject:
    """One linear's weight (and fp32 bias) in fbgemm's packed fp16 form."""
    bias = None if bias is None else bias.detach().float()
    with warnings.catch_warnings():  # fbgemm warns about weights beyond fp16's range, then saturates them
        warnings.simplefilter("ignore")
        return torch.ops.quantized.linear_prepack_fp16(weight.detach().float(), bias)


def fp16_linear(x: torch.Tensor, packed: torch.ScriptObject) -> torch.Tensor:
    """``x @ W.T + b`` with ``W`` from :func:`pack_fp16`, computed in fp32, returned in ``x``'s dtype."""
    return torch.ops.quantized.linear_dynamic_fp16(x.float(), packed).to(x.dtype)


def _fp16_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return fp16_linear(x, self.fp16_weight)


def _pack(name: str, module: nn.Linear, weight: Callable[[], torch.Tensor]) -> None:
    module.fp16_weight = pack_fp16(weight(), module.bias)
    module.forward = types.MethodType(_fp16_forward, module)


def use_fp16_weights(model: nn.Module) -> int:
    """Switch every CPU linear of ``model`` to fp16 weights with fp32 compute; return how many."""
    if not available():
        raise ValueError("--quantize fp16 needs torch's fbgemm kernels (x86 CPUs); this torch has none")
    return pack_linears(model, (torch.float32, torch.bfloat16, torch.float16), _pack)
