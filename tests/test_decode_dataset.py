"""Decoding a dataset: one JSON line per example, resumable after a kill, never mixed; then scoring."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from diversed.cli import main
from diversed.data import load_examples

KEYS = {
    "id",
    "dataset",
    "method",
    "prompt",
    "completion",
    "raw_completion",
    "prediction",
    "reference",
    "stats",
}


def decode_argv(model_dirs, out, n=4, *extra):
    target, draft = model_dirs
    return [
        *("decode", "--dataset", "humaneval", "--n-examples", str(n), "--method", "sd"),
        *(
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--max-new-tokens",
            "12",
            "--out",
            str(out),
            "--quiet",
        ),
        *extra,
    ]


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_decode_writes_one_record_per_example(model_dirs, tmp_path):
    out = tmp_path / "he.jsonl"
    assert main(decode_argv(model_dirs, out)) == 0
    records = lines(out)
    assert len(records) == 4 and len({r["id"] for r in records}) == 4
    for r in records:
        assert set(r) >= KEYS
        assert r["prediction"].startswith(r["prompt"])  # HumanEval: the prompt plus its completion
        # the completion is what is scored, cut at the stop; the model's whole text stays beside it
        assert r["raw_completion"].startswith(r["completion"])
        rewrote = "def " in r["raw_completion"]  # a completion that rewrites the function is kept whole
        assert rewrote or r["prediction"] == r["prompt"] + r["completion"]
        assert r["stats"]["blocks"] > 0


def test_resume_skips_finished_and_redoes_a_torn_line(model_dirs, tmp_path):
    out = tmp_path / "he.jsonl"
    main(decode_argv(model_dirs, out, 3))
    full = lines(out)
    text = out.read_text().splitlines(keepends=True)
    out.write_text(text[0] + text[1][: len(text[1]) // 2])  # as if killed while writing the second line
    main(decode_argv(model_dirs, out, 3))
    resumed = lines(out)
    assert [r["id"] for r in resumed] == [r["id"] for r in full]
    # each example has its own seed, so a resumed run gives the same tokens as an uninterrupted one
    assert [r["token_ids"] for r in resumed] == [r["token_ids"] for r in full]


def test_records_made_with_other_arguments_are_refused(model_dirs, tmp_path, capsys):
    out = tmp_path / "he.jsonl"
    main(decode_argv(model_dirs, out, 2))
    before = out.read_text()
    with pytest.raises(SystemExit) as exit_:
        main(decode_argv(model_dirs, out, 2, "--num-assistant-tokens", "3"))
    assert exit_.value.code == 2
    assert "different arguments (differing: num_assistant_tokens)" in capsys.readouterr().err
    assert out.read_text() == before


def test_a_cell_grows_by_decoding_only_its_new_examples_and_never_shrinks(model_dirs, tmp_path, capsys):
    grown, fresh = tmp_path / "grown.jsonl", tmp_path / "fresh.jsonl"
    main(decode_argv(model_dirs, grown, 2))
    first = lines(grown)
    main(decode_argv(model_dirs, grown, 4))
    main(decode_argv(model_dirs, fresh, 4))
    records = lines(grown)
    assert records[:2] == [
        {**r, "settings": records[0]["settings"], "settings_hash": records[0]["settings_hash"]} for r in first
    ]
    assert [r["token_ids"] for r in records] == [r["token_ids"] for r in lines(fresh)]
    assert {r["settings"]["n_examples"] for r in records} == {4}
    before = grown.read_text()
    with pytest.raises(SystemExit):  # 2 of these 4 would be records of no example of a 2-example cell
        main(decode_argv(model_dirs, grown, 2))
    assert "differing: n_examples" in capsys.readouterr().err and grown.read_text() == before


def test_kill_minus_nine_then_resume(model_dirs, tmp_path):
    out = tmp_path / "he.jsonl"
    argv = decode_argv(model_dirs, out, 8)
    argv[argv.index("12")] = "48"  # slower examples so the kill lands mid-run
    proc = subprocess.Popen([sys.executable, "-m", "diversed.cli", *argv])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    survived = out.read_text().count("\n")
    assert 2 <= survived < 8
    assert subprocess.run([sys.executable, "-m", "diversed.cli", *argv], check=False).returncode == 0
    records = lines(out)
    assert len(records) == 8 and len({r["id"] for r in records}) == 8


def test_score_reports_quality_and_efficiency(model_dirs, tmp_path, capsys):
    out = tmp_path / "he.jsonl"
    main(decode_argv(model_dirs, out, 3))
    metrics_path = tmp_path / "metrics.json"
    assert main(["score", "--dataset", "humaneval", "--in", str(out), "--out", str(metrics_path)]) == 0
    metrics = json.loads(metrics_path.read_text())
    assert metrics["pass@1"] == 0.0  # a random tiny model writes no working code
    assert len(metrics["per_example"]) == 3 and all(not e["passed"] for e in metrics["per_example"])
    for key in ("acceptance_rate", "mean_accepted_length", "tokens_per_second", "seconds_per_example"):
        assert metrics[key] is not None
    records = lines(out)
    assert metrics["target_forwards_per_token"] == pytest.approx(
        sum(r["stats"]["target_forwards"] for r in records) / sum(r["stats"]["new_tokens"] for r in records)
    )
    assert all(r["batch"]["cpu_seconds"] > 0 and r["batch"]["threads"] >= 1 for r in records)
    assert metrics["cpu_share"] > 0


def test_cpu_share_pools_each_batch_once_and_only_on_cpus():
    from diversed.evaluation.score import cpu_share

    def record(batch: str, seconds: float, cpu: float, device: str = "cpu") -> dict:
        timing = {"id": batch, "seconds": seconds, "cpu_seconds": cpu, "threads": 2}
        return {"device": device, "batch": timing}

    alone, shared = record("a", 10.0, 19.0), record("b", 30.0, 21.0)
    assert cpu_share([alone, alone, shared]) == pytest.approx(40 / 80)  # batch a counted once
    assert cpu_share([alone]) == pytest.approx(0.95)
    assert cpu_share([record("a", 10.0, 9.0, device="cuda:0 (NVIDIA H100)")]) is None
    assert cpu_share([{"device": "cpu", "batch": {"id": "a", "seconds": 10.0}}]) is None  # older records


def test_score_of_canonical_answers_is_perfect(tmp_path, canonical_decode_file):
    """Scoring path check: feeding the references as predictions gives pass@1 = 100."""
    from diversed.evaluation.score import score_file

    path = canonical_decode_file(5)
    result = score_file("humaneval", path, tmp_path / "m.json")
    assert result["pass@1"] == 100.0 and result["pass@1_ci"] == [100.0, 100.0]
    for figure in ("acceptance_rate", "mean_accepted_length", "seconds_per_example"):
        assert f"{figure}_ci" in result  # None where the figure has no value (e.g. auto's acceptance)
    assert [e["quality"] for e in result["per_example"]] == [100.0] * 5


def test_batched_decode_equals_batch_one_and_times_its_latency_subset(model_dirs, tmp_path):
    one, batched = tmp_path / "one.jsonl", tmp_path / "batched.jsonl"
    sampling = ("--temperature", "1.0")
    assert main(decode_argv(model_dirs, one, 5, *sampling)) == 0
    argv = decode_argv(model_dirs, batched, 5, *sampling, "--batch-size", "3", "--latency-examples", "2")
    assert main(argv) == 0
    a, b = lines(one), lines(batched)
    assert (
        [r["id"] for r in a] == [r["id"] for r in b] == [e.id for e in load_examples("humaneval", "test", 5)]
    )
    assert [r["token_ids"] for r in a] == [r["token_ids"] for r in b]
    assert [r["batch"]["size"] for r in b] == [1, 1, 3, 3, 3]
    assert [r["stats"]["batch_size"] for r in b] == [1, 1, 3, 3, 3]
    from diversed.evaluation.score import efficiency

    figures = efficiency(b)
    assert figures["latency_examples"] == 2 and figures["batch_size"] == 3
    singles = [r["stats"]["prefill_seconds"] + r["stats"]["decode_seconds"] for r in b[:2]]
    assert figures["seconds_per_example"] == pytest.approx(sum(singles) / 2)


def test_batches_after_the_latency_subset_go_in_order_of_prompt_length():
    """Least left padding: rows of similar prompt length share a batch (ties by example order)."""
    from diversed.jobs.decode import plan_batches

    todo = [(i, None) for i in range(7)]
    lengths = {0: 50, 1: 10, 2: 30, 3: 5, 4: 30, 5: 90, 6: 20}
    batches = plan_batches(todo, 2, 1, lengths)
    assert [[i for i, _ in batch] for batch in batches] == [[0], [3, 1], [6, 2], [4, 5]]


def test_killed_batched_decode_resumes_without_duplicates(model_dirs, tmp_path):
    out = tmp_path / "he.jsonl"
    assert main(decode_argv(model_dirs, out, 5, "--batch-size", "2")) == 0
    full = lines(out)
    torn = json.dumps(full[3])[:40]  # a kill while the batch's second line was being written
    out.write_text("".join(json.dumps(r) + "\n" for r in full[:3]) + torn)
    assert main(decode_argv(model_dirs, out, 5, "--batch-size", "2")) == 0
    again = lines(out)
    assert [r["id"] for r in again] == [r["id"] for r in full]
    assert [r["token_ids"] for r in again] == [r["token_ids"] for r in full]


def test_decode_with_the_fixed_step_writes_the_eager_records_and_says_so(model_dirs, tmp_path):
    """``--step fixed`` (the shape CUDA graphs replay) is a speed choice: the same tokens in fp32,
    batched, with rows leaving; each record says which step made it."""
    records = {}
    for step in ("eager", "fixed"):
        out = tmp_path / f"{step}.jsonl"
        extra = ("--temperature", "1.0", "--batch-size", "3", "--dtype", "float32", "--step", step)
        assert main(decode_argv(model_dirs, out, 5, *extra)) == 0
        records[step] = lines(out)
    assert [r["token_ids"] for r in records["fixed"]] == [r["token_ids"] for r in records["eager"]]
    assert {r["step"] for r in records["fixed"]} == {"fixed"} and records["eager"][0]["step"] == "eager"


def test_a_cell_from_first_example_is_the_tail_of_the_whole_cell_with_its_seeds(model_dirs, tmp_path):
    """A confirmatory cell decodes only examples an earlier one never saw, each with its position's
    seed: under sampling, its records equal the whole cell's tail token for token."""
    whole, tail = tmp_path / "whole.jsonl", tmp_path / "tail.jsonl"
    sampled = ("--temperature", "1")
    assert main(decode_argv(model_dirs, whole, 5, *sampled)) == 0
    assert main(decode_argv(model_dirs, tail, 5, *sampled, "--first-example", "2")) == 0
    assert [(r["id"], r["token_ids"]) for r in lines(tail)] == [
        (r["id"], r["token_ids"]) for r in lines(whole)[2:]
    ]
    assert lines(tail)[0]["settings"]["first_example"] == 2
    assert "first_example" not in lines(whole)[0]["settings"]  # older cells stay resumable


def test_a_first_example_past_the_cell_is_refused_in_one_line(model_dirs, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(decode_argv(model_dirs, tmp_path / "x.jsonl", 3, "--first-example", "3"))
    assert "first_example 3 leaves no example of n_examples 3" in capsys.readouterr().err
