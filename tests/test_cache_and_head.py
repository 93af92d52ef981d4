"""KV-cache rollback, the head interface of the dynamic ensemble, and the dynamic schedule."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from diversed import DecodeConfig, Decoder
from diversed.decoding import _crop, _forward
from diversed.methods import Schedule
from diversed.schedules import DraftSchedule, make_schedule


@pytest.mark.parametrize("model_index", [0, 1])
def test_rolled_back_cache_gives_fresh_logits(pair, model_index):
    model = pair[model_index]
    prefix, rejected, continuation = [5, 9, 13, 2, 40], [7, 7, 8, 30], [11, 12, 60]
    cache = DynamicCache(config=model.config)
    _forward(model, prefix + rejected, cache)
    _crop(cache, len(prefix))
    assert cache.get_seq_length() == len(prefix)
    rolled, _ = _forward(model, continuation, cache)
    with torch.no_grad():
        fresh = model(torch.tensor([prefix + continuation])).logits[0, len(prefix) :]
    assert torch.allclose(rolled, fresh, atol=1e-5)


class ConstantHead:
    """Returns the same target weight everywhere, and checks what the loop hands it."""

    def __init__(self, weight: float, hidden: int) -> None:
        self.weight, self.hidden, self.calls = weight, hidden, 0

    def __call__(self, h_draft: torch.Tensor, h_target: torch.Tensor) -> torch.Tensor:
        assert h_draft.shape == h_target.shape and h_draft.shape[1] == self.hidden
        self.calls += 1
        return torch.full((h_draft.shape[0],), self.weight)


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
    assert head.calls == b.stats.blocks


def test_diversed_without_head_is_an_error(pair):
    with pytest.raises(ValueError, match="head"):
        Decoder(*pair, DecodeConfig.from_dict({"method": "diversed"}))


def test_dynamic_schedule_stops_on_low_confidence_and_adapts_threshold():
    schedule = make_schedule(Schedule.DYNAMIC, 5)
    assert schedule.threshold == 0.4
    schedule.begin()
    assert schedule.stop_early(0.3) and not schedule.stop_early(0.5)
    # accepted drafts had high probability, rejected ones low: the ROC threshold lands between
    for _ in range(3):
        schedule.observe([0.9, 0.8, 0.2], num_accepted=2)
    assert 0.2 < schedule.threshold <= 0.8
    assert schedule.stop_early(0.3)  # the old threshold holds until the next call, as in HF
    schedule.begin()
    assert schedule.stop_early(schedule.threshold - 1e-6) and not schedule.stop_early(schedule.threshold)
    assert schedule.threshold != 0.4


def test_threshold_zero_never_stops_and_never_adapts():
    schedule = DraftSchedule(3, 0.0)
    schedule.begin()
    assert not schedule.stop_early(0.0)
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
