"""The ensemble head: its start, files, use in decoding, trace collection and RL training."""

from __future__ import annotations

import json

import pytest
import torch

from diversed import DecodeConfig, Decoder
from diversed.cli import main
from diversed.data.tasks import CNNDM
from diversed.head import EnsembleHead, HeadError, load_head, save_head
from diversed.tiny import write_tiny_pair
from diversed.traces import Trajectory
from diversed.train import TrainConfig, train_head


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


def test_training_learns_where_the_draft_can_be_trusted():
    trajectories, hard = synthetic_traces(64)
    cfg = TrainConfig(epochs=40, batch_size=8, lr=5e-2, warmup_steps=5, reg_lambda=0.1, seed=0)
    head, figures = train_head(trajectories, cfg, progress=False)
    with torch.no_grad():
        w = torch.cat([head(t.tensors["h_draft"], t.tensors["h_target"]) for t in trajectories])
    assert w[~hard].mean() < 0.3  # trust the draft where it is right: more acceptance at no cost
    assert w[hard].mean() > 0.55  # lean on the target where the draft's tokens cost reward
    # (PPO clipping at 0.2 bounds how far one round of traces moves w from the behaviour's 0.5)
    start = 1 - 0.5 * (abs(EASY[0] - EASY[1]) + abs(HARD[0] - HARD[1])) / 2
    assert figures["expected_acceptance"] > start


def test_positive_lambda_raises_acceptance():
    trajectories, _ = synthetic_traces(32)
    accept = {}
    for lam in (0.01, 1.0):
        _, figures = train_head(trajectories, TrainConfig(epochs=10, lr=5e-2, reg_lambda=lam), progress=False)
        accept[lam] = figures["expected_acceptance"]
    assert accept[1.0] > accept[0.01]


@pytest.fixture(scope="module")
def cnndm_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    shot = {"id": CNNDM.SHOT_ID, "article": "Daniel Radcliffe turns 18.", "highlights": "Radcliffe is 18."}
    train = [shot] + [
        {"id": f"{i:040d}", "article": f"Story {i} here.", "highlights": f"Story {i}."} for i in range(6)
    ]
    (root / "cnndm").mkdir()
    (root / "cnndm" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    return root


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
    assert len(json.loads((traces / "manifest.json").read_text())["sequences"]) == 6
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


def test_negative_lambda_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train-head", "--traces", str(tmp_path), "--out", str(tmp_path / "h"), "--reg-lambda", "-1"])
    assert "reg_lambda" in capsys.readouterr().err


def test_trace_mode_stores_the_teacher_forced_values_batched_as_at_batch_one(pair, tokenizer):
    """Traces come from speculative sampling against mu; each stored field must equal a teacher-
    forced recomputation on the emitted tokens, and a batch must equal its batch-1 runs."""
    from diversed.engine.rules import total_variation

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
        mu = weight * p + (1 - weight) * q
        assert torch.allclose(got.trace["mu"], mu.gather(1, y)[:, 0], atol=1e-5)
        assert torch.allclose(got.trace["h_target"].float(), out_p.hidden_states[-1][0, span], atol=4e-3)
        assert torch.allclose(got.trace["h_draft"].float(), out_q.hidden_states[-1][0, span], atol=4e-3)
