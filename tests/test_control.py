"""The positive control's pieces: the digit-swapped draft changes only the digit logits (and nothing
when off), the hand-made oracle weights digits 1 and the rest 0, and a DIVERSED record carries w,
TV and entropy per decoded token, equal at batch 1 and batched."""

from __future__ import annotations

import json

import pytest
import torch

from diversed import DecodeConfig, Decoder
from diversed.cli import main
from diversed.evaluation.weights import token_class, weight_statistics
from diversed.jobs.decode import DecodeJob
from diversed.loading.control import DigitOracle, apply_draft_transform, digit_ids, digit_swap_permutation
from diversed.loading.stack import load_stack
from diversed.loading.tiny import tiny_pair


def test_digit_swap_permutes_the_digit_logits_of_the_draft_and_nothing_else(tokenizer):
    _, draft = tiny_pair(vocab_size=len(tokenizer))
    ids = torch.tensor([tokenizer("The answer is 42 and 7").input_ids])
    before = draft(ids).logits
    apply_draft_transform(draft, "digit_swap", tokenizer)
    after = draft(ids).logits
    digits = digit_ids(tokenizer)
    others = [i for i in range(before.shape[-1]) if i not in digits]
    assert torch.equal(after[..., others], before[..., others])
    for a, b in zip(digits[0::2], digits[1::2], strict=True):  # 0<->1, 2<->3, ...
        assert torch.equal(after[..., a], before[..., b]) and torch.equal(after[..., b], before[..., a])
    order = digit_swap_permutation(before.shape[-1], digits)
    assert torch.equal(order[order], torch.arange(before.shape[-1]))  # an involution
    with pytest.raises(ValueError, match="unknown draft transform"):
        apply_draft_transform(draft, "shuffle", tokenizer)


def test_no_transform_unless_asked(model_dirs):
    target, draft = model_dirs
    plain = load_stack(str(target), str(draft), "float32")
    assert not plain.draft.get_output_embeddings()._forward_hooks
    swapped = load_stack(str(target), str(draft), "float32", draft_transform="digit_swap")
    assert len(swapped.draft.get_output_embeddings()._forward_hooks) == 1
    config = DecodeConfig.from_dict({"method": "sd"})
    assert "draft_transform" not in DecodeJob("gsm8k", "test", 2, "t", "d", config).settings()
    job = DecodeJob("gsm8k", "test", 2, "t", "d", config, draft_transform="digit_swap")
    assert job.settings()["draft_transform"] == "digit_swap"


def test_a_dataset_decode_damages_the_draft_its_settings_say(model_dirs, tmp_path):
    """The transform must reach the models a decode job runs, not only its records' settings: the
    first token's TV(p, q) is computed from the prompt alone, so the swapped digit logits change it."""
    target, draft = model_dirs
    first_tv = {}
    for name, extra in (("plain", []), ("swapped", ["--draft-transform", "digit_swap"])):
        out = tmp_path / f"{name}.jsonl"
        argv = [
            *("decode", "--dataset", "humaneval", "--n-examples", "1", "--method", "diversed", "--head"),
            *("oracle:digits", "--target", str(target), "--draft", str(draft), "--max-new-tokens", "2"),
            *("--temperature", "1", "--dtype", "float32", "--quiet", "--out", str(out), *extra),
        ]
        assert main(argv) == 0
        record = json.loads(out.read_text().splitlines()[0])
        assert record["settings"].get("draft_transform") == (extra[1] if extra else None)
        first_tv[name] = record["token_weights"]["stats"][0][1]
    assert first_tv["swapped"] != pytest.approx(first_tv["plain"], rel=1e-6, abs=1e-9)


def test_oracle_weights_a_position_one_exactly_when_the_targets_best_token_is_a_digit(pair, tokenizer):
    target, _ = pair
    oracle = DigitOracle(target, tokenizer)
    ids = torch.tensor([tokenizer("x = 12 + 30\nprint(x)").input_ids])
    hidden = target(ids, output_hidden_states=True).hidden_states[-1]
    w = oracle(hidden, hidden)
    best = target(ids).logits.argmax(-1)
    assert torch.equal(w.bool(), torch.isin(best, torch.tensor(digit_ids(tokenizer))))


def test_token_stats_are_per_decoded_token_and_batched_equals_batch_one(pair, tokenizer):
    target, draft = pair
    config = DecodeConfig.from_dict({"method": "diversed", "temperature": 1.0, "num_assistant_tokens": 4})
    decoder = Decoder(target, draft, config, head=DigitOracle(target, tokenizer))
    prompts = [tokenizer(p).input_ids for p in ("12 + 30 = ", "def f(x):\n    return", "a")]
    batched = decoder.generate_batch(prompts, 20, [1, 2, 3])
    for prompt, seed, together in zip(prompts, [1, 2, 3], batched, strict=True):
        alone = decoder.generate(prompt, 20, seed)
        assert together.token_ids == alone.token_ids
        assert len(together.token_stats) == len(together.token_ids)
        for a, b in zip(together.token_stats, alone.token_stats, strict=True):
            assert (a is None) == (b is None)
            assert a is None or torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    stats = [s for g in batched for s in g.token_stats if s is not None]
    assert stats and all(s[0] in (0.0, 1.0) and 0 <= s[1] <= 1 and s[2] >= 0 for s in stats)


def test_weight_statistics_of_a_diversed_decode(model_dirs, tmp_path):
    target, draft = model_dirs
    out = tmp_path / "he.jsonl"
    argv = [
        *("decode", "--dataset", "humaneval", "--n-examples", "3", "--method", "diversed", "--head"),
        *("oracle:digits", "--target", str(target), "--draft", str(draft), "--max-new-tokens", "16"),
        *("--temperature", "1", "--dtype", "float32", "--quiet", "--out", str(out)),
    ]
    assert main(argv) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for record in records:
        weights = record["token_weights"]
        assert len(weights["stats"]) == len(weights["class"]) == len(record["token_ids"])
    summary = weight_statistics(records)
    assert summary["tokens"] == sum(s is not None for r in records for s in r["token_weights"]["stats"])
    assert summary["w_below_0.1"] + summary["w_above_0.9"] == pytest.approx(1.0)  # the oracle's 0/1
    assert sum(c["n"] for c in summary["by_class"].values()) == summary["tokens"]
    assert sum(summary["histogram"]["counts"]) == summary["tokens"]
    score = tmp_path / "score.json"
    assert main(["score", "--dataset", "humaneval", "--in", str(out), "--out", str(score)]) == 0
    assert json.loads(score.read_text())["w_test"]["tokens"] == summary["tokens"]
    # the head's direct comparator: static at the mean w the head put on these tokens
    matched = tmp_path / "matched.jsonl"
    base = [
        *("decode", "--dataset", "humaneval", "--n-examples", "1", "--method", "static", "--target"),
        *(str(target), "--draft", str(draft), "--max-new-tokens", "4", "--dtype", "float32", "--quiet"),
    ]
    assert main([*base, "--target-weight-from", str(out), "--out", str(matched)]) == 0
    settings = json.loads(matched.read_text().splitlines()[0])["settings"]
    assert settings["method"] == "static" and settings["target_weight"] == round(summary["w_mean"], 4)
    with pytest.raises(SystemExit):  # a file without per-token weights is named, not read as w = 0.5
        main([*base, "--target-weight-from", str(matched), "--out", str(tmp_path / "x.jsonl")])


def test_token_classes():
    assert [token_class(t) for t in ("7", " 42", "    ", "\n", " def", "return", "x", " +")] == [
        "digit",
        "digit",
        "whitespace",
        "whitespace",
        "keyword",
        "keyword",
        "other",
        "other",
    ]
