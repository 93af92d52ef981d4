"""Key/value storage written in place: the buffers a :class:`~diversed.engine.cache.RaggedCache` fills.

transformers' ``DynamicCache`` grows every layer's keys and values by ``torch.cat`` at every forward,
so each step copies the whole cache once per layer (on the 8B shapes, 3,000+ ``cat`` calls per
generate call, ``../shared/reference/gpu.md``). Here every layer owns one pre-allocated buffer
[B, H_kv, capacity, D] for keys and one for values; a forward writes its q new columns in place at
the shared column pointer and attention reads a view of the columns written so far. Nothing is
copied per step; cropping moves the pointer back; a buffer that runs out of room doubles (rare: the
capacity starts at the prompt width plus the budget plus a block).

It speaks the part of transformers' cache protocol that a decoder layer and the model's forward use
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
