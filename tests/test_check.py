"""The on-policy check of a trained head: the verdict against the static rule at its own mean w,
its rollouts (same seeds in both arms, only prompts no trace holds), its resumption."""

from __future__ import annotations

import json

import pytest
import torch

from diversed.cli import main
from diversed.evaluation.frontier import POWER_FACTOR
from diversed.head import EnsembleHead, load_head, save_head
from diversed.jobs.check import CheckJob, check_head, trained_prompts, verdict
from diversed.loading.tiny import write_tiny_pair


def _rows(arm: str, rewards: list[float], accepted: int, prompts: int = 8) -> list[dict]:
    """Two rollouts per prompt; rollout g of prompt i earns rewards[(i + g) % len(rewards)]."""
    return [
        {
            "example_id": f"p{i}",
            "arm": arm,
            "reward": rewards[(i + g) % len(rewards)],
            "accepted": accepted,
            "drafted": 8,
        }
        for i in range(prompts)
        for g in range(2)
    ]


def test_a_head_that_earns_more_than_static_at_its_own_w_is_above_it():
    found = verdict(_rows("head", [1.0, 1.0, 0.0], 5) + _rows("static", [0.0, 0.0, 1.0], 6), 0.95)
    reward = found["reward"]
    assert reward["change"] == pytest.approx(
        found["arms"]["head"]["reward"] - found["arms"]["static"]["reward"]
    )
    assert reward["ci"][0] > 0 and "above it" in found["verdict"]
    assert found["acceptance"]["change"] == pytest.approx(-1 / 8)
    assert found["prompts"] == 8  # the unit is the prompt: 8 paired differences
    error = (reward["ci"][1] - reward["ci"][0]) / (2 * 1.959964)
    assert reward["effect_80"] == pytest.approx(POWER_FACTOR * error)


def test_equal_arms_are_not_distinguishable_and_a_worse_head_is_below():
    same = verdict(_rows("head", [1.0, 0.0], 6) + _rows("static", [1.0, 0.0], 6), 0.95)
    assert same["reward"]["change"] == 0 and same["reward"]["ci"] == [0.0, 0.0]
    assert "rolled out alike" in same["verdict"]  # a zero-width interval is no power statement
    assert same["reward"]["effect_80"] is None
    faster = verdict(_rows("head", [1.0, 0.0], 7) + _rows("static", [1.0, 0.0], 6), 0.95)
    assert faster["reward"]["effect_80"] is None and faster["acceptance"]["change"] == pytest.approx(1 / 8)
    assert "same reward as static" in faster["verdict"] and "acceptance +0.125" in faster["verdict"]
    close = verdict(_rows("head", [1.0, 0.0], 6) + _rows("static", [1.0, 1.0, 0.0, 0.0], 6), 0.95)
    assert "not distinguishable" in close["verdict"]
    worse = verdict(_rows("head", [0.0, 0.0, 1.0], 6) + _rows("static", [1.0, 1.0, 0.0], 6), 0.95)
    assert worse["reward"]["ci"][1] < 0 and "below it" in worse["verdict"]


def _head(target_logit: float, d_draft: int, d_target: int) -> EnsembleHead:
    """A head with w = sigmoid(target_logit) on every token."""
    head = EnsembleHead(d_draft, d_target)
    with torch.no_grad():
        head.out.weight.zero_()
        head.out.bias.copy_(torch.tensor([0.0, target_logit]))
    return head


@pytest.fixture(scope="module")
def traced(tmp_path_factory, cnndm_data):
    """A tiny pair, a trace folder over 2 CNN/DM train prompts and the models' hidden sizes."""
    root = tmp_path_factory.mktemp("check")
    target, draft = write_tiny_pair(root / "models")
    traces = root / "traces"
    collect = [
        *("collect-traces", "--dataset", "cnndm", "--n-examples", "2", "--max-new-tokens", "6"),
        *("--target", str(target), "--draft", str(draft), "--behaviour-weights", "0.5"),
        *("--out", str(traces), "--data-dir", str(cnndm_data), "--no-hub", "--quiet"),
    ]
    assert main(collect) == 0
    sizes = (
        json.loads((target / "config.json").read_text())["hidden_size"],
        json.loads((draft / "config.json").read_text())["hidden_size"],
    )
    return root, target, draft, traces, sizes


def _check(traced, cnndm_data, tmp_path, head: EnsembleHead | float):
    root, target, draft, traces, (d_target, d_draft) = traced
    if isinstance(head, float):
        head = _head(head, d_draft, d_target)
    candidate = save_head(head, tmp_path / "candidate", {"task": "cnndm"})
    job = CheckJob("cnndm", str(target), str(draft), n_examples=3, rollouts=2, max_new_tokens=8)
    record = check_head(candidate, tmp_path / "kept", [traces], job, data_dir=cnndm_data, allow_hub=False)
    return record, job


def test_a_constant_head_is_its_own_static_comparator_on_unseen_prompts(traced, cnndm_data, tmp_path):
    """The static arm is the constant head at the head's own on-policy mean w, rolled out with the
    same seeds: for a head that already is constant the two arms are the same rollouts."""
    record, _ = _check(traced, cnndm_data, tmp_path, -2.0)  # w = 0.119 on every token
    assert record["static_w"] == pytest.approx(torch.sigmoid(torch.tensor(-2.0)).item(), rel=1e-5)
    assert record["prompts"] == 3 and record["rollouts"] == 12  # 3 prompts x 2 rollouts x 2 arms
    assert record["reward"]["change"] == 0 and record["acceptance"]["change"] == pytest.approx(0, abs=1e-12)
    rows = [json.loads(line) for line in (tmp_path / "kept.check.jsonl").read_text().splitlines()]
    assert not {r["example_id"] for r in rows} & trained_prompts([traced[3]])
    by_arm = {
        arm: [(r["example_id"], r["tokens"], r["accepted"]) for r in rows if r["arm"] == arm]
        for arm in ("head", "static")
    }
    assert by_arm["head"] == by_arm["static"]
    card = json.loads((tmp_path / "kept" / "head.json").read_text())
    assert card["check"]["verdict"] == record["verdict"] and "rolled out alike" in record["verdict"]
    assert float(load_head(tmp_path / "kept").out.bias[1].detach()) == pytest.approx(-2.0)  # the head is kept


def test_a_per_token_head_meets_a_static_arm_that_differs_from_it(traced, cnndm_data, tmp_path):
    root, target, draft, traces, (d_target, d_draft) = traced
    head = EnsembleHead(d_draft, d_target, 0, seed=3)
    with torch.no_grad():
        head.out.weight.normal_(0, 0.5)  # w varies from token to token
    record, _ = _check(traced, cnndm_data, tmp_path, head)
    rows = [json.loads(line) for line in (tmp_path / "kept.check.jsonl").read_text().splitlines()]
    own = [r for r in rows if r["arm"] == "head"]
    assert record["static_w"] == pytest.approx(sum(r["w_sum"] for r in own) / sum(r["w_count"] for r in own))
    assert {r["static_w"] for r in rows if r["arm"] == "static"} == {record["static_w"]}
    static = [r for r in rows if r["arm"] == "static"]
    assert [(r["tokens"], r["accepted"]) for r in own] != [(r["tokens"], r["accepted"]) for r in static]


def test_an_interrupted_check_resumes_from_its_log(traced, cnndm_data, tmp_path, monkeypatch):
    first, job = _check(traced, cnndm_data, tmp_path, -5.0)
    log = tmp_path / "kept.check.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:-1]) + lines[-1][:20])  # the last rollout torn by a kill
    again, _ = _check(traced, cnndm_data, tmp_path, -5.0)
    assert again == first and log.read_text().splitlines(keepends=True) == lines

    def refuse(*args, **kwargs):
        raise AssertionError("a finished check loaded the models again")

    monkeypatch.setattr("diversed.loading.stack.load_stack", refuse)
    assert _check(traced, cnndm_data, tmp_path, -5.0)[0] == first


def test_an_untrained_head_needs_no_rollouts_and_says_it_is_static_half(
    traced, cnndm_data, tmp_path, monkeypatch
):
    root, target, draft, traces, (d_target, d_draft) = traced
    card = {"task": "cnndm", "untrained": True, "training": {"seed": 7, "hidden": 0}}
    candidate = save_head(EnsembleHead(d_draft, d_target, 0, 7), tmp_path / "candidate", card)

    def refuse(*args, **kwargs):
        raise AssertionError("nothing to check, yet the models were loaded")

    monkeypatch.setattr("diversed.loading.stack.load_stack", refuse)
    job = CheckJob("cnndm", str(target), str(draft), n_examples=3)
    record = check_head(candidate, tmp_path / "kept", [traces], job, data_dir=cnndm_data, allow_hub=False)
    assert record["rollouts"] == 0 and "static w = 0.5" in record["verdict"]
    assert json.loads((tmp_path / "kept" / "head.json").read_text())["untrained"] is True
