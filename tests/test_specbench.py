"""Spec-Bench as a dataset: its questions, multi-turn conversations, answer files and their reading.

The reader is checked against a small answer file whose figures are worked out by hand below, with
a wrong reading (the mean of per-question ratios) that the same file tells apart; the decode path
runs a tiny random pair over a Spec-Bench-shaped question file.
"""

from __future__ import annotations

import json

import pytest

from diversed.config import DecodeConfig
from diversed.data import DataError, load_examples
from diversed.evaluation.export import export
from diversed.evaluation.score import quality
from diversed.evaluation.specbench import containment, lossless, speed
from diversed.jobs.decode import DecodeJob, run_decode
from diversed.jobs.runner import RunOptions
from diversed.loading.models import conversation_ids
from diversed.loading.tiny import write_tiny_pair


def choice(turns, new_tokens, wall_time, accept_lengths):
    return {
        "turns": turns,
        "new_tokens": new_tokens,
        "wall_time": wall_time,
        "accept_lengths": accept_lengths,
    }


METHOD = [  # question 1 (MT-bench, two turns): 30 tokens in 2 s = 15 tok/s; question 2 (qa): 12 in 4 s = 3
    {
        "question_id": 81,
        "category": "writing",
        "choices": [choice(["x", "y"], [10, 20], [1.0, 1.0], [1, 2, 3])],
    },
    {"question_id": 321, "category": "qa", "choices": [choice(["z"], [12], [4.0], [4, 4])]},
]
BASELINE = [  # tokens re-counted from the text: words - 1 (speed.py's len(input_ids) - 1 on a word tokenizer)
    {
        "question_id": 81,
        "category": "writing",
        "choices": [choice(["a b c d e", "a b c"], [9, 9], [2.0, 1.0], [1])],
    },
    {"question_id": 321, "category": "qa", "choices": [choice(["x y z"], [9], [2.0], [1])]},
]


def words_minus_one(text: str) -> int:
    return len(text.split()) - 1


def test_the_reader_gives_the_hand_computed_figures():
    # baseline: question 1 (4 + 2) tokens / 3 s = 2 tok/s; question 2: 2 tokens / 2 s = 1 tok/s
    found = {g: speed(METHOD, BASELINE, words_minus_one, g) for g in ("mt_bench", "qa", "overall", "rag")}
    assert found["mt_bench"].speedup == pytest.approx(15 / 2)
    assert found["mt_bench"].mean_accepted_tokens == pytest.approx(2.0)
    assert found["qa"].speedup == pytest.approx(3 / 1)
    assert found["qa"].mean_accepted_tokens == pytest.approx(4.0)
    # overall: the ratio of the mean speeds (9 / 1.5), not the mean of per-question ratios (5.25)
    assert found["overall"].speedup == pytest.approx(6.0)
    assert found["overall"].speedup != pytest.approx((15 / 2 + 3 / 1) / 2)
    assert found["overall"].mean_accepted_tokens == pytest.approx((1 + 2 + 3 + 4 + 4) / 5)
    assert found["overall"].questions == 2 and found["rag"].questions == 0


def test_rag_answers_count_when_they_contain_an_acceptable_span():
    references = [json.dumps(["James Ray", "George Harrison"]), json.dumps(["Paris"])]
    assert containment(["It was george harrison.", "Lyon"], references) == 50.0


def write_questions(root):
    """A question file in Spec-Bench's schema: two MT-bench questions of two turns, three single-turn."""
    rows = [
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorten it."]},
        {"question_id": 82, "category": "writing", "turns": ["Write an email.", "Make it formal."]},
        {
            "question_id": 161,
            "category": "translation",
            "turns": ["Translate: Hallo"],
            "reference": ["Hello"],
        },
        {
            "question_id": 162,
            "category": "translation",
            "turns": ["Translate: Danke"],
            "reference": ["Thanks"],
        },
        {
            "question_id": 401,
            "category": "math_reasoning",
            "turns": ["What is 2 + 3?"],
            "reference": ["2 + 3 = 5\n#### 5"],
        },
    ]
    folder = root / "spec_bench"
    folder.mkdir(parents=True)
    (folder / "question.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    return write_questions(tmp_path_factory.mktemp("data"))


def test_the_stratified_subset_keeps_the_first_questions_of_each_category_by_id(questions):
    chosen = load_examples("specbench", directory=questions, per_category=1)
    assert [(e.id, e.category) for e in chosen] == [
        ("81", "writing"),
        ("161", "translation"),
        ("401", "math_reasoning"),
    ]
    assert chosen[0].followups == ("Now shorten it.",) and chosen[2].reference == "5"
    only = load_examples("specbench", directory=questions, categories=("translation",))
    assert [e.id for e in only] == ["161", "162"]
    with pytest.raises(DataError, match="no category poetry"):
        load_examples("specbench", directory=questions, categories=("poetry",))
    with pytest.raises(DataError, match="gsm8k has no categories"):
        load_examples("gsm8k", directory=questions, per_category=1)


def test_the_second_turn_follows_the_models_own_first_answer(tokenizer):
    ids = conversation_ids(tokenizer, ["Write a poem.", "Now shorten it."], ["Roses are red."])
    text = tokenizer.decode(ids)
    assert text.index("Write a poem.") < text.index("Roses are red.") < text.index("Now shorten it.")
    assert text.endswith("assistant: ")
    with pytest.raises(ValueError, match="needs 1 answers"):
        conversation_ids(tokenizer, ["a", "b"], [])


@pytest.fixture(scope="module")
def decoded(questions, tmp_path_factory):
    """Greedy auto and sd over every question (max 12 new tokens), in the chat template."""
    target, draft = write_tiny_pair(tmp_path_factory.mktemp("tiny"))
    out = tmp_path_factory.mktemp("rows")
    found = {}
    for method, batch in (("auto", 2), ("sd", 2), ("sd-b1", 1)):
        config = DecodeConfig.from_dict({"method": method.split("-")[0], "max_new_tokens": 12})
        job = DecodeJob("specbench", "test", None, str(target), str(draft), config, per_category=2)
        options = RunOptions(progress=False, batch_size=batch)
        found[method] = run_decode(job, out / f"{method}.jsonl", options, data_dir=questions)
    return {m: [json.loads(line) for line in p.read_text().splitlines()] for m, p in found.items()}


def test_multi_turn_records_keep_every_turn_and_greedy_sd_is_auto_on_each(decoded):
    sd, auto = decoded["sd"], decoded["auto"]
    assert [len(r.get("turns", [])) for r in sd] == [2, 2, 1, 1, 1]
    assert all(r["settings"]["chat"] for r in sd)  # a chat benchmark is always asked in the template
    first, second = sd[0]["turns"]
    assert sd[0]["stats"]["new_tokens"] == first["stats"]["new_tokens"] + second["stats"]["new_tokens"]
    counts = lossless(sd, auto)
    assert counts["mt_bench"] == (2, 2) and counts["overall"] == (5, 5)
    # rows decoded two at a time, follow-ups too, equal their batch-1 decoding turn for turn
    assert lossless(sd, decoded["sd-b1"])["overall"] == (5, 5)


def test_the_export_is_an_answer_file_speed_py_reads(decoded, tmp_path):
    (path,) = export(decoded["sd"], "specbench", tmp_path)
    answers = [json.loads(line) for line in path.read_text().splitlines()]
    assert [a["question_id"] for a in answers] == [81, 82, 161, 162, 401]
    turns = answers[0]["choices"][0]
    assert len(turns["turns"]) == len(turns["new_tokens"]) == len(turns["wall_time"]) == 2
    record = decoded["sd"][0]
    blocks = sum(t["stats"]["blocks"] for t in record["turns"])
    assert len(turns["accept_lengths"]) == blocks  # one entry per target forward
    auto = [
        json.loads(line)
        for line in export(decoded["auto"], "specbench", tmp_path / "a")[0].read_text().splitlines()
    ]
    assert set(auto[0]["choices"][0]["accept_lengths"]) == {1}


def test_the_main_score_refuses_specbench_in_one_line(decoded):
    with pytest.raises(DataError, match="diversed specbench"):
        quality("specbench", decoded["sd"])


def test_side_by_side_with_hugging_face_agrees_token_for_token(questions, tmp_path):
    """Greedy: HF generate and assisted generation are our auto, HF's assistant_ensemble_weight is our
    static, question by question (the record counts them; timing is not asserted)."""
    from diversed.jobs.bench import BenchSpec
    from diversed.jobs.peers import run_peers

    target, draft = write_tiny_pair(tmp_path / "tiny")
    spec = BenchSpec(
        str(tmp_path / "peers.json"),
        str(target),
        str(draft),
        "float32",
        data_dir=str(questions),
        max_new_tokens=8,
        num_assistant_tokens=3,
        repeats=1,
    )
    found = run_peers(spec, per_category=1, weight=0.5)
    assert found["categories"] == {"writing": 1, "translation": 1, "math_reasoning": 1}
    assert {name: v["identical"] for name, v in found["identity"].items()} == dict.fromkeys(
        found["identity"], 3
    )
    assert set(found["ratios"]["ours_static_vs_hf_ensemble"]) == {
        "writing",
        "translation",
        "math_reasoning",
        "all",
    }
