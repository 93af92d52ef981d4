"""The workflow's method grid: sweeps, and entries that name their own temperature."""

from __future__ import annotations

import pytest

from diversed.config import ConfigError
from diversed.pipeline.grid import cli_flags, expand


def test_an_entry_with_its_own_temperature_replaces_the_global_ones():
    grid = [
        {"method": "auto", "temperature": [0.0, 1.0]},
        {"method": "static", "target_weight": [0.0, 0.5]},
        {"method": "sd", "temperature": 0.0},
    ]
    settings = expand(grid, draft_lengths=[4], temperatures=[1.0], common={"max_new_tokens": 8})
    assert sorted(settings) == [
        "auto-T0",
        "auto-T1",
        "sd-k4-T0",
        "static-w0-k4-T1",
        "static-w0.5-k4-T1",
    ]
    assert settings["sd-k4-T0"]["temperature"] == 0.0


def test_an_entry_may_name_its_own_example_count_outside_the_setting():
    grid = [{"method": "sd", "temperature": 0.0, "n_examples": 50}, {"method": "auto"}]
    settings = expand(grid, draft_lengths=[4], temperatures=[1.0], common={"max_new_tokens": 8})
    assert sorted(settings) == ["auto-T1", "sd-k4-T0"]
    assert settings["sd-k4-T0"]["n_examples"] == 50
    assert "n_examples" not in settings["auto-T1"]
    assert "--n-examples" not in cli_flags(settings["sd-k4-T0"])
    assert cli_flags(settings["sd-k4-T0"]) == "--method sd --num-assistant-tokens 4 --temperature 0.0"


def test_a_static_entry_matched_to_the_head_is_named_and_only_static_can_be():
    grid = [{"method": "diversed"}, {"method": "static", "matched_to": "diversed"}]
    settings = expand(grid, draft_lengths=[4], temperatures=[1.0], common={"max_new_tokens": 8})
    assert sorted(settings) == ["diversed-k4-T1", "static-matched-diversed-k4-T1"]
    assert "matched" not in cli_flags(settings["static-matched-diversed-k4-T1"])  # a workflow key
    with pytest.raises(ConfigError, match=r"decode.grid\[0\].*matched_to"):
        expand([{"method": "sd", "matched_to": "diversed"}], [4], [1.0], {"max_new_tokens": 8})


def test_several_head_seeds_make_one_setting_per_seed_for_what_uses_the_trained_head():
    grid = [
        {"method": "diversed"},
        {"method": "diversed", "head": "oracle:digits"},
        {"method": "static", "matched_to": "diversed"},
        {"method": "sd"},
    ]
    settings = expand(grid, [4], [1.0], {"max_new_tokens": 8}, head_seeds=[1, 2])
    assert sorted(settings) == [
        "diversed-oracle:digits-k4-T1".replace(":", "-"),
        "diversed-s1-k4-T1",
        "diversed-s2-k4-T1",
        "sd-k4-T1",
        "static-s1-matched-diversed-k4-T1",
        "static-s2-matched-diversed-k4-T1",
    ]
    assert settings["diversed-s2-k4-T1"]["head_seed"] == 2
    assert "head_seed" not in cli_flags(settings["diversed-s2-k4-T1"])
    assert (
        expand(grid, [4], [1.0], {"max_new_tokens": 8}, head_seeds=[1]).keys()
        == expand(grid, [4], [1.0], {"max_new_tokens": 8}).keys()
    )  # one seed: the names of before


def test_a_diversed_entry_may_decode_a_head_folder_of_its_own_named_by_its_label():
    """Studies decode committed heads through the workflow: the folder is the head, the label names
    the cell (a path has no place in a file name), and a folder without a label is refused."""
    entry = {"method": "diversed", "head": "docs/results/natural/heads/gsm8k/s1", "label": "committed-s1"}
    settings = expand([entry], [4], [1.0], {})
    assert list(settings) == ["diversed-committed-s1-k4-T1"]
    assert settings["diversed-committed-s1-k4-T1"]["head"] == entry["head"]
    assert "--head" not in cli_flags(settings["diversed-committed-s1-k4-T1"])  # the rule passes it
    with pytest.raises(ConfigError, match="needs a label"):
        expand([{"method": "diversed", "head": "heads/x"}], [4], [1.0], {})
    assert list(expand([{"method": "diversed", "head": "oracle:digits"}], [4], [1.0], {})) == [
        "diversed-oracle-digits-k4-T1"
    ]
