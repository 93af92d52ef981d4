"""A prompt prefix shared by the rows of a job, prefilled once per model.

Every prompt of a few-shot task starts with the same block (GSM8K's four worked examples, CNN/DM's
example article), and a group of rollouts repeats one whole prompt. Prefilling that block for every
row is most of a job's prefill; serving engines cache it (vLLM's prefix caching, SGLang's radix
tree). Here the caller names the shared token ids (the task's prompt builder knows them, see
``Task.prefix``), and each model computes their keys and values once, at its first use; every
batch of the job then starts its rows from them.

Why this is exact: the key and value at column i depend only on tokens 0..i (causal attention,
RoPE at position i), so the first m columns of the prefix's KV are those of any prompt that starts
with the same m tokens. A row only needs its *suffix* forwarded on top of them, at positions m, m+1,
... as a batch-1 run would; rows whose prompts share fewer tokens with the prefix use fewer of its
columns (m = 0: exactly the old per-row prefill). Rows with the same whole prompt (group rollouts)
are forwarded once.

Memory: one copy of the prefix per model, batch 1 ([1, H_kv, P, D] per layer for keys and values),
kept for the job; each row's columns of the batch's shared cache are still its own, as the ragged
layout of :mod:`diversed.engine.cache` needs.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from diversed.engine.compat import forward_with_cache, new_cache

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Per layer, the keys and values of the first columns of a sequence, [1, H_kv, columns, D] each.
LayerKV = list[tuple[torch.Tensor, torch.Tensor]]


class SharedPrefix:
    """Token ids every prompt of a job may start with, and each model's KV of them (lazily, once)."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = tuple(int(i) for i in ids)
        self._kv: weakref.WeakKeyDictionary[PreTrainedModel, LayerKV] = weakref.WeakKeyDictionary()

    def __len__(self) -> int:
        return len(self.ids)

    def common_length(self, prompt: Sequence[int]) -> int:
        """How many leading tokens ``prompt`` shares with the prefix."""
        length = 0
        for mine, theirs in zip(self.ids, prompt, strict=False):
            if mine != theirs:
                break
            length += 1
        return length

    def kv(self, model: PreTrainedModel) -> LayerKV:
        """The model's keys and values of the whole prefix, computed at the first call."""
        if model not in self._kv:
            cache = new_cache(model)
            ids = torch.tensor([self.ids], device=model.device)
            forward_with_cache(model, cache, input_ids=ids, logits_to_keep=1)
            self._kv[model] = [(layer.keys, layer.values) for layer in cache.layers]
        return self._kv[model]

    def nbytes(self, model: PreTrainedModel) -> int:
        """Bytes the prefix's KV holds for ``model`` (0 before its first use)."""
        if model not in self._kv:
            return 0
        return sum(k.nbytes + v.nbytes for k, v in self._kv[model])


def prefill_rows(
    model: PreTrainedModel, prompts: Sequence[Sequence[int]], prefix: SharedPrefix | None
) -> list[LayerKV | None]:
    """Each prompt's keys and values (``None`` for an empty prompt), as a batch-1 prefill gives them.

    With a ``prefix`` (an empty one shares whole prompts only), a prompt's first m tokens shared
    with it come from the prefix's KV and only the rest is forwarded, and equal prompts are
    computed once and share the result (read-only). Without one, every prompt is forwarded whole,
    as if nothing were shared: what ``--prefix-cache off`` measures.
    """
    done: dict[tuple[int, ...], LayerKV | None] = {}
    results = []
    for prompt in prompts:
        key = tuple(prompt)
        if key in done and prefix is not None:
            results.append(done[key])
            continue
        if not key:
            done[key] = None
            results.append(None)
            continue
        shared = 0 if prefix is None else prefix.common_length(key)
        cache = new_cache(model)
        if shared:
            for index, (keys, values) in enumerate(prefix.kv(model)):
                cache.update(keys[:, :, :shared], values[:, :, :shared], index)
        if shared < len(key):
            ids = torch.tensor([key[shared:]], device=model.device)
            forward_with_cache(model, cache, input_ids=ids, logits_to_keep=1)
        done[key] = [(layer.keys, layer.values) for layer in cache.layers]
        results.append(done[key])
    return results
