"""Stored traces as training reads them: one :class:`Trajectory` per sequence, from the folder
``diversed.jobs.traces`` writes (``manifest.json`` plus ``seq-NNNNN.safetensors`` per sequence).
Reading them needs no LM."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diversed.data import DataError
from diversed.files import read_json, read_tensors, require


@dataclass
class Trajectory:
    """One stored sequence, as training reads it."""

    id: str
    reward: float
    tensors: dict[str, torch.Tensor]


def load_traces(directory: str | Path) -> tuple[list[Trajectory], dict[str, Any]]:
    """Every finished sequence of a trace folder, and its manifest."""
    path = Path(directory)
    if not (path / "manifest.json").exists():
        raise DataError(f"no traces at {path} (expected manifest.json; run `diversed collect-traces`)")
    where = path / "manifest.json"
    manifest = require(read_json(where), ("sequences",), where, "a trace manifest")
    for number, sequence in enumerate(manifest["sequences"], 1):
        require(
            sequence, ("id", "reward", "file", "tokens"), f"{where}: sequence {number}", "a trace sequence"
        )
    trajectories = [
        Trajectory(s["id"], float(s["reward"]), read_tensors(path / f"{s['file']}.safetensors"))
        for s in manifest["sequences"]
        if s["tokens"] > 0
    ]
    if not trajectories:
        raise DataError(f"{path} holds no non-empty traces")
    return trajectories, manifest


def collection_figures(directory: str | Path) -> dict[str, float]:
    """What a trace folder holds, for its MLflow run: sequences, tokens, mean reward and the share
    of sequences with a non-zero reward (pass/fail tasks need enough of those to train on)."""
    sequences = read_json(Path(directory) / "manifest.json")["sequences"]
    rewards = [s["reward"] for s in sequences]
    return {
        "sequences": len(sequences),
        "tokens": sum(s["tokens"] for s in sequences),
        "mean_reward": sum(rewards) / max(1, len(rewards)),
        "rewarded_share": sum(r > 0 for r in rewards) / max(1, len(rewards)),
    }
