"""Where completions stop: the ``lm-eval`` protocol (GSM8K also at </s>, <|im_end|> and the base
model's <|endoftext|>, as lm-evaluation-harness stops it) against the paper's. A stopped completion
is the unstopped one cut at its stop, token for token, sampled or not: stopping changes where a
completion ends and nothing before it."""

from __future__ import annotations

import pytest

from diversed import DecodeConfig, Decoder
from diversed.data import DataError, get_task

PROMPTS = ["def f(x):\n    return", "a", "The quick brown fox jumps over"]


def test_gsm8k_stops_like_lm_eval_only_when_asked():
    gsm8k = get_task("gsm8k")
    assert gsm8k.stops("paper") == ("Question:",)
    assert gsm8k.stops("lm-eval") == ("Question:", "</s>", "<|im_end|>", "<|endoftext|>")
    assert get_task("mbpp").stops("lm-eval") == get_task("mbpp").stops("paper")
    with pytest.raises(DataError, match="stop: 'eos' is not one of paper, lm-eval"):
        gsm8k.stops("eos")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_stopped_completion_is_the_free_one_cut_at_its_stop(pair, tokenizer, temperature):
    config = DecodeConfig.from_dict(
        {"method": "sd", "num_assistant_tokens": 4, "max_new_tokens": 40, "temperature": temperature}
    )
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    free = Decoder(*pair, config).generate_batch(prompts, seeds=[1, 2, 3])
    stop = tokenizer.decode(free[0].token_ids[9:11])  # text the first row does write
    stopped = Decoder(*pair, config, stop_strings=["Question:", stop], decode_text=tokenizer.decode)
    cut = stopped.generate_batch(prompts, seeds=[1, 2, 3])
    assert cut[0].finish_reason == "stop" and len(cut[0].token_ids) < len(free[0].token_ids)
    for short, long in zip(cut, free, strict=True):
        assert short.token_ids == long.token_ids[: len(short.token_ids)]
        if short.finish_reason == "stop":
            assert stop in tokenizer.decode(short.token_ids)


def test_the_workflow_passes_the_protocol_to_every_model_job(tmp_path):
    import yaml
    from test_cluster_path import dry_run, jobs
    from test_workflow import copy_workflow

    workdir = copy_workflow(tmp_path)
    config = yaml.safe_load((workdir / ".test" / "config" / "config.yaml").read_text())
    config["data"]["stop"] = "lm-eval"
    (workdir / "config" / "lm-eval.yaml").write_text(yaml.safe_dump(config))
    found = jobs(dry_run(workdir, tmp_path, "--configfile", "config/lm-eval.yaml"))
    model = [j for j in found if j["rule"] in ("decode", "collect_traces", "check_head")]
    assert model and all("--stop lm-eval" in j["command"] for j in model)
