"""k auto (``--num-assistant-tokens auto``, schedule cost): k per block from a cost profile, k = 0 a
plain target step, and the output still the target's.

Greedy: equal to ``auto`` token for token whatever the profile makes the blocks do (all plain with
probes, all drafting, or switching), batched rows equal to batch 1. Sampling: the first two tokens
of 20,000 seeded runs whose blocks switch between plain and drafting follow the target's exact
distribution (chi-square p > 1e-3, as tests/test_sampling_exactness.py, whose wrong rule the same
test rejects). Relaxed methods refuse it in one line; a fixed profile gives the same choices.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_sampling_exactness import (
    PASS_P,
    PROMPT,
    SAMPLES,
    chi_square_p,
    exact_two_token_distribution,
)

from diversed import DecodeConfig, Decoder
from diversed.backends.cost_profile import CostProfile, load_or_measure, measure
from diversed.config import ConfigError
from diversed.engine.schedules import PROBE_EVERY, CostChooser

PLAIN = ([1.0] + [100.0] * 8, 100.0)  # a draft step dearer than anything it could save: k = 0
DRAFT = ([1.0] * 9, 0.001)  # free drafts: the most k


class Fixed:
    """A profile whose costs are always ``costs``."""

    def __init__(self, costs):
        self.value = costs

    def costs(self, rows):
        return self.value


class Switching:
    """Plain and drafting blocks in turn: every block after a plain one feeds the draft its backlog."""

    def __init__(self):
        self.calls = 0

    def costs(self, rows):
        self.calls += 1
        return PLAIN if self.calls % 2 else DRAFT


def decoder(pair, profile, **values):
    config = DecodeConfig.from_dict({"method": "sd", "schedule": "cost", "num_assistant_tokens": 4, **values})
    return Decoder(pair[0], pair[1], config, profile=profile)


@pytest.mark.parametrize(
    "profile", [Fixed(PLAIN), Fixed(DRAFT), Switching()], ids=["plain", "draft", "switch"]
)
def test_greedy_k_auto_is_greedy_auto_at_batch_1_and_batched(pair, tokenizer, profile):
    prompts = [tokenizer(f"def f{i}(x):\n    return x + {i}").input_ids for i in range(4)]
    auto = Decoder(pair[0], None, DecodeConfig.from_dict({"method": "auto", "max_new_tokens": 40}))
    expected = [g.token_ids for g in auto.generate_batch(prompts)]
    ours = decoder(pair, profile, max_new_tokens=40)
    assert [ours.generate(p).token_ids for p in prompts] == expected
    batched = ours.generate_batch(prompts)
    assert [g.token_ids for g in batched] == expected
    if isinstance(profile, Switching):  # both kinds of block happened
        drafted, blocks = sum(g.stats.drafted for g in batched), sum(g.stats.blocks for g in batched)
        assert 0 < drafted < 4 * blocks


def test_all_plain_blocks_still_probe_the_draft(pair, tokenizer):
    prompt = tokenizer("def g(x):\n    return x").input_ids
    result = decoder(pair, Fixed(PLAIN), max_new_tokens=40).generate(prompt)
    # one probe block of one draft after every PROBE_EVERY - 1 plain blocks
    assert 0 < result.stats.drafted <= result.stats.blocks // (PROBE_EVERY - 1) + 1


def test_sampled_k_auto_follows_the_target_distribution(small_vocab_pair):
    ours = decoder(small_vocab_pair, Switching(), num_assistant_tokens=2, max_new_tokens=3, temperature=1.0)
    counts = np.zeros((8, 8))
    for first in range(0, SAMPLES, 4):
        for g in ours.generate_batch([PROMPT] * 4, seeds=range(first, first + 4)):
            counts[g.token_ids[0], g.token_ids[1]] += 1
    assert chi_square_p(counts, exact_two_token_distribution(*small_vocab_pair, weight=1.0)) > PASS_P


def test_the_choice_follows_acceptance_and_batch_size():
    profile = CostProfile({1: [1.0, 1.1, 1.2, 1.3, 1.4], 8: [1.0, 2.0, 3.0, 4.0, 5.0]}, {1: 0.2, 8: 0.5}, {})
    chooser = CostChooser(profile.costs, 4)
    chooser.kept, chooser.rejected = 90, 10  # alpha ~0.9: drafting pays at B = 1
    assert chooser.choose(1) == 4
    chooser.kept, chooser.rejected = 10, 90  # alpha ~0.1: a plain step is faster
    assert chooser.choose(1) == 0
    chooser.kept, chooser.rejected = 90, 10
    assert chooser.choose(8) == 0  # at B = 8 verifying k + 1 tokens costs k + 1 steps: no gain


def test_relaxed_methods_refuse_k_auto_in_one_line(capsys):
    with pytest.raises(ConfigError, match="method static: .* keeps a fixed k"):
        DecodeConfig.from_dict({"method": "static", "schedule": "cost"})
    from diversed.cli import main

    command = ["generate", "--method", "gate", "--num-assistant-tokens", "auto", "--prompt", "a"]
    with pytest.raises(SystemExit) as stopped:
        main([*command, "--target", "x", "--draft", "y"])
    assert stopped.value.code == 2
    assert "method gate: --num-assistant-tokens auto" in capsys.readouterr().err


def test_a_stored_profile_gives_the_same_choices(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path))
    names = {"target": "tiny", "draft": "tiny-draft"}
    first, path = load_or_measure(*pair, 3, names)
    assert path.is_file() and set(first.target) == {1, 2, 4, 8, 16} and len(first.target[1]) == 4
    again, _ = load_or_measure(*pair, 3, names)  # read back, not measured anew
    assert again.digest() == first.digest() == CostProfile.from_dict(json.loads(path.read_text())).digest()
    prompt = list(range(1, 9))
    runs = [
        decoder(pair, again, num_assistant_tokens=3, max_new_tokens=30, temperature=1.0).generate(
            prompt, seed=5
        )
        for _ in range(2)
    ]
    assert (
        runs[0].token_ids == runs[1].token_ids
        and runs[0].stats.to_dict()["accepted_histogram"] == runs[1].stats.to_dict()["accepted_histogram"]
    )
    assert all(t > 0 for t in measure(*pair, 1, batch_sizes=(2,)).target[2])
