"""The shared cache with holes, the head interface of the dynamic ensemble, and the schedules."""

from __future__ import annotations

import copy

import pytest
import torch

from diversed import DecodeConfig, Decoder
from diversed.engine.cache import RaggedCache
from diversed.engine.schedules import DraftSchedule, make_schedule
from diversed.methods import Schedule


def left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids [B, max len] and their validity mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    valid = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        valid[row, width - len(prompt) :] = True
    return ids, valid


def fresh_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("model_index", [0, 1])
def test_rejected_columns_become_holes_and_change_nothing(pair, model_index):
    model = pair[model_index]
    prefix, rejected, continuation = [5, 9, 13, 2, 40], [7, 7, 8, 30], [11, 12, 60]
    cache = RaggedCache(model, 1)
    with torch.no_grad():
        cache.forward(torch.tensor([prefix + rejected]), torch.ones(1, 9, dtype=torch.bool))
        cache.keep_new(len(rejected), torch.zeros(1, len(rejected), dtype=torch.bool))
        assert int(cache.lengths[0]) == len(prefix) and cache.columns == 9
        rolled, _ = cache.forward(torch.tensor([continuation]), torch.ones(1, 3, dtype=torch.bool))
    assert torch.allclose(rolled[0], fresh_logits(model, prefix + continuation)[len(prefix) :], atol=1e-5)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_padded_batch_with_holes_equals_batch_one_forwards(pair, attention):
    """Left padding, a one-token prompt and holes in the middle: every row's logits equal a fresh
    batch-1 forward over its own tokens, and nothing is NaN (the padding rows attend to themselves)."""
    model = copy.deepcopy(pair[0])
    model.set_attn_implementation(attention)
    prompts = [[5, 9, 13, 2, 40, 41, 42], [7], [11, 12, 60, 61]]
    ids, valid = left_pad(prompts, 0)
    cache = RaggedCache(model, 3)
    with torch.no_grad():
        logits, _ = cache.forward(ids, valid)
        assert not torch.isnan(logits).any()
        # a block of 3 columns; row 0 keeps 1, row 1 keeps 3, row 2 keeps none of its last 2
        block = torch.tensor([[20, 21, 22], [23, 24, 25], [26, 27, 28]])
        cache.forward(block, torch.tensor([[True, True, True], [True, True, True], [True, False, False]]))
        cache.keep_new(3, torch.tensor([[True, False, False], [True, True, True], [True, True, True]]))
        after = torch.tensor([[30, 31], [32, 33], [34, 35]])
        logits, _ = cache.forward(after, torch.ones(3, 2, dtype=torch.bool))
    assert not torch.isnan(logits).any()
    rows = [prompts[0] + [20, 30, 31], prompts[1] + [23, 24, 25, 32, 33], prompts[2] + [26, 34, 35]]
    for b, row in enumerate(rows):
        assert cache.lengths[b] == len(row)
        assert torch.allclose(logits[b], fresh_logits(model, row)[-2:], atol=1e-5), b


class ConstantHead:
    """Returns the same target weight everywhere, and checks what the loop hands it."""

    def __init__(self, weight: float, hidden: int) -> None:
        self.weight, self.hidden, self.calls = weight, hidden, 0

    def __call__(self, h_draft: torch.Tensor, h_target: torch.Tensor) -> torch.Tensor:
        assert h_draft.shape == h_target.shape and h_draft.shape[-1] == self.hidden
        self.calls += 1
        return torch.full(h_draft.shape[:-1], self.weight)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("weight", [0.0, 0.4, 1.0])
def test_constant_head_reproduces_static(pair, tokenizer, temperature, weight):
    prompt = tokenizer("for i in range(3):").input_ids
    common = {"temperature": temperature, "num_assistant_tokens": 4, "max_new_tokens": 40, "seed": 3}
    static = Decoder(*pair, DecodeConfig.from_dict({**common, "method": "static", "target_weight": weight}))
    head = ConstantHead(weight, pair[0].config.hidden_size)
    dynamic = Decoder(*pair, DecodeConfig.from_dict({**common, "method": "diversed"}), head=head)
    a, b = static.generate(prompt), dynamic.generate(prompt)
    assert a.token_ids == b.token_ids
    assert a.stats.accepted == b.stats.accepted and a.stats.drafted == b.stats.drafted
    # one head call per block that drafted: all but a last block left with a one-token budget
    assert b.stats.blocks - 1 <= head.calls <= b.stats.blocks


def test_diversed_without_head_is_an_error(pair):
    with pytest.raises(ValueError, match="head"):
        Decoder(*pair, DecodeConfig.from_dict({"method": "diversed"}))


def test_dynamic_schedule_stops_on_low_confidence_and_adapts_threshold():
    schedule = make_schedule(Schedule.DYNAMIC, 5)
    assert schedule.threshold == 0.4
    schedule.begin()
    assert schedule.call_threshold == 0.4
    # accepted drafts had high probability, rejected ones low: the ROC threshold lands between
    for _ in range(3):
        schedule.observe([0.9, 0.8, 0.2], num_accepted=2)
    assert 0.2 < schedule.threshold <= 0.8
    assert schedule.call_threshold == 0.4  # the old threshold holds until the next call, as in HF
    schedule.begin()
    assert schedule.call_threshold == schedule.threshold
    assert schedule.threshold != 0.4


def test_threshold_zero_never_stops_and_never_adapts():
    schedule = DraftSchedule(3, 0.0)
    schedule.begin()
    assert schedule.call_threshold == 0.0
    for _ in range(5):
        schedule.observe([0.9, 0.1], 1)
    assert schedule.threshold == 0.0


def test_dynamic_schedule_in_the_loop(pair, tokenizer):
    cfg = DecodeConfig.from_dict(
        {"method": "sd", "schedule": "dynamic", "num_assistant_tokens": 8, "max_new_tokens": 60}
    )
    decoder = Decoder(*pair, cfg)
    stats = decoder.generate(tokenizer("import os\n").input_ids).stats
    assert stats.drafted < 8 * stats.blocks  # confidence stops cut some blocks short
