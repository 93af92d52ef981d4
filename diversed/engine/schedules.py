"""Draft-length schedules, with the semantics of Hugging Face assisted generation.

A schedule answers two questions per block: how many tokens to draft at most, and whether to
stop drafting early because the draft is unsure (the confidence criterion). After the block it
hears how many drafted tokens were accepted.

* ``constant``: N every block.
* ``heuristic``: N + 2 after a block whose drafts were all accepted, else N - 1 (floor 1); N
  persists across calls on the same decoder.
* ``heuristic_transient``: the same, reset to the configured N at each call.
* ``dynamic``: constant N with the confidence criterion on (threshold 0.4 by default).

Whenever the confidence threshold is positive, the threshold also adapts as in HF's dynamic
speculation: every drafted token is recorded with its draft probability and whether it was
accepted; once at least 6 records of both classes exist, the threshold becomes the ROC
threshold minimising FPR + 3 FNR. As in HF, the new value applies from the next call.
"""

from __future__ import annotations

import numpy as np

from diversed.methods import Schedule

DEFAULT_DYNAMIC_THRESHOLD = 0.4
MIN_ROC_RECORDS = 6


class DraftSchedule:
    """Constant draft length, with the optional confidence criterion."""

    def __init__(self, num_tokens: int, confidence_threshold: float = 0.0) -> None:
        self.initial_tokens = num_tokens
        self.num_tokens = num_tokens
        self.threshold = confidence_threshold  # persists; updated by the ROC rule
        self._call_threshold = confidence_threshold
        self._probs: list[float] = []
        self._matches: list[int] = []

    def begin(self) -> None:
        """Start a generate call: freeze this call's threshold and clear the ROC records."""
        self._call_threshold = self.threshold
        self._probs, self._matches = [], []

    def max_tokens(self) -> int:
        return self.num_tokens

    @property
    def call_threshold(self) -> float:
        """This call's confidence threshold: drafting stops after a token whose q is below it (0: off)."""
        return self._call_threshold

    def observe(self, draft_probs: list[float], num_accepted: int) -> None:
        """Record one block's outcome; ``draft_probs`` holds q(x_i) of every drafted token."""
        self._adapt_length(len(draft_probs), num_accepted)
        if self._call_threshold > 0.0:
            self._update_threshold(draft_probs, num_accepted)

    def _adapt_length(self, num_drafted: int, num_accepted: int) -> None:
        """Constant schedules keep N."""

    def _update_threshold(self, draft_probs: list[float], num_accepted: int) -> None:
        self._probs.extend(draft_probs)
        self._matches.extend([1] * num_accepted)
        if num_accepted < len(draft_probs):
            self._matches.append(0)
        del self._probs[len(self._matches) :]
        if len(self._probs) >= MIN_ROC_RECORDS and {0, 1} <= set(self._matches):
            from sklearn.metrics import roc_curve  # here, not at the top: 1 s of import for one schedule

            fpr, tpr, thresholds = roc_curve(self._matches, self._probs)
            costs = fpr + 3.0 * (1.0 - tpr)
            # sklearn's first threshold is +inf ("never accept"); a probability threshold of 1
            # has the same effect and stays a plain number.
            self.threshold = float(min(thresholds[int(np.argmin(costs))], 1.0))


class HeuristicSchedule(DraftSchedule):
    """+2 after a fully accepted block, -1 otherwise (floor 1)."""

    def __init__(self, num_tokens: int, confidence_threshold: float = 0.0, transient: bool = False) -> None:
        super().__init__(num_tokens, confidence_threshold)
        self.transient = transient

    def begin(self) -> None:
        super().begin()
        if self.transient:
            self.num_tokens = self.initial_tokens

    def _adapt_length(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:
            return
        if num_accepted == num_drafted:
            self.num_tokens += 2
        else:
            self.num_tokens = max(1, self.num_tokens - 1)


def make_schedule(
    kind: Schedule, num_tokens: int, confidence_threshold: float | None = None
) -> DraftSchedule:
    """Build a schedule; a ``None`` threshold means HF's default for that schedule."""
    if confidence_threshold is None:
        confidence_threshold = DEFAULT_DYNAMIC_THRESHOLD if kind is Schedule.DYNAMIC else 0.0
    if kind in (Schedule.HEURISTIC, Schedule.HEURISTIC_TRANSIENT):
        return HeuristicSchedule(
            num_tokens, confidence_threshold, transient=kind is Schedule.HEURISTIC_TRANSIENT
        )
    return DraftSchedule(num_tokens, confidence_threshold)
