"""diversed: relaxed speculative decoding (DIVERSED, AISTATS 2026) on stock transformers.

The public names are imported on first use, so that light commands (scoring, reports, data checks)
do not pay for importing torch and transformers.
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
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'diversed' has no attribute {name!r}")
