"""Task scores, each computed by the library the field uses (no hand-written metric).

Quality metrics are percentages: ROUGE F-measures x 100 (``rouge-score``, Porter stemmer on),
BLEU from ``sacrebleu`` (corpus BLEU, plus the paper's average of sentence BLEU with 13a
tokenisation, lower-cased), exact-match accuracy x 100, and pass@1 x 100 from running each
program with its tests in :mod:`diversed.sandbox`.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean

from diversed.data import Example, get_task

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")
# The one figure of each task metric that tables, plots and intervals report as its quality.
QUALITY = {"accuracy": "accuracy", "rouge": "rouge2", "bleu": "bleu", "pass@1": "pass@1"}


def rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE F-measure x 100 over examples."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)
    scores = [scorer.score(ref, pred) for pred, ref in zip(predictions, references, strict=True)]
    return {key: 100 * fmean(s[key].fmeasure for s in scores) for key in ROUGE_KEYS}


def rouge2_per_example(prediction: str, reference: str) -> float:
    """ROUGE-2 F in [0, 1] of one example: the summarisation reward of head training."""
    from rouge_score import rouge_scorer

    return (
        rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True).score(reference, prediction)["rouge2"].fmeasure
    )


def bleu(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Corpus BLEU and the paper's mean sentence BLEU (13a, lower-cased), both 0-100."""
    import sacrebleu

    corpus = sacrebleu.corpus_bleu(list(predictions), [list(references)]).score
    sentence = fmean(
        sacrebleu.sentence_bleu(p, [r], tokenize="13a", lowercase=True).score
        for p, r in zip(predictions, references, strict=True)
    )
    return {"bleu": corpus, "sentence_bleu": sentence}


def accuracy(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Exact match x 100 of extracted answers."""
    return {"accuracy": 100 * fmean(p == r for p, r in zip(predictions, references, strict=True))}


def pass_at_1(passed: Sequence[bool]) -> dict[str, float]:
    """pass@1 x 100 with one sample per problem."""
    return {"pass@1": 100 * fmean(passed)}


def task_reward(
    dataset: str, prediction: str, example: Example, partial_credit: bool = False, sandbox: str = "isolated"
) -> float:
    """The paper's sequence reward: exact match, ROUGE-2, sentence BLEU / 100, or tests passed.

    ``partial_credit`` (code tasks whose tests are separate asserts: MBPP) gives the share of the
    asserts that pass, each run alone in the sandbox, instead of 1 only when all do: a documented
    study option, since a sparse 0/1 reward gives a group of rollouts that all fail nothing to
    compare. Tasks without separable tests keep pass/fail. Code runs in ``sandbox`` mode
    (:data:`diversed.sandbox.MODES`): isolated, or limits alone where the user opted in."""
    task = get_task(dataset)
    if task.metric == "accuracy":
        return float(prediction == example.reference)
    if task.metric == "rouge":
        return rouge2_per_example(prediction, example.reference)
    if task.metric == "bleu":
        import sacrebleu

        return (
            sacrebleu.sentence_bleu(prediction, [example.reference], tokenize="13a", lowercase=True).score
            / 100
        )
    from diversed.sandbox import parse_mode, run_program

    programs = getattr(task, "partial_programs", None)
    strict = parse_mode(sandbox) == "isolated"
    if partial_credit and programs is not None:
        runs = [run_program(source, strict=strict).passed for source in programs(prediction, example.record)]
        return sum(runs) / len(runs) if runs else 0.0
    return float(run_program(task.program(prediction, example.record), strict=strict).passed)
