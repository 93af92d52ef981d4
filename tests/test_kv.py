"""InPlaceKV holds exactly what transformers' DynamicCache would, through growth, crops and row selection."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from diversed.engine.kv import InPlaceKV


def _chunk(rows: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, width, 4, generator=generator), torch.randn(
        rows, 2, width, 4, generator=generator
    )


def test_in_place_store_matches_dynamic_cache_through_growth_crops_and_row_selection():
    layers = 3
    ours, theirs = InPlaceKV(layers, capacity=2), DynamicCache()  # capacity 2: it must grow repeatedly
    steps = [
        ("write", 5),
        ("write", 1),
        ("crop", -2),
        ("write", 4),
        ("select", [2, 0]),
        ("write", 3),
        ("crop", -6),
    ]
    rows = 3
    for number, (kind, arg) in enumerate(steps):
        if kind == "write":
            for layer in range(layers):
                keys, values = _chunk(rows, arg, 10 * number + layer)
                got = ours.update(keys, values, layer)
                want = theirs.update(keys, values, layer)
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        elif kind == "crop":
            ours.crop(arg)
            theirs.crop(arg)
        else:
            index = torch.tensor(arg)
            ours.batch_select_indices(index)
            theirs.batch_select_indices(index)
            rows = len(arg)
        assert ours.get_seq_length() == theirs.get_seq_length()
    for layer in range(layers):  # what a next forward would attend to
        keys, values = _chunk(rows, 1, 99)
        assert torch.equal(ours.update(keys, values, layer)[0], theirs.update(keys, values, layer)[0])
