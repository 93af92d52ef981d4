"""The on-policy check of a trained head: its rule, its rollouts, its resumption."""

from __future__ import annotations

import json

import pytest
import torch

from diversed.cli import main
from diversed.head import EnsembleHead, load_head, save_head
from diversed.tiny import write_tiny_pair
from diversed.training.check import CheckJob, check_head, decide, trained_prompts


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


def test_a_candidate_is_kept_when_reward_holds_and_acceptance_rises():
    record = decide(_rows("candidate", [1.0, 0.0], 6) + _rows("start", [1.0, 0.0], 4), 0.02, 0.95)
    assert record["kept"] == "candidate" and record["prompts"] == 8
    arm = record["arms"]["candidate"]
    assert arm["reward_change"] == 0 and arm["acceptance_change"] == pytest.approx(0.25)


def test_a_candidate_that_loses_reward_on_policy_is_refused_however_much_it_accepts():
    record = decide(_rows("candidate", [0.0, 0.0, 1.0], 8) + _rows("start", [1.0, 1.0, 0.0], 2), 0.02, 0.95)
    assert record["kept"] == "start"
    arm = record["arms"]["candidate"]
    assert arm["reward_change_low"] < -0.02 and arm["acceptance_change"] > 0.5
    # its bound: 1.645 standard errors of the paired per-prompt changes; wider than the tolerance
    changes = torch.tensor(
        [-1.0, 0.0, 0.0, -1.0, 0.0, 0.0, -1.0, 0.0]
    )  # per prompt: (0, .5, .5) - (1, .5, .5)
    assert arm["reward_change_half_width"] == pytest.approx(
        1.6449 * float(changes.std()) / len(changes) ** 0.5, rel=1e-3
    )
    assert "could not have been kept" in record["power"]


def test_a_candidate_that_accepts_less_is_refused_even_at_equal_reward():
    record = decide(_rows("candidate", [1.0, 0.0], 3) + _rows("start", [1.0, 0.0], 4), 0.02, 0.95)
    assert record["kept"] == "start" and record["arms"]["candidate"]["acceptance_change"] < 0


def test_among_several_candidates_the_eligible_one_with_the_best_objective_is_kept():
    rows = _rows("start", [0.0], 6) + _rows("lambda-3", [0.0], 8)  # accepts more, earns nothing more
    rows += _rows("lambda-1", [1.0, 0.0], 5)  # earns half the prompts at some cost in acceptance
    rows += _rows("chosen", [1.0, 0.0, 0.0, 0.0], 1)  # earns less and accepts much less: J below lambda-1's
    record = decide(rows, 0.02, 0.95)
    assert record["kept"] == "lambda-1"
    assert record["arms"]["lambda-3"]["eligible"] and record["arms"]["lambda-1"]["eligible"]
    assert record["arms"]["lambda-1"]["objective"] > record["arms"]["lambda-3"]["objective"]
    assert decide(rows, 0.02, 0.95, acceptance_value=10.0)["kept"] == "lambda-3"  # acceptance worth more


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


def _check(traced, cnndm_data, tmp_path, target_logit: float):
    root, target, draft, traces, (d_target, d_draft) = traced
    candidate = save_head(_head(target_logit, d_draft, d_target), tmp_path / "candidate", {"task": "cnndm"})
    job = CheckJob("cnndm", str(target), str(draft), n_examples=3, rollouts=2, max_new_tokens=8)
    record = check_head(candidate, tmp_path / "kept", [traces], job, data_dir=cnndm_data, allow_hub=False)
    return record, job


def test_check_keeps_a_head_that_accepts_more_and_rolls_out_only_unseen_prompts(traced, cnndm_data, tmp_path):
    record, _ = _check(traced, cnndm_data, tmp_path, -5.0)  # w ~ 0.007: the draft is trusted
    assert record["kept"] == "chosen" and record["prompts"] == 3 and record["rollouts"] == 12
    assert record["arms"]["chosen"]["acceptance_change"] > 0
    rows = [json.loads(line) for line in (tmp_path / "kept.check.jsonl").read_text().splitlines()]
    assert not {r["example_id"] for r in rows} & trained_prompts([traced[3]])
    card = json.loads((tmp_path / "kept" / "head.json").read_text())
    assert card["check"]["kept"] == "chosen"
    assert float(load_head(tmp_path / "kept").out.bias[1].detach()) == pytest.approx(-5.0)


def test_check_refuses_a_head_that_accepts_less_and_keeps_the_starting_one(traced, cnndm_data, tmp_path):
    record, _ = _check(traced, cnndm_data, tmp_path, 5.0)  # w ~ 0.993: every draft token is checked hard
    assert record["kept"] == "start" and record["arms"]["chosen"]["acceptance_change"] < 0
    card = json.loads((tmp_path / "kept" / "head.json").read_text())
    assert card["check"]["kept"] == "start" and card["metrics"]["w_mean"] == pytest.approx(0.5)
    assert card["check"]["refused"]["metrics"] is None  # the candidate's card had no training figures
    kept = load_head(tmp_path / "kept")
    assert torch.equal(kept.out.bias, torch.zeros(2))  # the untrained head: w = 0.5 everywhere


def test_an_interrupted_check_resumes_from_its_log(traced, cnndm_data, tmp_path, monkeypatch):
    first, job = _check(traced, cnndm_data, tmp_path, -5.0)
    log = tmp_path / "kept.check.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:-1]) + lines[-1][:20])  # the last rollout torn by a kill
    again, _ = _check(traced, cnndm_data, tmp_path, -5.0)
    assert again == first and log.read_text().splitlines(keepends=True) == lines

    def refuse(*args, **kwargs):
        raise AssertionError("a finished check loaded the models again")

    monkeypatch.setattr("diversed.stack.load_stack", refuse)
    assert _check(traced, cnndm_data, tmp_path, -5.0)[0] == first


def test_a_candidate_with_a_significant_reward_gain_is_kept_at_some_cost_in_acceptance():
    record = decide(_rows("candidate", [1.0, 1.0, 0.0], 5) + _rows("start", [0.0, 0.0, 1.0], 6), 0.02, 0.95)
    arm = record["arms"]["candidate"]
    assert arm["reward_change_low"] > 0 and arm["acceptance_change"] < 0
    assert record["kept"] == "candidate"


def test_check_chooses_among_the_lambdas_finalists_and_copies_the_kept_one(traced, cnndm_data, tmp_path):
    root, target, draft, traces, (d_target, d_draft) = traced
    candidate = save_head(_head(5.0, d_draft, d_target), tmp_path / "candidate", {"task": "cnndm"})
    save_head(
        _head(-5.0, d_draft, d_target), candidate / "lambda-3", {"task": "cnndm", "chosen_by": "lambda 3"}
    )
    save_head(_head(5.0, d_draft, d_target), candidate / "lambda-1", {"task": "cnndm"})  # = the chosen one
    job = CheckJob("cnndm", str(target), str(draft), n_examples=3, rollouts=1, max_new_tokens=8)
    record = check_head(candidate, tmp_path / "kept", [traces], job, data_dir=cnndm_data, allow_hub=False)
    assert set(record["arms"]) == {"start", "chosen", "lambda-3"}  # a duplicate head is rolled out once
    assert record["kept"] == "lambda-3"
    card = json.loads((tmp_path / "kept" / "head.json").read_text())
    assert card["chosen_by"] == "lambda 3" and card["check"]["kept"] == "lambda-3"
    assert not list((tmp_path / "kept").glob("lambda-*"))


def test_a_candidate_that_is_the_trainers_untrained_head_needs_no_rollouts(
    traced, cnndm_data, tmp_path, monkeypatch
):
    root, target, draft, traces, (d_target, d_draft) = traced
    card = {"task": "cnndm", "training": {"seed": 7, "hidden": 0}}
    candidate = save_head(EnsembleHead(d_draft, d_target, 0, 7), tmp_path / "candidate", card)

    def refuse(*args, **kwargs):
        raise AssertionError("nothing to check, yet the models were loaded")

    monkeypatch.setattr("diversed.stack.load_stack", refuse)
    job = CheckJob("cnndm", str(target), str(draft), n_examples=3)
    record = check_head(candidate, tmp_path / "kept", [traces], job, data_dir=cnndm_data, allow_hub=False)
    assert record["kept"] == "start" and "nothing to check" in record["rule"]
