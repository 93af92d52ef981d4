"""InPlaceKV (the KV store on accelerators) holds what DynamicCache holds and decodes alike in the engine."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from diversed import DecodeConfig, Decoder
from diversed.engine import cache as cache_module
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


@pytest.mark.parametrize(
    "values",
    [
        {"method": "sd", "temperature": 0.0},
        {"method": "static", "target_weight": 0.5, "temperature": 1.0},
        {"method": "lossy", "lenience": 0.5, "temperature": 1.0},
    ],
)
def test_decoding_through_the_in_place_store_equals_the_cpu_store_batched_and_batch_one(
    pair, tokenizer, values, monkeypatch
):
    target, draft = pair
    prompts = [tokenizer(p).input_ids for p in ["def f(x):", "a", "The quick brown fox jumps"]]
    config = DecodeConfig.from_dict({**values, "max_new_tokens": 24, "num_assistant_tokens": 3})
    seeds = [5, 6, 7]
    reference = [g.token_ids for g in Decoder(target, draft, config).generate_batch(prompts, seeds=seeds)]
    monkeypatch.setattr(
        cache_module, "key_value_store", lambda model, capacity: InPlaceKV(model.config.num_hidden_layers, 2)
    )  # capacity 2: the buffers grow as the batch runs
    batched = [g.token_ids for g in Decoder(target, draft, config).generate_batch(prompts, seeds=seeds)]
    single = [
        Decoder(target, draft, config).generate_batch([p], seeds=[s])[0].token_ids
        for p, s in zip(prompts, seeds, strict=True)
    ]
    assert batched == reference and single == reference
    if values["temperature"] == 0.0:
        auto = Decoder(target, None, DecodeConfig.from_dict({"method": "auto", "max_new_tokens": 24}))
        assert [auto.generate(p).token_ids for p in prompts] == reference
