"""What a block costs on this machine: the profile ``--num-assistant-tokens auto`` chooses k from.

The target's forward time over n = 1 .. K + 1 tokens per row and the draft's one-token step, each
at B = 1, 2, 4, 8 and 16 rows, measured once on the loaded models and kept under the cache
(``$DIVERSED_CACHE/profiles``, as the packed weights), keyed by the pair, dtype, weight storage,
device, threads and K. Every decode record names the profile's digest, so a k-auto run says which
costs chose its blocks; with the same profile the choices, and so the outputs, repeat exactly.
"""

from __future__ import annotations

import hashlib
import json
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diversed.devices import sync
from diversed.engine.cache import RaggedCache
from diversed.files import cache_dir, read_json

BATCH_SIZES = (1, 2, 4, 8, 16)
CONTEXT = 32  # cached tokens per row under each timed forward


@dataclass(frozen=True)
class CostProfile:
    """Seconds of one forward, by rows in flight: the target's over 1 .. K + 1 tokens per row, the
    draft's over one."""

    target: dict[int, list[float]]
    draft: dict[int, float]
    measured_on: dict[str, Any]

    def costs(self, rows: int) -> tuple[list[float], float]:
        """(target seconds by tokens - 1, draft seconds) at the smallest measured B holding ``rows``."""
        size = min((b for b in self.target if b >= rows), default=max(self.target))
        return self.target[size], self.draft[size]

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": {str(b): v for b, v in self.target.items()},
            "draft": {str(b): v for b, v in self.draft.items()},
            "measured_on": self.measured_on,
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> CostProfile:
        return cls(
            {int(b): v for b, v in values["target"].items()},
            {int(b): v for b, v in values["draft"].items()},
            values.get("measured_on", {}),
        )

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def forward_seconds(cache: RaggedCache, tokens: int, repeats: int = 3) -> float:
    """Median seconds of a forward over ``tokens`` new tokens per row of ``cache``, which is left as
    it was (the new columns are dropped again)."""
    rows, device = cache.lengths.shape[0], cache.lengths.device
    ids = torch.ones(rows, tokens, dtype=torch.long, device=device)
    valid = torch.ones_like(ids, dtype=torch.bool)
    times = []
    for _ in range(repeats + 1):  # the first warms up
        sync(device)
        start = time.perf_counter()
        cache.forward(ids, valid, logits_to_keep=1)
        sync(device)
        times.append(time.perf_counter() - start)
        cache.keep_new(tokens, torch.zeros_like(valid))
        cache.crop_trailing(cache.columns - tokens - 1)
    return statistics.median(times[1:])


@torch.inference_mode()
def measure(target, draft, max_k: int, batch_sizes: tuple[int, ...] = BATCH_SIZES) -> CostProfile:
    """Time both models at every batch size: a few minutes for a 1.5B pair on a 2-core CPU."""
    costs_target, costs_draft = {}, {}
    for rows in batch_sizes:
        prompt = [[(7 * i) % 97 + 1 for i in range(CONTEXT)]] * rows
        caches = []
        for model in (target, draft):
            cache = RaggedCache(model, rows, CONTEXT + max_k + 2)
            cache.prefill(prompt)
            caches.append(cache)
        costs_target[rows] = [forward_seconds(caches[0], n) for n in range(1, max_k + 2)]
        costs_draft[rows] = forward_seconds(caches[1], 1)
    where = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__}
    return CostProfile(costs_target, costs_draft, {**where, "threads": torch.get_num_threads()})


def profile_path(names: dict[str, Any]) -> Path:
    """Where the profile of this pair and setup is kept (``names``: pair, dtype, weights, device, K)."""
    key = json.dumps({**names, "threads": torch.get_num_threads()}, sort_keys=True)
    return cache_dir() / "profiles" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def load_or_measure(target, draft, max_k: int, names: dict[str, Any]) -> tuple[CostProfile, Path]:
    """The stored profile of this setup, or a new one measured now and stored."""
    path = profile_path({**names, "max_k": max_k})
    if path.is_file():
        return CostProfile.from_dict(read_json(path)), path
    profile = measure(target, draft, max_k)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".staging")
    staging.write_text(json.dumps({**profile.to_dict(), "names": names}, indent=1) + "\n")
    staging.replace(path)
    return profile, path
