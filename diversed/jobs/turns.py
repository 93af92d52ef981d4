"""The turns of a chat benchmark's conversations (Spec-Bench's MT-bench questions have two).

A follow-up is asked after the model's own answer so far, in the chat template, as Spec-Bench's
``evaluation/eval.py`` builds it; each turn is timed on its own, as Spec-Bench's answer files
record ``wall_time`` per turn.
"""

from __future__ import annotations

import time
from typing import Any

from diversed.data import Example


def answer_turns(
    run: Any,
    decoder: Any,
    batch: list[tuple[int, Example]],
    results: list[Any],
    seeds: list[int],
    seconds: float,
) -> dict[int, list[dict[str, Any]]]:
    """Every turn of a chat benchmark's conversations (``run.task.chat``), by example index: the first
    (``results``, decoded in ``seconds``), then each follow-up asked after the model's own answers so
    far, the rows that have it decoded together. Each turn: its text, token ids, counters and wall
    seconds (the batch's, as Spec-Bench times a question at batch 1). A follow-up's seed is its
    row's plus a million per turn, so no two turns of a job share one. Empty for other tasks."""
    from diversed.loading.models import conversation_ids

    if not run.task.chat:
        return {}
    turns = {index: [_turn(run, result, seconds)] for (index, _), result in zip(batch, results, strict=True)}
    seed_of = {index: seed for (index, _), seed in zip(batch, seeds, strict=True)}
    for number in range(1, 1 + max(len(example.followups) for _, example in batch)):
        rows = [(index, example) for index, example in batch if len(example.followups) >= number]
        if not rows:
            continue
        prompts = [
            conversation_ids(
                run.stack.tokenizer,
                [example.prompt, *example.followups[:number]],
                [t["completion"] for t in turns[index]],
            )
            for index, example in rows
        ]
        start = time.perf_counter()
        found = decoder.generate_batch(prompts, seeds=[seed_of[i] + 1_000_000 * number for i, _ in rows])
        took = time.perf_counter() - start
        for (index, _), result in zip(rows, found, strict=True):
            turns[index].append(_turn(run, result, took))
    return turns


def _turn(run: Any, result: Any, seconds: float) -> dict[str, Any]:
    """One turn as a record keeps it: the answer as the next turn's history holds it (special tokens
    dropped, stripped, as Spec-Bench's ``eval.py``), its tokens, counters and wall seconds."""
    return {
        "completion": run.decode_text(result.token_ids).strip(),
        "token_ids": result.token_ids,
        "stats": result.stats,
        "seconds": seconds,
    }
