"""Shared fixtures: tiny random-weight model pairs built in code (no downloads)."""

from __future__ import annotations

import pytest
import torch

from diversed.tiny import tiny_pair, tiny_tokenizer


@pytest.fixture(scope="session", autouse=True)
def _single_thread() -> None:
    # Tiny models are dominated by per-op overhead; one thread makes runs faster and steadier.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def pair(tokenizer):
    """A 4-layer target and a 1-layer draft cut from it (greedy agreement about 2 in 3)."""
    return tiny_pair(vocab_size=len(tokenizer), seed=0)


@pytest.fixture(scope="session")
def small_vocab_pair():
    """An 8-token pair whose distributions differ (TV about 0.3), for exact distribution tests."""
    return tiny_pair(vocab_size=8, hidden=16, target_layers=2, draft_layers=1, layer_scale=0.3, seed=0)
