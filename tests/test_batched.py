"""Batched decoding equals batch-1 decoding row by row (fp32, tiny random models).

For every method and schedule, greedy and sampling, a batch of prompts of mixed lengths, with
different budgets and an end token that stops some rows early, must give each row exactly the
tokens, finish reason and counters of a batch-1 run with the same seed; permuting the rows must
change nothing. Sampling identity holds because each row owns its random stream.
"""

from __future__ import annotations

import pytest

from diversed import DecodeConfig, Decoder

PROMPTS = ["def f(x):\n    return", "a", "The quick brown fox jumps over", "import os\nimport sys\n\n"]
BUDGETS = [24, 9, 20, 24]
SEEDS = [11, 12, 13, 14]
COUNTERS = ("new_tokens", "drafted", "accepted", "blocks", "target_forwards", "draft_forwards")

METHODS = [
    {"method": "auto"},
    {"method": "sd"},
    {"method": "lossy", "lenience": 0.5},
    {"method": "static", "target_weight": 0.6},
    {"method": "static", "target_weight": 0.6, "ensemble_space": "logits"},
    {"method": "cascade", "cascade_rule": "opt", "cascade_alpha": 0.0},
    {"method": "cascade", "cascade_rule": "token", "cascade_alpha": 0.35},
    {"method": "diversed"},
    {"method": "gate", "gate": "tv", "gate_threshold": 0.3},
    {"method": "gate", "gate": "entropy", "gate_threshold": 2.0},
]


def decoder(pair, head, settings: dict, schedule: str, temperature: float, eos: list[int]) -> Decoder:
    config = DecodeConfig.from_dict(
        {**settings, "schedule": schedule, "temperature": temperature, "num_assistant_tokens": 4}
    )
    draft = None if settings["method"] == "auto" else pair[1]
    use_head = head if settings["method"] == "diversed" else None
    return Decoder(pair[0], draft, config, head=use_head, eos_token_ids=eos)


def summary(generation) -> tuple:
    stats = generation.stats
    return (generation.token_ids, generation.finish_reason, *(getattr(stats, c) for c in COUNTERS))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("schedule", ["constant", "heuristic", "heuristic_transient", "dynamic"])
@pytest.mark.parametrize("settings", METHODS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_batch_rows_equal_batch_one(pair, tokenizer, varied_head, settings, schedule, temperature):
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    # an end token that the free-running rows do produce, so that some rows stop early
    free = decoder(pair, varied_head, settings, schedule, temperature, []).generate_batch(
        prompts, BUDGETS, SEEDS
    )
    produced = [t for g in free for t in g.token_ids]
    eos = [max(set(produced), key=produced.count)]
    singles = [
        decoder(pair, varied_head, settings, schedule, temperature, eos).generate(p, budget, seed)
        for p, budget, seed in zip(prompts, BUDGETS, SEEDS, strict=True)
    ]
    assert any(s.finish_reason == "eos" for s in singles)
    batched = decoder(pair, varied_head, settings, schedule, temperature, eos).generate_batch(
        prompts, BUDGETS, SEEDS
    )
    assert [summary(g) for g in batched] == [summary(s) for s in singles]
    order = [2, 0, 3, 1]
    permuted = decoder(pair, varied_head, settings, schedule, temperature, eos).generate_batch(
        [prompts[i] for i in order], [BUDGETS[i] for i in order], [SEEDS[i] for i in order]
    )
    assert [summary(g) for g in permuted] == [summary(singles[i]) for i in order]


def test_stop_strings_cut_each_row_on_its_own(pair, tokenizer):
    config = DecodeConfig.from_dict({"method": "sd", "num_assistant_tokens": 4, "max_new_tokens": 30})
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    free = Decoder(*pair, config).generate_batch(prompts)
    stop = tokenizer.decode(free[0].token_ids[5:7])
    stopping = Decoder(*pair, config, stop_strings=[stop], decode_text=tokenizer.decode)
    singles = [stopping.generate(p) for p in prompts]
    batched = stopping.generate_batch(prompts)
    assert batched[0].finish_reason == "stop" and stop in tokenizer.decode(batched[0].token_ids)
    assert [summary(g) for g in batched] == [summary(s) for s in singles]


def test_batch_one_is_generate(pair, tokenizer):
    config = DecodeConfig.from_dict({"method": "sd", "temperature": 1.0, "max_new_tokens": 16})
    prompt = tokenizer("hello").input_ids
    one = Decoder(*pair, config).generate(prompt, seed=5)
    assert summary(Decoder(*pair, config).generate_batch([prompt], seeds=[5])[0]) == summary(one)
    assert one.stats.batch_size == 1


def test_bad_batch_arguments_are_named(pair, tokenizer):
    dec = Decoder(*pair, DecodeConfig.from_dict({"method": "sd"}))
    with pytest.raises(ValueError, match="at least one token"):
        dec.generate_batch([[5], []])
    with pytest.raises(ValueError, match="seeds has 1 entries for 2 prompts"):
        dec.generate_batch([[5], [6]], seeds=[1])
