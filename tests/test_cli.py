"""The command line: JSON output, the original project's flag spellings, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from diversed.cli import main
from diversed.loading.tiny import tiny_model, tiny_tokenizer


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def generate_json(capsys, model_dirs, *extra: str) -> dict:
    target, draft = model_dirs
    code, out, err = run(
        capsys,
        "generate",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--prompt",
        "def f(x):",
        "--json",
        *extra,
    )
    assert code == 0, err
    return json.loads(out)


def test_generate_json_has_text_ids_and_stats(capsys, model_dirs):
    result = generate_json(capsys, model_dirs, "--method", "sd", "--max-new-tokens", "24")
    assert set(result) == {"text", "token_ids", "stats"}
    for key in ("drafted", "accepted", "blocks", "target_forwards", "draft_forwards", "acceptance_rate"):
        assert key in result["stats"]
    for key in ("mean_accepted_length", "seconds", "tokens_per_second"):
        assert key in result["stats"]
    assert len(result["token_ids"]) <= 24
    auto = generate_json(capsys, model_dirs, "--method", "auto", "--max-new-tokens", "24")
    assert result["token_ids"] == auto["token_ids"]
    assert auto["stats"]["drafted"] == 0


def test_original_spellings_are_aliases(capsys, model_dirs):
    auto = generate_json(capsys, model_dirs, "--method", "auto", "--max_tokens", "20")
    static = generate_json(
        capsys,
        model_dirs,
        *("--method", "sd_static", "--draft_ensemble_weights", "0.0", "--num_assistant_tokens", "3"),
        *("--max_tokens", "20", "--assistant_schedule", "heuristic", "--assistant_confidence_threshold", "0"),
    )
    assert static["token_ids"] == auto["token_ids"]  # draft weight 0 = target weight 1 = lossless
    assert static["stats"]["drafted"] > 0
    for alias in ("sd_lossy", "static_en", "spe_cas"):
        assert (
            generate_json(capsys, model_dirs, "--method", alias, "--max_tokens", "8")["stats"]["blocks"] > 0
        )


def test_do_sample_is_a_boolean_flag(capsys, model_dirs):
    greedy = generate_json(capsys, model_dirs, "--max-new-tokens", "30")
    sampled = [
        generate_json(capsys, model_dirs, "--do_sample", "--seed", str(s), "--max-new-tokens", "30")
        for s in (1, 2)
    ]
    assert (
        greedy["token_ids"] != sampled[0]["token_ids"] or sampled[0]["token_ids"] != sampled[1]["token_ids"]
    )


def test_plain_output_prints_text_and_stats(capsys, model_dirs):
    target, draft = model_dirs
    code, out, err = run(
        capsys, "generate", "--target", str(target), "--draft", str(draft), "--prompt", "x = "
    )
    assert code == 0
    assert "tok/s" in err and "acceptance" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--method", "medusa"), "unknown method 'medusa'; choose one of: auto, sd, lossy"),
        (("--method", "static", "--target-weight", "1.5"), "target_weight"),
        (("--method", "static", "--draft_ensemble_weights", "-0.2"), "draft_ensemble_weights"),
        (("--method", "lossy", "--lenience", "0"), "lenience"),
        (("--temperature", "-1"), "temperature"),
        (("--assistant-schedule", "fastest"), "schedule"),
    ],
)
def test_bad_values_get_one_line_errors(capsys, model_dirs, flags, message):
    target, draft = model_dirs
    code, _, err = run(
        capsys, "generate", "--target", str(target), "--draft", str(draft), "--prompt", "a", *flags
    )
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_missing_path_is_named(capsys, model_dirs, tmp_path):
    missing = tmp_path / "no-such-model"
    code, _, err = run(
        capsys, "generate", "--target", str(missing), "--draft", str(model_dirs[1]), "--prompt", "a"
    )
    assert code == 2
    assert f"model path '{missing}' does not exist" in err


def test_vocabulary_mismatch_names_both_sizes(capsys, model_dirs, tmp_path):
    other = tmp_path / "other-vocab"
    tiny_model(vocab_size=120).save_pretrained(other)
    tiny_tokenizer().save_pretrained(other)
    code, _, err = run(
        capsys, "generate", "--target", str(model_dirs[0]), "--draft", str(other), "--prompt", "a"
    )
    assert code == 2
    assert "vocabularies differ" in err and "100 tokens" in err and "has 120" in err


@pytest.mark.parametrize("command", [[], ["generate"], ["bench"]])
def test_every_command_has_help(command):
    done = subprocess.run(
        [sys.executable, "-m", "diversed.cli", *command, "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    assert "usage: diversed" in done.stdout


def test_several_prompts_give_one_json_line_each_equal_to_their_single_runs(capsys, model_dirs):
    target, draft = model_dirs
    prompts = ["def f(x):", "a", "import os\n"]
    common = ["generate", "--target", str(target), "--draft", str(draft), "--method", "static"]
    common += ["--temperature", "1", "--seed", "7", "--max-new-tokens", "16", "--json"]
    code, out, err = run(capsys, *common, *(arg for p in prompts for arg in ("--prompt", p)))
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 3 and all(set(r) == {"text", "token_ids", "stats"} for r in rows)
    for prompt, row in zip(prompts, rows, strict=True):
        code, single, err = run(capsys, *common, "--prompt", prompt)
        assert code == 0, err
        assert json.loads(single)["token_ids"] == row["token_ids"]
        assert row["stats"]["batch_size"] == 3


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "expected"),
    [(False, False, "float32"), (False, True, "bfloat16"), (True, False, "bfloat16")],
)
def test_dtype_auto_picks_bf16_only_where_the_cpu_has_it(monkeypatch, amx, avx512_bf16, expected):
    import torch

    from diversed.devices import choose_dtype

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    dtype, why = choose_dtype("auto", "cpu")
    assert dtype == expected and why
    assert choose_dtype("float16", "cpu")[0] == "float16"


def test_unknown_dtype_is_one_line_with_the_choices(capsys, model_dirs):
    target, draft = model_dirs
    code, _, err = run(capsys, "generate", "--target", str(target), "--prompt", "x", "--dtype", "nonsense")
    assert code == 2
    assert "invalid choice: 'nonsense'" in err and "bfloat16" in err and "Traceback" not in err
