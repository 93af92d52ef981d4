"""The decoding engine: batched autoregressive and speculative decoding on stock transformers.

Read in this order: :mod:`~diversed.engine.loop` (the block loop and its invariants),
:mod:`~diversed.engine.state` (what a batch carries between steps), :mod:`~diversed.engine.cache`
(the shared KV cache with holes), :mod:`~diversed.engine.kv` (its keys and values, written in
place), :mod:`~diversed.engine.prefix` (a prompt prefix prefilled once per job),
:mod:`~diversed.engine.compat` (transformers' cache API), :mod:`~diversed.engine.rules`
(verification rules on [B, L, V]), :mod:`~diversed.engine.sampling` (distributions and per-row
randomness), :mod:`~diversed.engine.schedules` (draft lengths) and :mod:`~diversed.engine.stats`
(counters and timings). This package is the algorithm alone: device-specific speed (CPU kernels,
packed weights, CUDA graphs) lives in :mod:`diversed.backends`, which implements the interfaces
this package owns (``cache.RUNNERS``). May import: the core modules only (config, methods,
devices, head); never a backend, a loader, the CLI, the workflow or MLflow.
"""

from importlib import import_module
from typing import Any

__all__ = ["Decoder", "EnsembleHead", "Generation", "GenerationStats"]
_HOMES = {"Decoder": "loop", "EnsembleHead": "state", "Generation": "state", "GenerationStats": "stats"}


def __getattr__(name: str) -> Any:
    """The package's names, imported when first asked for: ``engine.stats`` (counters, read by the
    score jobs) must not pull in torch with the loop."""
    if name not in _HOMES:
        raise AttributeError(f"module 'diversed.engine' has no attribute {name!r}")
    return getattr(import_module(f"diversed.engine.{_HOMES[name]}"), name)
