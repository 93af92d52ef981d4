"""diversed: relaxed speculative decoding (DIVERSED, AISTATS 2026) on stock transformers.

The public names are imported on first use, so that light commands (scoring, reports, data checks)
do not pay for importing torch and transformers.

Layers, each importing only those above it in this list (``tests/test_layout.py`` checks):

- core modules: ``config`` (decoding knobs), ``methods`` (the method enum), ``devices``, ``files``,
  ``head`` (the ensemble head), ``provenance``, with ``data/`` (datasets, tasks) and ``sandbox/``;
- ``engine/``: the decoding algorithm;
- ``backends/``: device-specific speed (CPU packing, CUDA graphs) behind the engine's interfaces;
- ``loading/``: models, the decoding stack, embedded and tiny models;
- ``evaluation/`` (scores, intervals, frontier, tables, plots) and ``training/`` (the head's RL on
  stored traces), neither running an LM;
- ``jobs/``: models over a dataset (decode, traces, the on-policy check, bench);
- ``pipeline/``: workflow support (grid, config, MLflow, doctor); ``cli/``: the command.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ConfigError": "diversed.config",
    "DecodeConfig": "diversed.config",
    "Decoder": "diversed.engine.loop",
    "Generation": "diversed.engine.loop",
    "GenerationStats": "diversed.engine.stats",
    "CascadeRule": "diversed.methods",
    "EnsembleSpace": "diversed.methods",
    "Method": "diversed.methods",
    "Schedule": "diversed.methods",
    "parse_method": "diversed.methods",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name == "Decoder":  # with every step a backend provides (CUDA graphs)
        import_module("diversed.backends.cuda")
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'diversed' has no attribute {name!r}")
