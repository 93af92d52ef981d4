"""Each score equals a direct call of the library the field uses."""

from __future__ import annotations

import pytest
import sacrebleu
from rouge_score import rouge_scorer

from diversed.evaluation.metrics import accuracy, bleu, pass_at_1, rouge

PREDICTIONS = ["the cat sat on the mat", "a quick brown fox jumped", "rain is expected tomorrow in the north"]
REFERENCES = ["a cat was sitting on the mat", "the quick brown fox jumps", "tomorrow rain in northern areas"]


def test_rouge_matches_rouge_score():
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)
    direct = [scorer.score(r, p) for p, r in zip(PREDICTIONS, REFERENCES, strict=True)]
    ours = rouge(PREDICTIONS, REFERENCES)
    for key in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        assert ours[key] == pytest.approx(100 * sum(d[key].fmeasure for d in direct) / 3)
    assert 0 < ours["rouge2"] < ours["rouge1"] <= 100


def test_bleu_matches_sacrebleu():
    ours = bleu(PREDICTIONS, REFERENCES)
    assert ours["bleu"] == pytest.approx(sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES]).score)
    sentence = [
        sacrebleu.sentence_bleu(p, [r], tokenize="13a", lowercase=True).score
        for p, r in zip(PREDICTIONS, REFERENCES, strict=True)
    ]
    assert ours["sentence_bleu"] == pytest.approx(sum(sentence) / 3)
    assert bleu(["Guten Tag"], ["guten tag"])["sentence_bleu"] == pytest.approx(100.0)  # lower-cased


def test_accuracy_and_pass_at_1_are_percentages():
    assert accuracy(["3", "4", "5"], ["3", "4", "6"])["accuracy"] == pytest.approx(200 / 3)
    assert pass_at_1([True, False, False, True])["pass@1"] == 50.0
