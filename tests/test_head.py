"""The ensemble head: its start, files, use in decoding, trace collection and RL training."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch

from diversed import DecodeConfig, Decoder
from diversed.cli import main
from diversed.data import DataError
from diversed.data.tasks import CNNDM
from diversed.head import SIGNALS, EnsembleHead, HeadError, load_head, save_head
from diversed.jobs.traces import TraceJob, read_manifest
from diversed.loading.tiny import write_tiny_pair
from diversed.training.objective import TrainConfig, group_advantages, head_weights, resolve_baseline
from diversed.training.selection import (
    choose,
    constant_head,
    lower_bound,
    prompt_gains,
    split_by_prompt,
    validation_figures,
)
from diversed.training.traces import Trajectory
from diversed.training.trainer import select_head, train_head


@pytest.mark.parametrize("hidden", [0, 16])
def test_head_starts_at_exactly_one_half(hidden):
    head = EnsembleHead(12, 20, hidden=hidden)
    w = head(torch.randn(7, 12) * 5, torch.randn(7, 20) * 5)
    assert w.shape == (7,)
    assert torch.equal(w, torch.full((7,), 0.5))


def test_head_at_init_reproduces_static_half(pair, tokenizer):
    prompt = tokenizer("while x < 10:").input_ids
    common = {"temperature": 1.0, "num_assistant_tokens": 4, "max_new_tokens": 40, "seed": 5}
    static = Decoder(*pair, DecodeConfig.from_dict({**common, "method": "static", "target_weight": 0.5}))
    head = EnsembleHead(pair[1].config.hidden_size, pair[0].config.hidden_size)
    dynamic = Decoder(*pair, DecodeConfig.from_dict({**common, "method": "diversed"}), head=head)
    assert static.generate(prompt).token_ids == dynamic.generate(prompt).token_ids


def test_save_load_round_trip_and_size_check(tmp_path):
    head = EnsembleHead(12, 20, hidden=4, seed=3)
    save_head(head, tmp_path, {"task": "gsm8k"})
    loaded = load_head(tmp_path, 12, 20)
    x, y = torch.randn(3, 12), torch.randn(3, 20)
    assert torch.equal(loaded(x, y), head(x, y))
    assert json.loads((tmp_path / "head.json").read_text())["task"] == "gsm8k"
    with pytest.raises(
        HeadError, match="expects hidden sizes draft 12 \\+ target 20.*draft 64 \\+ target 64"
    ):
        load_head(tmp_path, 64, 64)
    with pytest.raises(HeadError, match="no ensemble head"):
        load_head(tmp_path / "missing")


EASY = (0.7, 0.99)  # (p(right), q(right)) where the draft is right: TV 0.29
HARD = (0.95, 0.05)  # where the draft is wrong: TV 0.9


def synthetic_traces(n: int, seed: int = 0) -> tuple[list[Trajectory], torch.Tensor]:
    """Sequences whose contexts alternate between two classes, readable from the hidden states.

    In "easy" contexts the draft is right and nothing it emits costs reward; in "hard" contexts it
    is wrong, and the reward is the share of right tokens emitted there (it punishes only the second
    class). Tokens are drawn from mu = 0.5 p + 0.5 q, as trace collection does. Returns the
    trajectories and, for every token in order, whether its context is hard.
    """
    g = torch.Generator().manual_seed(seed)
    length = 10
    hard = torch.arange(length) % 2 == 1
    trajectories = []
    for i in range(n):
        features = torch.randn(length, 6, generator=g) * 0.1
        features[:, 0] = torch.where(hard, -1.0, 1.0)
        p_right = torch.where(hard, HARD[0], EASY[0])
        q_right = torch.where(hard, HARD[1], EASY[1])
        right = torch.rand(length, generator=g) < 0.5 * p_right + 0.5 * q_right
        p_y = torch.where(right, p_right, 1 - p_right)
        q_y = torch.where(right, q_right, 1 - q_right)
        tensors = {
            "h_draft": features.half(),
            "h_target": (features * 2).half(),
            "p_y": p_y,
            "q_y": q_y,
            "tv": (p_right - q_right).abs(),
            "mu": 0.5 * p_y + 0.5 * q_y,
        }
        trajectories.append(Trajectory(f"s{i}", float(right[hard].float().mean()), tensors))
    return trajectories, hard.repeat(n)


def _weights_by_class(trajectories, hard, **settings):
    cfg = TrainConfig(epochs=40, batch_size=8, lr=5e-2, warmup_steps=5, seed=0, **settings)
    head, figures = train_head(trajectories, cfg, progress=False)
    w = head_weights(head, trajectories)
    return float(w[~hard].mean()), float(w[hard].mean()), figures


def test_training_learns_where_the_draft_can_be_trusted():
    trajectories, hard = synthetic_traces(64)
    easy_w, hard_w, figures = _weights_by_class(trajectories, hard, reg_lambda=1.0)
    assert easy_w < 0.1  # trust the draft where it is right: more acceptance at no cost
    assert hard_w > 0.35  # keep the target where the draft's tokens cost reward
    start = 1 - 0.5 * (abs(EASY[0] - EASY[1]) + abs(HARD[0] - HARD[1])) / 2
    assert figures["expected_acceptance"] > start


def _blind(trajectories: list[Trajectory], seed: int = 0) -> list[Trajectory]:
    """The same sequences with hidden states that say nothing about the context, and the
    verifier's signals stored beside them: only TV tells easy (0.29) from hard (0.9) tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in trajectories:
        n = t.tensors["tv"].shape[0]
        noise = torch.randn(n, 6, generator=g) * 0.1
        extra = {
            "h_draft": noise.half(),
            "h_target": (noise * 2).half(),
            "entropy_p": torch.rand(n, generator=g),
        }
        out.append(
            Trajectory(t.id, t.reward, {**t.tensors, **extra, "entropy_q": torch.rand(n, generator=g)})
        )
    return out


def test_a_head_with_the_verifiers_signals_learns_what_hidden_states_alone_cannot_show():
    trajectories, hard = synthetic_traces(64)
    blind = _blind(trajectories)
    easy_w, hard_w, _ = _weights_by_class(blind, hard, reg_lambda=1.0)
    assert abs(hard_w - easy_w) < 0.1  # the hidden states no longer tell the classes apart
    easy_w, hard_w, _ = _weights_by_class(blind, hard, reg_lambda=1.0, signals=True)
    assert easy_w < 0.1 and hard_w > 0.35  # TV does


def test_a_signals_head_round_trips_refuses_missing_signals_and_has_a_static_twin(tmp_path):
    trajectories, _ = synthetic_traces(4)
    head = EnsembleHead(6, 6, signals=True, seed=1)
    tokens = torch.cat([torch.stack([t.tensors[k] for k in SIGNALS], -1) for t in _blind(trajectories)])
    head.fit_signals(tokens)
    with torch.no_grad():
        head.out.weight[1, -3:] += 0.5  # a head whose w depends on the signals
    h, signals = torch.randn(5, 6), torch.rand(5, 3)
    assert head(h, h, signals).std() > 0
    save_head(head, tmp_path, {"task": "gsm8k"})
    loaded = load_head(tmp_path, 6, 6)
    assert torch.equal(loaded(h, h, signals), head(h, h, signals))
    with pytest.raises(HeadError, match="signals"):
        loaded(h, h)
    twin = constant_head(head, 0.3)
    assert torch.allclose(twin(h, h, signals), torch.full((5,), 0.3))
    with pytest.raises(DataError, match="entropy_p, entropy_q"):  # traces stored before the signals
        head_weights(head, trajectories)


@pytest.mark.parametrize("rewards", ["graded", "pass/fail"])
def test_new_objective_stays_non_degenerate_over_ten_times_lambda_where_the_old_collapses(rewards):
    """Across lambda in [1, 10] the relative, trust-region acceptance term keeps w low on easy
    contexts and well above it on hard ones; the old fixed-lambda loss drives every w to ~0
    ("always trust the draft") at the top of the same range, with graded and with sparse
    pass/fail rewards (where the baseline is r - 1)."""
    trajectories, hard = synthetic_traces(64)
    if rewards == "pass/fail":
        trajectories = [Trajectory(t.id, float(t.reward >= 0.8), t.tensors) for t in trajectories]
    for lam in (1.0, 3.0, 10.0):
        easy_w, hard_w, _ = _weights_by_class(trajectories, hard, reg_lambda=lam)
        assert easy_w < 0.15 and hard_w > 0.35 and hard_w - easy_w > 0.25, (lam, easy_w, hard_w)
    easy_w, hard_w, _ = _weights_by_class(
        trajectories, hard, reg_lambda=10.0, reg_scale="fixed", baseline="batch"
    )
    assert hard_w < 0.05 and easy_w < 0.05  # the old objective collapsed


def test_positive_lambda_raises_acceptance():
    trajectories, _ = synthetic_traces(32)
    accept = {}
    for lam in (0.01, 1.0):
        _, figures = train_head(trajectories, TrainConfig(epochs=10, lr=5e-2, reg_lambda=lam), progress=False)
        accept[lam] = figures["expected_acceptance"]
    assert accept[1.0] > accept[0.01]


def test_auto_baseline_is_r_minus_one_for_pass_fail_rewards_only():
    trajectories, _ = synthetic_traces(4)
    assert resolve_baseline("auto", trajectories) == "running"
    binary = [Trajectory(t.id, float(i % 2), t.tensors) for i, t in enumerate(trajectories)]
    assert resolve_baseline("auto", binary) == "minus_one"
    assert resolve_baseline("batch", binary) == "batch"


def test_selection_holds_out_whole_prompts_and_follows_its_rule():
    trajectories, _ = synthetic_traces(40)
    # two behaviours per prompt, as collect-traces writes them: ids "<example>@<behaviour>"
    trajectories = [
        Trajectory(f"p{i // 2}@w{i % 2}", t.reward, t.tensors) for i, t in enumerate(trajectories)
    ]
    train, validation = split_by_prompt(trajectories, 0.25, seed=1)
    prompts = lambda ts: {t.id.split("@")[0] for t in ts}  # noqa: E731
    assert len(prompts(validation)) == 5 and not prompts(train) & prompts(validation)
    cfg = TrainConfig(epochs=3, batch_size=8, lr=5e-2, warmup_steps=2, seed=1)
    logged = []
    head, record, _ = select_head(
        trajectories, cfg, [0.1, 1.0, 10.0], 0.25, 1.0, log_step=lambda s, f: logged.append(f)
    )
    candidates = record["candidates"]
    assert [(c["reg_lambda"], c["epoch"]) for c in candidates] == [(None, 0)] + [
        (lam, e) for lam in (0.1, 1.0, 10.0) for e in (1, 2, 3)
    ]
    assert candidates[0]["val_mean_weight"] == 0.5 and candidates[0]["val_reward_gain"] == 0.0
    assert candidates[0]["val_reward_vs_start"] == candidates[0]["val_reward_vs_start_low"] == 0.0
    # the trained checkpoint with the highest validation objective; the start is scored, never chosen
    assert record["chosen"] == max(candidates[1:], key=lambda c: c["val_reward_gain"] + c["val_acceptance"])
    assert record["chosen"]["val_objective"] == pytest.approx(
        record["chosen"]["val_reward_gain"] + record["chosen"]["val_acceptance"]
    )
    assert record["validation_sequences"] == 10
    start_gains = torch.zeros(len(prompts(validation)))
    assert validation_figures(head, validation, 0.0, start_gains, 0.95)["val_acceptance"] == pytest.approx(
        record["chosen"]["val_acceptance"]
    )
    assert any("val_acceptance" in f for f in logged) and any("mean_weight" in f for f in logged)


def test_selection_learns_where_validation_vouches_for_it():
    """Pass/fail rewards, 64 prompts (16 held out): the chosen checkpoint beats the start on the
    validation objective, and it trusts the draft more on easy contexts than on hard ones."""
    trajectories, hard = synthetic_traces(64)
    trajectories = [
        Trajectory(f"p{i}@w0.5", float(t.reward >= 0.8), t.tensors) for i, t in enumerate(trajectories)
    ]
    cfg = TrainConfig(epochs=10, batch_size=8, lr=5e-2, warmup_steps=5, seed=0)
    head, record, _ = select_head(trajectories, cfg, [0.03, 0.1, 0.3], 0.25, 1.0, progress=False)
    chosen, start = record["chosen"], record["candidates"][0]
    assert chosen["epoch"] > 0 and chosen["val_objective"] > start["val_objective"]
    w = head_weights(head, trajectories)
    assert float(w[hard].mean()) - float(w[~hard].mean()) > 0.1


def _collapsed(head: EnsembleHead) -> EnsembleHead:
    """``head`` with its target-weight logit lowered until w ~ 0.007 everywhere."""
    with torch.no_grad():
        head.out.bias.copy_(torch.tensor([2.5, -2.5]))
    return head


def test_the_rule_ranks_trained_checkpoints_by_their_objective_and_never_keeps_the_start():
    """The start (w = 0.5, static) is scored for reference only; among trained checkpoints the
    objective reward gain + value x acceptance decides, so what acceptance is worth changes it."""
    start = {"val_reward_gain": 0.0, "val_acceptance": 0.9, "val_weight_std": 0.0}
    careful = {"val_reward_gain": 0.30, "val_acceptance": 0.70, "val_weight_std": 0.2}
    greedy = {"val_reward_gain": -0.05, "val_acceptance": 0.95, "val_weight_std": 0.2}
    assert choose([dict(start), dict(careful), dict(greedy)], 1.0) == (1, True)  # 1.00 against 0.90
    assert choose([dict(start), dict(careful), dict(greedy)], 10.0) == (2, True)  # acceptance worth more
    assert choose([dict(start)], 1.0) == (0, False)  # nothing trained: the start is all there is


def test_a_checkpoint_with_a_constant_weight_is_kept_only_when_every_trained_one_is_constant():
    """A head at w ~ 0.006 on every token is static w = 0 in effect: a per-token checkpoint wins
    over it even with a lower objective; when all are constant, the objective alone decides."""
    start = {"val_reward_gain": 0.0, "val_acceptance": 0.91, "val_weight_std": 0.0}
    varying = {"val_reward_gain": 0.05, "val_acceptance": 0.97, "val_weight_std": 0.16}
    collapsed = {"val_reward_gain": 0.10, "val_acceptance": 1.00, "val_weight_std": 0.02}
    assert choose([dict(start), dict(varying), dict(collapsed)], 1.0, 0.05) == (1, True)
    assert choose([dict(start), dict(varying), dict(collapsed)], 1.0, 0.0) == (2, True)
    flat = {**varying, "val_weight_std": 0.01}
    assert choose([dict(start), dict(flat), dict(collapsed)], 1.0, 0.05) == (2, False)


def test_select_head_keeps_the_best_checkpoint_whose_weight_varies_enough():
    """End to end on synthetic traces (seeded, so every run trains the same checkpoints): raising
    the spread threshold past the best checkpoint's spread moves the choice to the best of the
    rest; past every spread (w in [0, 1] has std <= 0.5) the objective alone decides, and the
    record says every checkpoint is a static rule in effect."""
    trajectories, _ = synthetic_traces(32)
    trajectories = [
        Trajectory(f"p{i}@w0.5", float(t.reward >= 0.8), t.tensors) for i, t in enumerate(trajectories)
    ]
    cfg = TrainConfig(epochs=3, batch_size=8, lr=5e-2, warmup_steps=2, seed=0)

    def run(threshold: float) -> dict:
        return select_head(
            trajectories, cfg, [0.03, 30.0], 0.25, 1.0, progress=False, min_weight_std=threshold
        )[1]

    free = run(0.0)
    trained = free["candidates"][1:]
    assert free["candidates"][0]["val_weight_std"] == 0.0  # the start: w = 0.5 on every token
    best = max(trained, key=lambda c: c["val_objective"])
    assert free["chosen"] == best
    threshold = best["val_weight_std"] + 1e-3
    strict = run(threshold)
    eligible = [c for c in strict["candidates"][1:] if c["val_weight_std"] >= threshold]
    assert eligible, "the synthetic traces should leave a checkpoint above the best one's spread"
    assert strict["chosen"] == max(eligible, key=lambda c: c["val_objective"]) != best
    assert "varies" in strict["rule"]
    none = run(1.0)
    assert none["chosen"] == best and "static rule in effect" in none["rule"]


def test_lower_bound_of_identical_runs_is_exactly_zero_and_needs_two_prompts():
    assert lower_bound(torch.zeros(5), 0.95) == (0.0, 0.0)
    assert lower_bound(torch.tensor([0.3]), 0.95) == (pytest.approx(0.3), -float("inf"))
    mean, low = lower_bound(torch.tensor([0.1, 0.3]), 0.95)
    assert mean == pytest.approx(0.2) and low == pytest.approx(0.2 - 1.6449 * 0.1, abs=1e-4)


def test_without_validation_prompts_the_first_lambdas_last_epoch_is_taken():
    trajectories, _ = synthetic_traces(8)
    _, record, _ = select_head(
        trajectories, TrainConfig(epochs=2, batch_size=4), [0.3, 1.0], 0.0, progress=False
    )
    assert record["chosen"] == {"reg_lambda": 0.3, "epoch": 2} and len(record["candidates"]) == 5
    assert record["rule"].startswith("no validation prompts")


def test_a_train_set_without_reward_information_keeps_the_starting_head():
    """Every train sequence failed: with A = R - 1 the acceptance term alone would move the head
    (a lambda of 10 drives it towards w = 0), so nothing is trained and w stays 0.5."""
    trajectories, _ = synthetic_traces(16)
    failed = [Trajectory(f"p{i}@w0.5", 0.0, t.tensors) for i, t in enumerate(trajectories)]
    cfg = TrainConfig(epochs=3, batch_size=4, lr=5e-2, warmup_steps=1, seed=1)
    head, record, _ = select_head(failed, cfg, [10.0], 0.25, progress=False)
    assert [(c["reg_lambda"], c["epoch"]) for c in record["candidates"]] == [(None, 0)]
    assert "untrained" in record["rule"] and record["chosen"]["val_mean_weight"] == 0.5
    assert torch.equal(head_weights(head, failed), torch.full((160,), 0.5))
    trained, _ = train_head(failed, replace(cfg, reg_lambda=10.0, baseline="minus_one"), progress=False)
    assert float(head_weights(trained, failed).mean()) < 0.4  # what the rule prevents


def test_traces_from_a_retrained_head_are_stale(tmp_path):
    """Round r's traces resume only if round r - 1's head is the same *content*, not just the same
    folder: a retrained head made the workflow reuse traces sampled from the old one."""
    head_dir = tmp_path / "r1"
    save_head(EnsembleHead(4, 6, seed=0), head_dir, {})
    job = TraceJob(dataset="mbpp", head=str(head_dir))
    out = tmp_path / "traces"
    out.mkdir()
    manifest = read_manifest(out, job)
    manifest["sequences"].append({"id": "x@head", "file": "seq-00000", "reward": 0.0, "tokens": 1})
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "seq-00000.json").write_text("{}")
    assert read_manifest(out, job)["sequences"]  # same head: resume
    head = EnsembleHead(4, 6, seed=0)
    with torch.no_grad():
        head.out.bias[1] = 1.0
    save_head(head, head_dir, {})  # retrained into the same folder
    with pytest.raises(DataError, match="head_sha256"):
        read_manifest(out, job)
    assert read_manifest(out, job, replace_stale=True)["sequences"] == []
    assert not (out / "seq-00000.json").exists() and not (out / "manifest.json").exists()


def test_collect_traces_then_train_head_then_decode(tmp_path, cnndm_data, capsys):
    target, draft = write_tiny_pair(tmp_path / "models")
    traces = tmp_path / "traces"
    collect = [
        *("collect-traces", "--dataset", "cnndm", "--n-examples", "3", "--max-new-tokens", "8"),
        *("--target", str(target), "--draft", str(draft), "--behaviour-weights", "0.5", "1.0"),
        *("--out", str(traces), "--data-dir", str(cnndm_data), "--no-hub", "--quiet"),
    ]
    assert main(collect) == 0
    manifest = json.loads((traces / "manifest.json").read_text())
    assert len(manifest["sequences"]) == 6  # 3 prompts x 2 behaviour weights
    assert all(
        s["id"] != CNNDM.SHOT_ID + "@w0.5" for s in manifest["sequences"]
    )  # the shot is never a prompt
    # resume: forget the last sequence, as if killed before recording it; a rerun redoes only that one
    manifest["sequences"].pop()
    (traces / "manifest.json").write_text(json.dumps(manifest))
    assert main(collect) == 0
    manifest = json.loads((traces / "manifest.json").read_text())
    assert len(manifest["sequences"]) == 6
    # random tiny models earn equal (zero) ROUGE everywhere, which leaves nothing to train on
    for i, sequence in enumerate(manifest["sequences"]):
        sequence["reward"] = 0.1 * i
    (traces / "manifest.json").write_text(json.dumps(manifest))
    head_dir = tmp_path / "head"
    assert (
        main(["train-head", "--traces", str(traces), "--out", str(head_dir), "--epochs", "2", "--quiet"]) == 0
    )
    log = [json.loads(line) for line in (head_dir / "train_log.jsonl").read_text().splitlines()]
    assert {"loss", "reward", "mean_weight", "expected_acceptance"} <= set(log[0])
    card = json.loads((head_dir / "head.json").read_text())
    assert card["task"] == "cnndm" and card["training"]["reg_lambda"] > 0
    capsys.readouterr()
    generate = [
        *("generate", "--target", str(target), "--draft", str(draft), "--method", "diversed"),
        *("--head", str(head_dir), "--prompt", "Article: x", "--max-new-tokens", "10", "--json"),
    ]
    assert main(generate) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["blocks"] > 0
    signals_dir = tmp_path / "signals-head"
    train = ["train-head", "--traces", str(traces), "--out", str(signals_dir), "--epochs", "2", "--quiet"]
    assert main([*train, "--signals"]) == 0
    assert json.loads((signals_dir / "head.json").read_text())["signals"] == list(SIGNALS)
    capsys.readouterr()
    assert main([*generate[:-4], str(signals_dir), *generate[-3:]]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["blocks"] > 0


def test_negative_lambda_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train-head", "--traces", str(tmp_path), "--out", str(tmp_path / "h"), "--reg-lambda", "-1"])
    assert "reg_lambda" in capsys.readouterr().err


def test_trace_mode_stores_the_teacher_forced_values_batched_as_at_batch_one(pair, tokenizer):
    """Traces come from speculative sampling against mu; each stored field must equal a teacher-
    forced recomputation on the emitted tokens, and a batch must equal its batch-1 runs."""
    from diversed.engine.rules import logit_entropy, total_variation

    target, draft = pair
    prompts = [tokenizer(p).input_ids for p in ["def f(x):", "a", "The quick brown fox"]]
    seeds, eos, weight = [3, 4, 5], [tokenizer.convert_tokens_to_ids("!")], 0.4
    config = DecodeConfig.from_dict(
        {"method": "static", "target_weight": weight, "temperature": 1.0, "num_assistant_tokens": 3}
    )
    decoder = Decoder(target, draft, config, eos_token_ids=eos, traces=True)
    batched = decoder.generate_batch(prompts, 20, seeds)
    assert any(g.finish_reason == "eos" for g in batched)  # a row ended early and left the batch
    for prompt, seed, got in zip(prompts, seeds, batched, strict=True):
        single = Decoder(target, draft, config, eos_token_ids=eos, traces=True).generate(prompt, 20, seed)
        assert single.token_ids == got.token_ids
        for name, value in got.trace.items():  # hidden states are stored in fp16: one rounding step
            tolerance = 4e-3 if value.dtype == torch.float16 else 1e-5
            assert torch.allclose(value.float(), single.trace[name].float(), atol=tolerance), name
        ids = torch.tensor([prompt + got.token_ids])
        with torch.no_grad():
            out_p = target(ids, output_hidden_states=True)
            out_q = draft(ids, output_hidden_states=True)
        span = slice(len(prompt) - 1, -1)  # the positions that predicted each emitted token
        p, q = out_p.logits[0, span].softmax(-1), out_q.logits[0, span].softmax(-1)
        y = torch.tensor(got.token_ids).unsqueeze(1)
        assert len(got.trace["p_y"]) == len(got.token_ids)
        assert torch.allclose(got.trace["p_y"], p.gather(1, y)[:, 0], atol=1e-5)
        assert torch.allclose(got.trace["q_y"], q.gather(1, y)[:, 0], atol=1e-5)
        assert torch.allclose(got.trace["tv"], total_variation(p, q), atol=1e-5)
        assert torch.allclose(got.trace["entropy_p"], logit_entropy(out_p.logits[0, span]), atol=1e-4)
        assert torch.allclose(got.trace["entropy_q"], logit_entropy(out_q.logits[0, span]), atol=1e-4)
        mu = weight * p + (1 - weight) * q
        assert torch.allclose(got.trace["mu"], mu.gather(1, y)[:, 0], atol=1e-5)
        assert torch.allclose(got.trace["h_target"].float(), out_p.hidden_states[-1][0, span], atol=4e-3)
        assert torch.allclose(got.trace["h_draft"].float(), out_q.hidden_states[-1][0, span], atol=4e-3)


def grouped_pass_fail(n_prompts: int, group: int, seed: int) -> tuple[list[Trajectory], torch.Tensor]:
    """The synthetic easy/hard problem with sparse pass/fail rewards (about 8% pass: the hard tokens
    mostly right, and a coin), in groups of ``group`` rollouts per prompt as collect-traces writes
    them with --rollouts: ids ``p<prompt>@w0.5#<g>``."""
    trajectories, hard = synthetic_traces(n_prompts * group, seed)
    coin = random.Random(seed)
    rewards = [float(t.reward >= 0.8 and coin.random() < 0.5) for t in trajectories]
    named = [
        Trajectory(f"p{i // group}@w0.5#{i % group}", rewards[i], t.tensors)
        for i, t in enumerate(trajectories)
    ]
    return named, hard


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_advantages_learn_from_sparse_pass_fail_rewards_where_r_minus_one_does_not(seed):
    trajectories, hard = grouped_pass_fail(16, 8, seed)
    assert 0.05 < sum(t.reward for t in trajectories) / len(trajectories) < 0.12
    assert resolve_baseline("auto", trajectories) == "group"
    group_easy, group_hard, _ = _weights_by_class(trajectories, hard, reg_lambda=0.3, baseline="group")
    easy, hard_w, _ = _weights_by_class(trajectories, hard, reg_lambda=0.3, baseline="minus_one")
    assert group_hard > 0.55 and group_hard - group_easy > 0.15  # keeps the target where it matters
    assert abs(hard_w - easy) < 0.05  # r - 1 learns nothing that tells the contexts apart


def test_group_advantage_is_reward_minus_the_other_rollouts_mean():
    tensors = synthetic_traces(1)[0][0].tensors
    rewards = {"a@w1#0": 1.0, "a@w1#1": 0.0, "a@w1#2": 0.0, "b@w1#0": 1.0, "b@w1#1": 1.0, "c@w1": 0.0}
    trajectories = [Trajectory(i, r, tensors) for i, r in rewards.items()]
    advantages = group_advantages(trajectories)
    assert advantages == {
        "a@w1#0": 1.0,
        "a@w1#1": -0.5,
        "a@w1#2": -0.5,
        "b@w1#0": 0.0,
        "b@w1#1": 0.0,
        "c@w1": 0.0,
    }
    assert resolve_baseline("auto", trajectories) == "minus_one"  # "c" has no group mate


def test_partial_credit_is_the_share_of_asserts_passed_and_pass_fail_stays_the_default():
    from diversed.data import Example
    from diversed.evaluation.metrics import task_reward

    record = {
        "task_id": 1,
        "text": "Add two numbers.",
        "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 0) == 1"],
        "test_setup_code": "",
    }
    example = Example("1", "mbpp", "", "\n".join(record["test_list"]), record)
    prediction = "def add(a, b):\n    return a + b"
    assert task_reward("mbpp", prediction, example) == 0.0  # one assert fails: the program fails
    assert task_reward("mbpp", prediction, example, partial_credit=True) == pytest.approx(2 / 3)
    cheat = "import sys\ndef add(a, b):\n    print('3/3 passed')\n    return a + b"
    assert task_reward("mbpp", cheat, example, partial_credit=True) == pytest.approx(2 / 3)  # output unread
    gsm = Example("2", "gsm8k", "", "4", {"question": "2 + 2?", "answer": "#### 4"})
    assert task_reward("gsm8k", "4", gsm, partial_credit=True) == 1.0  # not a code task: unchanged


def test_each_checkpoint_is_scored_against_the_static_head_at_its_own_mean_w():
    """The per-token question on validation: a head that keeps the target where the draft is wrong
    (w ~ 1) and leans on the draft elsewhere (w 0.4) beats the constant head at its own mean w (0.7,
    not the start's 0.5) in estimated reward, at lower acceptance (its weight sits where TV is
    high); the reverse head loses; the start is its own comparator, exactly."""
    trajectories, hard = synthetic_traces(64)
    start = EnsembleHead(6, 6)
    base = prompt_gains(start, trajectories, 0.5)

    def placed(sign: float) -> EnsembleHead:  # w ~ 1 on hard contexts, 0.4 on easy ones (sign -1: swapped)
        head = EnsembleHead(6, 6)
        with torch.no_grad():
            head.out.weight.zero_()
            head.out.weight[1, 0] = -20.0 * sign  # feature 0 of h_draft: +1 easy, -1 hard
            head.out.bias[1] = 19.6  # logit(0.4) = -0.405 = 19.6 - 20
        return head

    at_start, aligned, reverse = (
        validation_figures(h, trajectories, 0.5, base, 0.95) for h in (start, placed(1), placed(-1))
    )
    assert at_start["val_reward_vs_static"] == at_start["val_reward_vs_static_low"] == 0.0
    assert at_start["val_acceptance_vs_static"] == 0.0
    assert aligned["val_mean_weight"] == pytest.approx(0.7, abs=0.01)
    assert aligned["val_reward_vs_static"] != pytest.approx(aligned["val_reward_vs_start"])
    assert aligned["val_reward_vs_static_low"] > 0 and aligned["val_acceptance_vs_static"] < -0.05
    assert reverse["val_reward_vs_static"] < 0 and reverse["val_acceptance_vs_static"] > 0.05
