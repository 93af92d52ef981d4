"""Lossless methods under greedy decoding must reproduce greedy target decoding token for token."""

from __future__ import annotations

import pytest
import torch

from diversed import DecodeConfig, Decoder

LOSSLESS = [
    {"method": "sd"},
    {"method": "lossy", "lenience": 1.0},
    {"method": "static", "target_weight": 1.0},
    {"method": "static", "target_weight": 1.0, "ensemble_space": "logits"},
    {"method": "cascade", "cascade_rule": "chow", "cascade_alpha": -0.1},  # max q < 1.1: always defers
    {"method": "cascade", "cascade_rule": "diff", "cascade_alpha": -1.0},  # max q < max p + 1: always
]
SCHEDULES = ["constant", "heuristic", "heuristic_transient", "dynamic"]


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("settings", LOSSLESS, ids=lambda s: "-".join(str(v) for v in s.values()))
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_lossless_methods_match_greedy_target(pair, tokenizer, settings, schedule):
    target, draft = pair
    auto = Decoder(target, None, DecodeConfig.from_dict({"method": "auto", "max_new_tokens": 48}))
    for seed, draft_len in [(0, 1), (1, 3), (2, 5), (3, 8)]:
        prompt = tokenizer(f"def f{seed}(x):\n    return x * {seed}").input_ids
        cfg = DecodeConfig.from_dict(
            {
                **settings,
                "schedule": schedule,
                "num_assistant_tokens": draft_len,
                "max_new_tokens": 48,
                "seed": seed,
            }
        )
        decoder = Decoder(target, draft, cfg)
        ours = decoder.generate(prompt)
        expected = hf_greedy(target, prompt, 48)
        assert ours.token_ids == expected
        assert auto.generate(prompt).token_ids == expected
        assert len(ours.token_ids) == 48
        assert ours.stats.accepted + ours.stats.blocks >= 48  # every block emits accepted + 1
        assert ours.stats.target_forwards == ours.stats.blocks < 48  # fewer target forwards than tokens


def test_heuristic_schedule_persists_across_calls_and_transient_resets(pair, tokenizer):
    target, draft = pair
    prompt = tokenizer("abcabcabc").input_ids
    lengths = {}
    for schedule in ("heuristic", "heuristic_transient"):
        cfg = DecodeConfig.from_dict(
            {"method": "sd", "schedule": schedule, "num_assistant_tokens": 4, "max_new_tokens": 30}
        )
        decoder = Decoder(target, draft, cfg)
        decoder.generate(prompt)
        after_first = decoder.schedule.num_tokens
        decoder.schedule.begin()
        lengths[schedule] = (after_first, decoder.schedule.num_tokens)
    assert lengths["heuristic"][0] != 4  # it adapted during the call
    assert lengths["heuristic"][1] == lengths["heuristic"][0]  # and keeps that length for the next call
    assert lengths["heuristic_transient"][1] == 4  # the transient one starts over


def test_eos_and_stop_strings_end_generation(pair, tokenizer):
    target, draft = pair
    prompt = tokenizer("hello").input_ids
    cfg = DecodeConfig.from_dict({"method": "sd", "max_new_tokens": 40})
    full = Decoder(target, draft, cfg).generate(prompt).token_ids
    eos = full[10]
    cut = Decoder(target, draft, cfg, eos_token_ids=[eos]).generate(prompt)
    assert cut.finish_reason == "eos"
    assert cut.token_ids == full[: full.index(eos) + 1]
    stop = tokenizer.decode(full[12:14])
    stopped = Decoder(target, draft, cfg, stop_strings=[stop], decode_text=tokenizer.decode).generate(prompt)
    assert stopped.finish_reason == "stop"
    assert stop in tokenizer.decode(stopped.token_ids)
    assert stop not in tokenizer.decode(stopped.token_ids[:-1])


@pytest.mark.parametrize("budget", [1, 2, 3, 7])
def test_never_exceeds_max_new_tokens(pair, tokenizer, budget):
    target, draft = pair
    cfg = DecodeConfig.from_dict(
        {"method": "static", "target_weight": 0.0, "num_assistant_tokens": 5, "temperature": 1.0}
    )
    out = Decoder(target, draft, cfg).generate(tokenizer("x").input_ids, max_new_tokens=budget)
    assert len(out.token_ids) == budget
