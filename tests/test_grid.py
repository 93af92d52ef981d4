"""The workflow's method grid: sweeps, and entries that name their own temperature."""

from __future__ import annotations

from diversed.grid import cli_flags, expand


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
