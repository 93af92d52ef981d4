"""A shared prompt prefix prefilled once per model changes no output (fp32, tiny random models).

For every method, greedy and sampling, at batch 1 and batched, rows that start with a shared
prefix and then diverge (suffixes of different lengths, one row that is the prefix alone, one that
shares only part of it, rows that repeat a whole prompt) must give exactly the tokens, finish
reasons and counters of decoding without the prefix; and the prefix must be forwarded once per
model for a whole job, whatever the number of batches.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from test_batched import METHODS, summary

from diversed import DecodeConfig, Decoder
from diversed.cli import main
from diversed.data import TASKS
from diversed.data.tasks import CNNDM
from diversed.engine.prefix import SharedPrefix
from diversed.loading.models import prompt_ids, shared_prefix
from diversed.loading.tiny import write_tiny_pair

PREFIX = "Question: 2+2?\nAnswer: 4\n\nQuestion: 3*3?\nAnswer: 9\n\nQuestion: "
SUFFIXES = ["7-5?\nAnswer:", "a much longer question, 12*12?\nAnswer:", "", "8/2?\nAnswer:"]
BUDGETS = [20, 16, 1, 20]  # the third row ends in its first block
SEEDS = [3, 4, 5, 6]


def make_decoder(pair, head, settings, temperature, prefix=None, eos=(), schedule="constant") -> Decoder:
    config = DecodeConfig.from_dict(
        {**settings, "temperature": temperature, "num_assistant_tokens": 4, "schedule": schedule}
    )
    draft = None if settings["method"] == "auto" else pair[1]
    use_head = head if settings["method"] == "diversed" else None
    return Decoder(pair[0], draft, config, head=use_head, eos_token_ids=eos, prefix=prefix)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("settings", METHODS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_shared_prefix_changes_no_output(pair, tokenizer, varied_head, settings, temperature):
    prefix = SharedPrefix(tokenizer(PREFIX).input_ids)
    prompts = [tokenizer(PREFIX + s).input_ids for s in SUFFIXES]
    prompts.append(tokenizer(PREFIX[:20] + "unrelated").input_ids)  # shares only part of the prefix
    prompts.append(prompts[0])  # a whole prompt twice, as group rollouts have
    budgets, seeds = [*BUDGETS, 12, 20], [*SEEDS, 7, 8]
    plain = make_decoder(pair, varied_head, settings, temperature).generate_batch(prompts, budgets, seeds)
    produced = [t for g in plain for t in g.token_ids]
    eos = [max(set(produced), key=produced.count)]  # an end token some rows do produce
    without = make_decoder(pair, varied_head, settings, temperature, eos=eos).generate_batch(
        prompts, budgets, seeds
    )
    assert any(g.finish_reason == "eos" for g in without)
    shared = make_decoder(pair, varied_head, settings, temperature, prefix, eos)
    batched = shared.generate_batch(prompts, budgets, seeds)
    singles = [shared.generate(p, b, s) for p, b, s in zip(prompts, budgets, seeds, strict=True)]
    assert [summary(g) for g in batched] == [summary(g) for g in without]
    assert [summary(g) for g in singles] == [summary(g) for g in without]
    assert batched[0].stats.prefix_tokens == len(prefix)
    assert batched[4].stats.prefix_tokens == prefix.common_length(prompts[4][:-1]) < len(prefix)


def test_heuristic_schedule_with_a_prefix(pair, tokenizer):
    prefix = SharedPrefix(tokenizer(PREFIX).input_ids)
    prompts = [tokenizer(PREFIX + s).input_ids for s in SUFFIXES]
    settings = {"method": "sd"}
    without = make_decoder(pair, None, settings, 1.0, schedule="heuristic").generate_batch(prompts, 20, SEEDS)
    shared = make_decoder(pair, None, settings, 1.0, prefix, schedule="heuristic")
    assert [summary(g) for g in shared.generate_batch(prompts, 20, SEEDS)] == [summary(g) for g in without]


class ForwardCounter:
    """Counts the forwards of a model and the tokens they were given."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls, self.tokens = 0, 0
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        self.calls += 1
        self.tokens += kwargs["input_ids"].shape[1]


def test_prefix_is_forwarded_once_per_model_for_a_whole_job(pair, tokenizer):
    target, draft = pair
    prefix = SharedPrefix(tokenizer(PREFIX).input_ids)
    prompts = [tokenizer(PREFIX + s).input_ids for s in SUFFIXES]
    decoder = make_decoder(pair, None, {"method": "sd"}, 0.0, prefix)
    counters = {"target": ForwardCounter(target), "draft": ForwardCounter(draft)}
    batches = [prompts[:2], prompts[2:], [prompts[0]] * 4]  # the last: one whole prompt four times
    try:
        for batch in batches:
            decoder.generate_batch(batch, 1)  # budget 1: no drafting, one verify forward per batch
    finally:
        for counter in counters.values():
            counter.handle.remove()
    # each distinct row in a batch forwards only its tokens after the prefix (the third prompt is
    # the prefix itself: nothing); the prefix is forwarded once per model for all three batches
    suffixes = [len(p) - 1 - len(prefix) for batch in batches for p in dict.fromkeys(map(tuple, batch))]
    suffixes = [n for n in suffixes if n > 0]
    assert len(suffixes) == 4
    prefill_calls, prefill_tokens = 1 + len(suffixes), len(prefix) + sum(suffixes)
    assert (counters["draft"].calls, counters["draft"].tokens) == (prefill_calls, prefill_tokens)
    verify = len(batches)
    assert (counters["target"].calls, counters["target"].tokens) == (
        prefill_calls + verify,
        prefill_tokens + verify,
    )
    # --prefix-cache off: nothing shared, every row forwarded whole (the four equal rows too)
    counter = ForwardCounter(target)
    try:
        make_decoder(pair, None, {"method": "sd"}, 0.0).generate_batch([prompts[0]] * 4, 1)
    finally:
        counter.handle.remove()
    assert (counter.calls, counter.tokens) == (4 + 1, 4 * (len(prompts[0]) - 1) + 1)
    per_token = 2 * target.config.num_key_value_heads * (target.config.hidden_size // 4) * 4  # fp32 K and V
    assert prefix.nbytes(target) == len(prefix) * per_token * target.config.num_hidden_layers


def test_every_task_prompt_starts_with_its_prefix():
    record = {
        "question": "Q?",
        "answer": "a <<1+1=2>>2\n#### 2",
        "article": "Art.",
        "highlights": "H.",
        "id": "x",
        "document": "Doc.",
        "summary": "S.",
        "translation": {"en": "Hello.", "de": "Hallo."},
        "text": "Add.",
        "test_list": ["assert f() == 1"],
        "prompt": "def f():\n",
        "turns": ["Hi?", "And?"],
        "category": "writing",
        "question_id": 81,
    }
    for task in TASKS.values():
        shots = [record, record, record, record] if task.fewshot_split else []
        prompt = task.prompt(record, shots)
        assert prompt.startswith(task.prefix(shots)) and prompt == task.prefix(shots) + task.query(record)
    assert len(TASKS["gsm8k"].prefix([record] * 4)) > len(TASKS["gsm8k"].query(record))


def test_shared_prefix_keeps_only_the_tokens_prompts_share(tokenizer):
    prompts = [tokenizer(PREFIX + s).input_ids for s in SUFFIXES[:2]]
    prefix = shared_prefix(tokenizer, PREFIX + "7-", False, prompts)  # a prefix longer than one prompt shares
    assert prefix is not None and list(prefix.ids) == tokenizer(PREFIX + "7-").input_ids
    assert len(shared_prefix(tokenizer, "", False, prompts)) == 0  # HumanEval: whole prompts still shared
    assert len(shared_prefix(tokenizer, "Zzz", False, prompts)) == 0
    chat = shared_prefix(tokenizer, PREFIX, True, [prompt_ids(tokenizer, PREFIX + "1?", True)])
    assert chat is not None and len(chat) > len(tokenizer(PREFIX).input_ids)  # the template's start too


@pytest.fixture(scope="module")
def cnndm_job(tmp_path_factory):
    """A tiny pair and a CNN/DM folder whose one-shot example makes a long shared prefix."""
    root = tmp_path_factory.mktemp("prefix-job")
    shot = {
        "id": CNNDM.SHOT_ID,
        "article": "Daniel Radcliffe turns 18 and gains access to a fortune.",
        "highlights": "Radcliffe is 18.",
    }
    records = [
        {"id": f"{i:040d}", "article": f"Story {i} " * (1 + i % 3), "highlights": f"S{i}."} for i in range(6)
    ]
    (root / "data" / "cnndm").mkdir(parents=True)
    for split, rows in (("train", [shot, *records]), ("test", records)):
        (root / "data" / "cnndm" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root, write_tiny_pair(root / "models")


def test_decode_job_with_and_without_prefix_cache_writes_the_same_records(cnndm_job):
    root, (target, draft) = cnndm_job
    outputs = {}
    for mode in ("on", "off"):
        out = root / f"decode-{mode}.jsonl"
        argv = [
            *("decode", "--dataset", "cnndm", "--n-examples", "5", "--method", "sd", "--temperature", "1"),
            *("--target", str(target), "--draft", str(draft), "--max-new-tokens", "10", "--batch-size", "2"),
            *("--data-dir", str(root / "data"), "--no-hub", "--quiet", "--dtype", "float32"),
            *("--prefix-cache", mode, "--out", str(out)),
        ]
        assert main(argv) == 0
        outputs[mode] = [json.loads(line) for line in out.read_text().splitlines()]
    for on, off in zip(outputs["on"], outputs["off"], strict=True):
        assert (on["id"], on["token_ids"], on["completion"]) == (
            off["id"],
            off["token_ids"],
            off["completion"],
        )
        assert on["prefix_cache"] is True and off["prefix_cache"] is False
        assert on["stats"]["prefix_tokens"] > 40 and off["stats"]["prefix_tokens"] == 0


def test_group_rollouts_with_and_without_prefix_cache_store_the_same_traces(cnndm_job):
    root, (target, draft) = cnndm_job
    folders = {}
    for mode in ("on", "off"):
        folders[mode] = root / f"traces-{mode}"
        argv = [
            *("collect-traces", "--dataset", "cnndm", "--n-examples", "2", "--max-new-tokens", "8"),
            *(
                "--target",
                str(target),
                "--draft",
                str(draft),
                "--behaviour-weights",
                "0.5",
                "--rollouts",
                "3",
            ),
            *("--batch-size", "3", "--data-dir", str(root / "data"), "--no-hub", "--quiet"),
            *("--prefix-cache", mode, "--out", str(folders[mode]), "--dtype", "float32"),
        ]
        assert main(argv) == 0
    manifests = {m: json.loads((f / "manifest.json").read_text()) for m, f in folders.items()}
    assert manifests["on"]["sequences"] == manifests["off"]["sequences"]
    ids = [s["id"] for s in manifests["on"]["sequences"]]
    assert len(ids) == 6 and ids[0].endswith("@w0.5#0") and ids[2].endswith("@w0.5#2")
    assert len({s["example_id"] for s in manifests["on"]["sequences"]}) == 2
    assert manifests["on"]["settings"]["rollouts"] == 3
    for sequence in manifests["on"]["sequences"]:
        on = load_file(str(folders["on"] / f"{sequence['file']}.safetensors"))
        off = load_file(str(folders["off"] / f"{sequence['file']}.safetensors"))
        # equal up to fp32 rounding: the prefix's KV came from a forward of another length.
        # Probabilities agree to 2e-7; the hidden states (the head's inputs, summed over more
        # terms) to 1.5e-5 on torch 2.6, whose kernels sum in another order (make test-compat).
        for k in on:
            bound = 5e-5 if k.startswith("h_") else 1e-5
            assert torch.allclose(on[k].float(), off[k].float(), rtol=0, atol=bound), k
