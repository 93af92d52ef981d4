"""diversed: relaxed speculative decoding (DIVERSED, AISTATS 2026) on stock transformers."""

from diversed.config import ConfigError, DecodeConfig
from diversed.decoding import Decoder, Generation
from diversed.methods import CascadeRule, EnsembleSpace, Method, Schedule, parse_method
from diversed.stats import GenerationStats

__all__ = [
    "CascadeRule",
    "ConfigError",
    "DecodeConfig",
    "Decoder",
    "EnsembleSpace",
    "Generation",
    "GenerationStats",
    "Method",
    "Schedule",
    "parse_method",
]
__version__ = "0.1.0"
