"""A KV cache shared by the rows of a batch, with holes: one model's state during batched decoding.

Design ("holes", the first of the reference note's four): the rows share one key/value store
(:func:`key_value_store`) whose columns are appended to every row at once. A column is *valid* for a
row if it holds one of that row's real tokens; left padding at prefill and drafted tokens a row
rejected stay in the cache as invalid columns (holes) instead of being copied out. Why this design:

* nothing is copied per block (realigning the rows would copy both caches every block), and no
  per-row Python work is needed: a row's state is a column mask and a length;
* it is exact, because each cached key already carries its RoPE rotation, computed from the row's
  own position ids (valid tokens before it), and causal order follows the column index, so a hole
  changes nothing but the amount of attention work;
* batch 1 is the same code: its holes are only rejected drafts, and the trailing ones are cropped.

Invariants (per row): valid columns hold exactly the row's tokens, in order, at positions 0..n-1;
a hole never becomes valid again; every query row attends at least to itself, so a row of pure
padding never has an empty softmax (CUDA's SDPA would return NaN there).

Prefill runs each prompt alone, at its own length, and copies the rows' keys and values into the
shared cache right-aligned: a batched prefill would spend its compute on padding (prompts of a
dataset differ in length by several times), and per-row prefill is bit-identical to batch 1. A
prompt prefix shared by the job's rows is forwarded once per model and only each row's suffix per
row (:mod:`diversed.engine.prefix`).

The mask is passed as a 4D additive float mask [B, 1, q, past + q] (0 = attend, dtype minimum =
not), which transformers hands to the attention unchanged and which eager and SDPA read alike.
Columns invalid in every row are cropped from the right; columns at the left stay until the batch
ends (a finished row's prompt padding costs attention work only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from diversed.config import STEPS
from diversed.engine.compat import forward_with_cache, new_cache
from diversed.engine.kv import FixedKV, InPlaceKV
from diversed.engine.prefix import SharedPrefix, prefill_rows

if TYPE_CHECKING:
    from transformers import PreTrainedModel

StepRunner = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, bool, int], tuple[torch.Tensor, "torch.Tensor | None"]
]
"""One forward at the store's pointer: (ids, mask, positions, hidden, logits_to_keep) -> (logits,
last hidden states or None), as an eager forward would return them."""
RUNNERS: dict[str, Callable[[PreTrainedModel, FixedKV], StepRunner]] = {}
"""The forward runners of steps a device backend provides, by step name: the engine owns this
interface and never imports a backend; :mod:`diversed.backends.cuda` registers ``graphs``."""


def check_step(step: str) -> str:
    """``step`` if it is one of :data:`STEPS`, else a ValueError that names them."""
    if step not in STEPS:
        raise ValueError(f"step must be one of {', '.join(STEPS)}, not {step!r}")
    return step


def key_value_store(model: PreTrainedModel, capacity: int) -> Any:
    """Where one model's keys and values live. On an accelerator, :class:`InPlaceKV` (buffers written
    in place: no ``cat`` of the whole cache per layer and forward, the launch-bound GPU loop's cost).
    On a CPU, transformers' ``DynamicCache``, as before: measured side by side on the embedded pair
    (``benchmarks/kv_store.py``, ``benchmarks/results/kv-store-bf16-avx512.json``, 2 threads, idle)
    in-place was 0.96x / 0.94x for ``auto`` at B = 1 / 4 and 1.00x for ``sd``, outputs identical:
    the CPU's attention copies a strided view about as a ``cat`` does, and the CPU path must not slow."""
    if model.device.type == "cpu":
        return new_cache(model)
    return InPlaceKV(model.config.num_hidden_layers, capacity)


class RaggedCache:
    """One model's shared cache, with per-row validity and lengths (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, batch: int, capacity: int = 256, step: str = "eager") -> None:
        """``capacity``: columns to allocate (the storage doubles if a batch needs more); ``step``: one
        of :data:`STEPS`."""
        self.model = model
        if check_step(step) == "eager":
            self.cache = key_value_store(model, capacity)
        else:
            self.cache = FixedKV(model.config.num_hidden_layers, capacity)
        self.runner = None
        if step in RUNNERS:
            self.runner = RUNNERS[step](model, self.cache)
        elif step == "graphs":
            raise ValueError(
                "step 'graphs' needs the CUDA backend: import diversed.backends.cuda (diversed does)"
            )
        device = model.device
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)  # [B, columns]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # valid columns per row

    @property
    def columns(self) -> int:
        return self.valid.shape[1]

    def forward(
        self, ids: torch.Tensor, new_valid: torch.Tensor, hidden: bool = False, logits_to_keep: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append q columns ``ids`` [B, q] (``new_valid`` [B, q] marks real tokens); return logits
        [B, q', V] (q' = ``logits_to_keep`` or q) and, if asked, last-layer hidden states [B, q, d]."""
        past = self.columns
        width = ids.shape[1]
        positions = self.lengths.unsqueeze(1) + new_valid.long().cumsum(1) - 1
        positions = positions.clamp_min(0)
        valid = torch.cat([self.valid, new_valid], dim=1)
        key_index = torch.arange(past + width, device=ids.device)
        query_index = past + torch.arange(width, device=ids.device)
        causal = key_index.unsqueeze(0) <= query_index.unsqueeze(1)  # [q, past + q]
        allowed = valid.unsqueeze(1) & causal.unsqueeze(0)
        allowed = allowed | (key_index.unsqueeze(0) == query_index.unsqueeze(1)).unsqueeze(0)
        if isinstance(self.cache, FixedKV):  # attention reads every column; unwritten ones are hidden
            self.cache.reserve(past + width)
            unwritten = allowed.new_zeros((*allowed.shape[:2], self.cache.capacity - past - width))
            allowed = torch.cat([allowed, unwritten], dim=2)
        dtype = self.model.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=ids.device)
        mask = mask.masked_fill(~allowed, torch.finfo(dtype).min).unsqueeze(1)
        if self.runner is not None:
            logits, states = self.runner(ids, mask, positions, hidden, logits_to_keep)
        else:
            out = forward_with_cache(
                self.model,
                self.cache,
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                output_hidden_states=hidden,
                logits_to_keep=logits_to_keep,
            )
            logits, states = out.logits, out.hidden_states[-1] if hidden else None
        self.valid = valid
        self.lengths = self.lengths + new_valid.long().sum(1)
        return logits, states

    def prefill(self, prompts: list[list[int]], prefix: SharedPrefix | None = None) -> None:
        """Fill an empty cache with each row's tokens, right-aligned (left-padded with holes); the
        tokens a row shares with ``prefix`` come from the prefix's KV, computed once per model."""
        width = max(len(p) for p in prompts)
        if width == 0:
            return
        device = self.model.device
        rows = prefill_rows(self.model, prompts, prefix)
        shaped = next(kv for kv in rows if kv is not None)
        for index, (first_keys, _) in enumerate(shaped):
            keys = first_keys.new_zeros((len(prompts), first_keys.shape[1], width, first_keys.shape[-1]))
            values = torch.zeros_like(keys)
            for row, (kv, prompt) in enumerate(zip(rows, prompts, strict=True)):
                if kv is not None:
                    keys[row, :, width - len(prompt) :] = kv[index][0][0]
                    values[row, :, width - len(prompt) :] = kv[index][1][0]
            self.cache.update(keys, values, index)
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        self.valid = torch.arange(width, device=device) >= (width - lengths).unsqueeze(1)
        self.lengths = lengths

    def keep_new(self, width: int, keep: torch.Tensor) -> None:
        """Re-mark the last ``width`` columns: only those where ``keep`` [B, width] stay valid."""
        old = self.valid[:, -width:]
        self.valid = torch.cat([self.valid[:, :-width], old & keep], dim=1)
        self.lengths = self.lengths - (old & ~keep).long().sum(1)

    def crop_trailing(self, last_valid_column: int) -> None:
        """Drop the columns after ``last_valid_column``, which the caller knows are holes in every row."""
        extra = self.columns - 1 - last_valid_column
        if extra > 0:
            self.cache.crop(-extra)
            self.valid = self.valid[:, :-extra]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the batch)."""
        self.cache.batch_select_indices(rows)
        self.valid, self.lengths = self.valid[rows], self.lengths[rows]
