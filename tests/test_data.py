"""Datasets: seeded subsets, the paper's prompts, answer extraction, and clear errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from diversed.data import DataError, get_task, load_examples, resolve
from diversed.data.registry import TASKS
from diversed.data.tasks import CNNDM, normalise_number

SHARED = os.environ.get("DIVERSED_DATA_DIR")
needs_shared = pytest.mark.skipif(
    not SHARED or not Path(SHARED, "gsm8k", "test.jsonl").exists(),
    reason="DIVERSED_DATA_DIR does not point at the shared data copies (.ci/run sets it)",
)


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def cnndm_dir(tmp_path):
    """A small CNN/DM fixture in the HF schema (no real copy is available offline)."""
    shot = {
        "id": CNNDM.SHOT_ID,
        "article": "Harry Potter star Daniel Radcliffe turns 18.",
        "highlights": "Radcliffe is 18.",
    }
    train = [{"id": "a" * 40, "article": "Other text.", "highlights": "Other."}, shot]
    test = [
        {"id": f"{i:040d}", "article": f"Article number {i} text.", "highlights": f"Summary {i}."}
        for i in range(6)
    ]
    write_jsonl(tmp_path / "cnndm" / "train.jsonl", train)
    write_jsonl(tmp_path / "cnndm" / "test.jsonl", test)
    return tmp_path


def test_humaneval_loads_offline_from_its_package():
    examples = load_examples("humaneval", n=164)
    assert len(examples) == 164 and len({e.id for e in examples}) == 164
    first = examples[0]
    assert first.prompt == first.record["prompt"]


def test_subset_is_seeded_and_stable():
    a = [e.id for e in load_examples("humaneval", n=10)]
    assert a == [e.id for e in load_examples("humaneval", n=10)]
    assert a != [e.id for e in load_examples("humaneval", n=10, seed=7)]
    assert a[:5] == [e.id for e in load_examples("humaneval", n=5)]  # a prefix of the same shuffle


def test_cnndm_one_shot_prompt_and_extraction(cnndm_dir):
    examples = load_examples("cnndm", n=3, directory=cnndm_dir, allow_hub=False)
    prompt = examples[0].prompt
    assert prompt.startswith(
        "Article: Harry Potter star Daniel Radcliffe turns 18.\n\nHighlights: Radcliffe is 18."
    )
    assert prompt.endswith("\n\nHighlights: ")
    assert get_task("cnndm").extract(" A summary.\n\nArticle: next one", examples[0].record) == "A summary."


def test_missing_split_names_the_file(tmp_path):
    with pytest.raises(DataError, match=r"place gsm8k/test.jsonl .* under " + str(tmp_path)):
        load_examples("gsm8k", directory=tmp_path, allow_hub=False)


def test_missing_fewshot_example_is_an_error(tmp_path):
    write_jsonl(tmp_path / "cnndm" / "train.jsonl", [{"id": "b" * 40, "article": "x", "highlights": "y"}])
    write_jsonl(tmp_path / "cnndm" / "test.jsonl", [{"id": "c" * 40, "article": "x", "highlights": "y"}])
    with pytest.raises(DataError, match=CNNDM.SHOT_ID):
        load_examples("cnndm", directory=tmp_path, allow_hub=False)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (" 3 + 4 = 7\n#### 7\n\nQuestion: next", "7"),
        (" so she pays $1,250.00 in total.\n\nQuestion: x #### 9", "1250"),
        (" the answer is 12 apples and 5 pears", "5"),
        (" nothing numeric here", ""),
    ],
)
def test_gsm8k_extraction(completion, expected):
    assert get_task("gsm8k").extract(completion, {}) == expected


def test_number_normalisation():
    assert normalise_number(" 1,234.0 ") == "1234"
    assert normalise_number("-3") == "-3"


def test_mbpp_extraction_keeps_imports_and_drops_fences():
    completion = (
        "Here you go:\n```python\nimport math\ndef f(x):\n    return math.sqrt(x)\n```\nExplanation..."
    )
    assert get_task("mbpp").extract(completion, {}) == "import math\ndef f(x):\n    return math.sqrt(x)"


@pytest.mark.parametrize(
    "completion",
    [
        # a stray fence before the real block (seen on MBPP train traces)
        "```\n\nHere is the code:\n\n```python\ndef f(x):\n    return x + 1\n```\nIt adds one.",
        # the model's own tests, cut off by the token budget in the middle of a line
        "def f(x):\n    return x + 1\n\n# Test\nassert f(1) == 2\nassert f(2) == [(1, 2), (3",
        # prose after the function, no fence at all
        "def f(x):\n    return x + 1\n\nThis function adds one to x.",
    ],
)
def test_mbpp_extraction_keeps_the_function_whatever_follows(completion):
    code = get_task("mbpp").extract(completion, {})
    assert code.startswith("def f(x):\n    return x + 1")
    namespace: dict = {}
    exec(compile(code, "<test>", "exec"), namespace)  # noqa: S102 - our own literal code
    assert namespace["f"](1) == 2


def test_mbpp_stops_when_its_code_block_closes():
    """Greedy completions of the paper's prompt: more asserts, one fenced block, then prose about it
    until the budget; the answer is finished when the block closes (an opening fence is no stop)."""
    task = get_task("mbpp")
    completion = "assert f(2) == 3\n\n```python\ndef f(x):\n    return x + 1\n```\nThe function adds one, ..."
    ends = [completion.find(s) + len(s) for s in task.stop_strings if s in completion]
    assert ends and completion[: min(ends)].endswith("\n```\n")
    assert not any(s in "assert f(2) == 3\n\n```python\ndef f(x):\n" for s in task.stop_strings)
    assert task.extract(completion[: min(ends)], {}) == "def f(x):\n    return x + 1"


def test_humaneval_extraction_appends_completion_to_prompt():
    record = {"prompt": "def add(a, b):\n    '''Add.'''\n", "entry_point": "add"}
    task = get_task("humaneval")
    assert (
        task.extract("    return a + b\n\ndef other():\n    pass", record)
        == record["prompt"] + "    return a + b"
    )
    rewritten = "```python\ndef add(a, b):\n    return b + a\n```"
    assert task.extract(rewritten, record) == "def add(a, b):\n    return b + a"


@needs_shared
def test_gsm8k_four_shot_prompt_from_train():
    examples = load_examples("gsm8k", n=3, directory=SHARED, allow_hub=False)
    prompt = examples[0].prompt
    assert prompt.count("Question:") == 5 and prompt.count("####") == 4
    assert (
        prompt.index("Georgie") < prompt.index("Hana") < prompt.index("shoe company") < prompt.index("Olga")
    )
    assert "<<" not in prompt  # calculator annotations stripped
    assert prompt.endswith(f"Question: {examples[0].record['question']}\nAnswer: Let's think step by step.")
    assert examples[0].reference == normalise_number(examples[0].record["answer"].split("####")[-1])


@needs_shared
def test_mbpp_test_split_lists_its_tests():
    examples = load_examples("mbpp", n=5, directory=SHARED, allow_hub=False)
    for e in examples:
        assert 11 <= int(e.id) <= 510
        assert all(test in e.prompt for test in e.record["test_list"])


@needs_shared
def test_wmt_is_english_to_german():
    example = load_examples("wmt", n=1, directory=SHARED, allow_hub=False)[0]
    assert example.prompt.startswith("Translate the following English sentences to German.\n\nEnglish: ")
    assert example.prompt.endswith("\nGerman:")
    assert example.reference == example.record["translation"]["de"]
    assert get_task("wmt").extract(" Guten Tag.\n\nEnglish: more", example.record) == "Guten Tag."


@needs_shared
def test_xsum_two_shots_are_the_first_two_train_records():
    import json

    lines = (Path(SHARED) / "xsum" / "train.jsonl").read_text().splitlines()
    shots = [json.loads(line) for line in lines[:2]]
    example = load_examples("xsum", n=1, directory=SHARED, allow_hub=False)[0]
    for shot in shots:
        assert f"Summary: {shot['summary']}" in example.prompt
    assert example.record["id"] not in {shot["id"] for shot in shots}


@needs_shared
def test_cnndm_one_shot_is_the_radcliffe_article():
    example = load_examples("cnndm", n=1, directory=SHARED, allow_hub=False)[0]
    assert "Radcliffe" in example.prompt


@needs_shared
@pytest.mark.parametrize(("dataset", "split"), [(d, "test") for d in sorted(TASKS)] + [("wmt", "validation")])
def test_every_local_split_loads_offline(dataset, split):
    assert resolve(dataset, split, SHARED, allow_hub=False) in {"local", "package"}
    examples = load_examples(dataset, split, n=2, directory=SHARED, allow_hub=False)
    # Spec-Bench's MT-bench questions (its first) have no reference: they are timed, not scored
    assert len(examples) == 2 and all(e.prompt and (e.reference or e.category) for e in examples)


def test_a_split_smaller_than_asked_says_so_and_is_not_padded(cnndm_dir, capsys):
    examples = load_examples("cnndm", n=50, directory=cnndm_dir, allow_hub=False)
    held = len((cnndm_dir / "cnndm" / "test.jsonl").read_text().splitlines())
    assert len(examples) == held < 50
    err = capsys.readouterr().err
    assert err.count("fewer than the 50 asked for") == 1 and "cnndm/test" in err


def test_tables_name_the_task_each_head_learned_on_without_splitting_its_row():
    from diversed.evaluation.report import head_note, head_source, setting_label

    base = {"method": "diversed", "num_assistant_tokens": 4, "temperature": 1.0, "dataset": "humaneval"}
    assert head_source({**base, "head": "results/heads/mbpp"}) == "mbpp"
    assert head_source({**base, "head": "results/heads/mbpp/r2"}) == "mbpp"  # a round
    assert head_source({**base, "head": "results/heads/wmt.validation/r1"}) == "wmt/validation"
    assert head_source({**base, "head": "results/heads/mbpp/s43/r1"}) == "mbpp"  # a seed
    assert head_source(base) is None
    # one setting, one row: a head learned elsewhere does not make HumanEval's row differ from MBPP's
    assert setting_label({**base, "head": "results/heads/mbpp/r1"}) == "diversed k=4 T=1"
    assert setting_label({**base, "dataset": "mbpp", "head": "results/heads/mbpp/r1"}) == "diversed k=4 T=1"
    assert setting_label({**base, "head": "results/heads/mbpp/s43/r1"}) == "diversed s43 k=4 T=1"
    finalist = {**base, "head": "results/candidates/gsm8k/s42/r1/lambda-1.5"}  # decoded by hand
    assert setting_label(finalist) == "diversed s42 lambda=1.5 k=4 T=1" and head_source(finalist) == "gsm8k"
    rows = [{"dataset": "mbpp", "head": "mbpp"}, {"dataset": "humaneval", "head": "mbpp"}, {"dataset": "wmt"}]
    assert head_note(rows) == "DIVERSED heads learned on: humaneval <- mbpp, mbpp <- mbpp"
    assert head_note([{"dataset": "mbpp", "head": None}]) == ""


def test_a_head_kept_outside_results_is_named_by_the_task_its_card_records(tmp_path):
    from diversed.evaluation.report import head_source

    kept = tmp_path / "docs" / "heads" / "lambda-1.5"
    kept.mkdir(parents=True)
    (kept / "head.json").write_text(json.dumps({"task": "gsm8k"}))
    base = {"method": "diversed", "dataset": "gsm8k"}
    assert head_source({**base, "head": str(kept)}) == "gsm8k"
    assert head_source({**base, "head": str(tmp_path / "docs" / "heads" / "lambda-0.7")}) == "unknown task"
    assert head_source({**base, "head": "oracle:digits"}) is None  # a hand-made rule learned on nothing


def test_doctor_reports_each_local_split_it_finds(cnndm_dir, capsys):
    from diversed.pipeline.doctor import run_doctor

    run_doctor(str(cnndm_dir))
    line = next(x for x in capsys.readouterr().out.splitlines() if "dataset cnndm" in x)
    held = {s: len((cnndm_dir / "cnndm" / f"{s}.jsonl").read_text().splitlines()) for s in ("test", "train")}
    assert line.endswith(f"local: test {held['test']}, train {held['train']}")


def test_resolution_never_calls_the_network_and_honours_the_offline_switches(tmp_path, monkeypatch):
    """The workflow resolves datasets at every parse (inside every cluster job too): local files,
    the datasets cache and HF_HUB_OFFLINE decide, and a split only the hub has is fetched once,
    later, by `data status --fetch`."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError("resolve() opened a connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(name, raising=False)
    assert resolve("gsm8k", "test", tmp_path / "no-data") == "hub"
    assert resolve("gsm8k", "test", tmp_path / "no-data", allow_hub=False) == "missing"
    cached = tmp_path / "hf" / "datasets" / "openai___gsm8k" / "main"
    cached.mkdir(parents=True)
    (cached / "0.0.0").mkdir()
    assert resolve("gsm8k", "test", tmp_path / "no-data") == "cached"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve("cnndm", "test", tmp_path / "no-data") == "missing"  # offline and not cached
    assert resolve("gsm8k", "test", tmp_path / "no-data") == "cached"


def test_a_dataset_that_cannot_be_had_stops_data_status_in_one_line(tmp_path, monkeypatch, capsys):
    from diversed.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(SystemExit) as stop:
        main(
            [
                "data",
                "status",
                "--datasets",
                "gsm8k",
                "humaneval",
                "--fetch",
                "--missing",
                "error",
                "--data-dir",
                str(tmp_path),
            ]
        )
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "datasets that cannot be had: gsm8k " in err


def test_a_null_id_takes_its_index_and_a_repeated_id_is_refused(tmp_path):
    """CNN/DM's HF copies hold null ids: as "None" 392 of 400 trace prompts were one example."""
    shot = {"id": CNNDM.SHOT_ID, "article": "Radcliffe turns 18.", "highlights": "He is 18."}
    rows = [{"id": None, "article": f"Text {i}.", "highlights": f"S {i}."} for i in range(5)]
    write_jsonl(tmp_path / "cnndm" / "train.jsonl", [shot, *rows])
    write_jsonl(tmp_path / "cnndm" / "test.jsonl", rows)
    examples = load_examples("cnndm", "test", None, directory=tmp_path, allow_hub=False)
    assert sorted(e.id for e in examples) == ["0", "1", "2", "3", "4"]
    write_jsonl(tmp_path / "cnndm" / "test.jsonl", [{**rows[0], "id": "x"}, {**rows[1], "id": "x"}])
    with pytest.raises(DataError, match="cnndm/test: example id 'x' appears 2 times; ids must be unique"):
        load_examples("cnndm", "test", None, directory=tmp_path, allow_hub=False)


def test_data_status_refuses_a_split_smaller_than_the_run_draws_in_one_line(tmp_path, capsys):
    from diversed.cli import main

    write_jsonl(
        tmp_path / "mbpp" / "train.jsonl",
        [{"task_id": 601 + i, "text": "t", "code": "", "test_list": []} for i in range(6)],
    )
    argv = ["data", "status", "--datasets", "mbpp.train", "--data-dir", str(tmp_path), "--no-hub"]
    draws = ["--draws", "mbpp.train=4:trace-prompts", "mbpp.train=2:check-prompts"]
    assert main([*argv, *draws]) == 0  # 6 of 6: it fits
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*argv, "--draws", "mbpp.train=5:trace-prompts", "mbpp.train=2:check-prompts"])
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1].endswith(
        "mbpp.train holds 6, needs 7 (5 trace prompts + 2 check prompts) (lower data.n_examples,"
        " head.n_examples or head.check_examples, or give larger copies)"
    )


@needs_shared
def test_local_sizes_count_usable_examples_without_the_shots_a_split_lends():
    from diversed.data.sizes import local_size

    assert local_size("mbpp", "train", SHARED) == 374
    assert local_size("gsm8k", "train", SHARED) == 7473 - 4  # its four worked examples prompt the rest
    assert local_size("humaneval", "test", SHARED) is None  # a package, not a local copy
