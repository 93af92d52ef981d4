"""Draft-length schedules, with the semantics of Hugging Face assisted generation.

A schedule answers two questions per block: how many tokens to draft at most, and whether to
stop drafting early because the draft is unsure (the confidence criterion). After the block it
hears how many drafted tokens were accepted.

* ``constant``: N every block.
* ``heuristic``: N + 2 after a block whose drafts were all accepted, else N - 1 (floor 1); N
  persists across calls on the same decoder.
* ``heuristic_transient``: the same, reset to the configured N at each call.
* ``dynamic``: constant N with the confidence criterion on (threshold 0.4 by default).
* ``cost`` (ours, ``--num-assistant-tokens auto``): :class:`CostChooser` picks k in 0..N for the
  whole batch before each block, from a cost profile measured once per machine and the batch's
  acceptance so far; k = 0 is a plain target step, chosen where the profile says drafting would
  not pay (large batches, a draft that agrees rarely).

Whenever the confidence threshold is positive, the threshold also adapts as in HF's dynamic
speculation: every drafted token is recorded with its draft probability and whether it was
accepted; once at least 6 records of both classes exist, the threshold becomes the ROC
threshold minimising FPR + 3 FNR. As in HF, the new value applies from the next call.
"""

from __future__ import annotations

import numpy as np

from diversed.methods import Schedule

PROBE_EVERY = 8  # after this many plain blocks in a row, one block drafts k = 1 to re-measure acceptance

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


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one block emits when each draft is kept with probability ``alpha`` in turn (Leviathan
    et al.): 1 + alpha + ... + alpha^k; a plain step (k = 0) emits one."""
    return float(k + 1) if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


class CostChooser:
    """k for each block, for the whole batch: the k in 0..``max_k`` with the most tokens per second,
    E(k) / (t(B, k + 1) + k d(B)), where t(B, n) is the target's forward over n tokens per row and
    d(B) a draft step at the batch's B rows in flight (``costs(rows) -> (t, d)``, from a measured
    profile), and E(k) uses the per-position acceptance so far, alpha = kept / (kept + rejected)
    with one kept and one rejected added (a draft never seen starts at 1/2). A chosen k = 0 learns
    nothing, so every ``PROBE_EVERY``-th plain block in a row drafts one token instead. It reads only
    counts the decoding made, so for a fixed profile the choices, and the outputs, are determined."""

    def __init__(self, costs, max_k: int) -> None:
        self.costs, self.max_k = costs, max_k
        self.begin()

    def begin(self) -> None:
        self.kept, self.rejected, self.plain = 0, 0, 0

    @property
    def alpha(self) -> float:
        return (self.kept + 1) / (self.kept + self.rejected + 2)

    def choose(self, rows: int) -> int:
        target, draft = self.costs(rows)
        rate = [expected_tokens(self.alpha, k) / (target[k] + k * draft) for k in range(self.max_k + 1)]
        best = max(range(self.max_k + 1), key=rate.__getitem__)
        self.plain = self.plain + 1 if best == 0 else 0
        if self.plain >= PROBE_EVERY:
            self.plain = 0
            return 1
        return best

    def observe(self, drafted: int, kept: int) -> None:
        """One row's block: its drafts kept in a row and whether the next was rejected."""
        self.kept += kept
        self.rejected += int(kept < drafted)


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
