"""Every decoding knob is declared once (a field of DecodeConfig) and reaches the JSON schema, the
CLI flags with their help and default, the validation of the CLI and of the workflow's grid, and
the conversion of plain values: a knob added in one place is seen everywhere."""

from __future__ import annotations

import argparse
from dataclasses import fields, make_dataclass

import pytest

from diversed.cli import build_parser
from diversed.config import ConfigError, DecodeConfig, add_knob_flags, decoding_schema, knob, schema_of
from diversed.pipeline.grid import cli_flags


def extended() -> type:
    """DecodeConfig with one knob more, declared as every knob is."""
    return make_dataclass(
        "Extended",
        [("draft_temperature", float, knob(0.7, "a new knob", minimum=0, maximum=2))],
        bases=(DecodeConfig,),
        frozen=True,
    )


def test_a_knob_declared_once_is_seen_everywhere():
    config_class = extended()
    spec = schema_of(config_class)["properties"]["draft_temperature"]
    assert spec == {"description": "a new knob", "default": 0.7, "type": "number", "minimum": 0, "maximum": 2}
    parser = argparse.ArgumentParser()
    add_knob_flags(parser, config_class)
    assert parser.parse_args(["--draft-temperature", "1.5"]).draft_temperature == 1.5
    assert parser.parse_args([]).draft_temperature is None  # unset: the declared default applies
    assert "a new knob (0.7)" in " ".join(parser.format_help().split())
    assert config_class.from_dict({}).draft_temperature == 0.7
    assert config_class.from_dict({"draft_temperature": 1}).draft_temperature == 1.0
    with pytest.raises(ConfigError, match="^draft_temperature: 3 is greater than the maximum of 2$"):
        config_class.from_dict({"draft_temperature": 3})


def test_schema_cli_and_grid_come_from_the_same_declarations():
    names = [item.name for item in fields(DecodeConfig)]
    assert list(decoding_schema()["properties"]) == names
    decode = build_parser()._subparsers._group_actions[0].choices["decode"]
    dests = {action.dest for action in decode._actions}
    assert set(names) <= dests
    help_text = " ".join(decode.format_help().split())
    assert "tokens to generate at most (128)" in help_text and "(constant)" in help_text
    flags = cli_flags({"schedule": "heuristic", "method": "sd", "max_new_tokens": 8})
    assert flags == "--method sd --max-new-tokens 8 --assistant-schedule heuristic"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"lenience": 0.0}, "lenience: 0.0 is less than or equal to the minimum of 0"),
        ({"top_p": 1.5}, "top_p: 1.5 is greater than the maximum of 1"),
        ({"schedule": "sometimes"}, "schedule: 'sometimes' is not one of"),
        ({"max_new_tokens": 0}, "max_new_tokens: 0 is less than the minimum of 1"),
    ],
)
def test_cli_and_workflow_refuse_the_same_values_with_the_same_words(values, message, capsys):
    from diversed.pipeline.grid import expand

    with pytest.raises(ConfigError, match=message):
        DecodeConfig.from_dict(values)
    with pytest.raises(ConfigError, match=message):
        expand([{"method": "sd", **values}], [4], [0.0], {})
    flag = "--" + next(iter(values)).replace("_", "-")
    flag = {"--schedule": "--assistant-schedule"}.get(flag, flag)
    argv = [
        "generate",
        "--target",
        "x",
        "--draft",
        "y",
        "--prompt",
        "p",
        flag,
        str(next(iter(values.values()))),
    ]
    from diversed.cli import main

    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err
