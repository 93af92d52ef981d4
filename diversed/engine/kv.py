"""Key/value storage written in place: the buffers a :class:`~diversed.engine.cache.RaggedCache` fills.

transformers' ``DynamicCache`` grows every layer's keys and values by ``torch.cat`` at every forward,
so each step copies the whole cache once per layer (on the 8B shapes, 3,000+ ``cat`` calls per
generate call, ``../shared/reference/gpu.md``). Here every layer owns one pre-allocated buffer
[B, H_kv, capacity, D] for keys and one for values; a forward writes its q new columns in place at
the shared column pointer and attention reads a view of the columns written so far. Nothing is
copied per step; cropping moves the pointer back; a buffer that runs out of room doubles (rare: the
capacity starts at the prompt width plus the budget plus a block).

:class:`FixedKV` is the store of the fixed-shape step (every forward sees the same shapes and
addresses, so it can be replayed from a CUDA graph): attention reads its whole capacity.

Both speak the part of transformers' cache protocol that a decoder layer and the model's forward use
(``update`` and ``get_seq_length``), which is stable across the transformers range we test; the
attention mask is always ours (4D), so transformers never asks it for mask sizes.
"""

from __future__ import annotations

from typing import Any

import torch


class InPlaceKV:
    """Per-layer key/value buffers with a column pointer shared by the layers (see module docstring)."""

    def __init__(self, layers: int, capacity: int) -> None:
        self.layers = layers
        self.capacity = max(1, capacity)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.length = 0  # columns written by every layer

    def _room(self, index: int, needed: int, like: torch.Tensor) -> None:
        """Allocate layer ``index``'s buffers at the first write; double them when ``needed`` columns
        do not fit (the columns written so far are copied once)."""
        if index == len(self.keys):
            shape = (*like.shape[:2], max(self.capacity, needed), like.shape[-1])
            self.keys.append(like.new_zeros(shape))
            self.values.append(like.new_zeros(shape))
            return
        have = self.keys[index].shape[2]
        if needed <= have:
            return
        size = max(needed, 2 * have)
        for store in (self.keys, self.values):
            old = store[index]
            grown = old.new_zeros((*old.shape[:2], size, old.shape[-1]))
            grown[:, :, : self.length] = old[:, :, : self.length]
            store[index] = grown

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one layer's new columns at the pointer; return views of all its columns so far. The
        pointer moves once the last layer has written."""
        end = self.length + key_states.shape[2]
        self._room(layer_idx, end, key_states)
        self.keys[layer_idx][:, :, self.length : end] = key_states
        self.values[layer_idx][:, :, self.length : end] = value_states
        keys, values = self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]
        if layer_idx == self.layers - 1:
            self.length = end
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """Drop the last ``-max_length`` columns (negative, as ``DynamicCache.crop`` takes it); later
        writes overwrite them."""
        if max_length >= 0:
            raise ValueError(f"crop takes a negative count of columns to drop, not {max_length}")
        self.length = max(0, self.length + max_length)

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` of the batch (a copy of each buffer; rows leave rarely)."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]


class FixedKV(InPlaceKV):
    """Per-layer key/value buffers of one fixed shape [rows, H_kv, capacity, D], for a fixed-shape step.

    A forward's tensors must keep their shapes and addresses from one step to the next for the step to
    be captured once as a CUDA graph and replayed (:mod:`diversed.backends.cuda.graphs`; gpt-fast's
    static cache). So attention reads every column of the capacity, and the caller's mask hides the
    ones no row has written (the price: attention work over the capacity instead of the columns
    used); a forward writes its q columns with ``index_copy_`` at ``columns``, a device tensor that a
    graph runner owns while it captures, and at the pointer otherwise. Rows that leave are compacted
    to the front in place (``batch_select_indices``), so the buffers never move; a forward over n rows
    uses the first n. Only running out of columns moves them (:meth:`reserve` doubles the capacity and
    bumps ``generation``, which tells a graph runner that its graphs point at freed memory).
    """

    def __init__(self, layers: int, capacity: int) -> None:
        super().__init__(layers, capacity)
        self.columns: torch.Tensor | None = None  # [q] where a captured forward writes
        self.generation = 0  # bumped whenever the buffers move

    def reserve(self, needed: int) -> None:
        """Make room for ``needed`` columns (double, copying what is written), before a forward."""
        if needed <= self.capacity:
            return
        self.capacity = max(needed, 2 * self.capacity)
        for store in (self.keys, self.values):
            for index, old in enumerate(store):
                grown = old.new_zeros((*old.shape[:2], self.capacity, old.shape[-1]))
                grown[:, :, : self.length] = old[:, :, : self.length]
                store[index] = grown
        self.generation += 1

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one layer's q new columns of the forward's rows; return those rows' full buffers."""
        width = key_states.shape[2]
        if layer_idx == 0 and self.columns is None:  # a graph runner reserves before it captures
            self.reserve(self.length + width)
        if layer_idx == len(self.keys):  # the first write (the prefill) sizes the rows
            shape = (*key_states.shape[:2], self.capacity, key_states.shape[-1])
            self.keys.append(key_states.new_zeros(shape))
            self.values.append(key_states.new_zeros(shape))
        columns = self.columns
        if columns is None:
            columns = torch.arange(self.length, self.length + width, device=key_states.device)
        rows = key_states.shape[0]
        keys, values = self.keys[layer_idx][:rows], self.values[layer_idx][:rows]
        keys.index_copy_(2, columns, key_states)
        values.index_copy_(2, columns, value_states)
        if layer_idx == self.layers - 1:
            self.length += width
        return keys, values

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        """Keep only ``rows``, moved to the front of the same buffers (their addresses stay)."""
        for store in (self.keys, self.values):
            for buffer in store:
                buffer[: len(rows)] = buffer[rows]
