"""What the decoding loop carries from step to step: the rows of a batch and their device state,
one block's drafts and verdict, and what a generation returns.

Host-side state (a row's tokens, schedule and counters) lives in :class:`Row`; device-side state
shared by the batch (both caches, random streams, the next feed) in :class:`Batch`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from diversed.engine.cache import RaggedCache
from diversed.engine.rules import Block
from diversed.engine.sampling import RowRandom
from diversed.engine.schedules import DraftSchedule
from diversed.engine.stats import GenerationStats


def per_row(value: int | Sequence[int] | None, default: int, count: int, name: str) -> list[int]:
    """One value for each of ``count`` prompts: the default, one value for all, or one each."""
    if value is None:
        return [default] * count
    if isinstance(value, int):
        return [value] * count
    if len(value) != count:
        raise ValueError(f"{name} has {len(value)} entries for {count} prompts")
    return list(value)


# A head maps the draft's and the target's last-layer hidden states of the drafted positions,
# [..., d_draft] and [..., d_target], to target weights w in [0, 1] of shape [...]; a head whose
# ``signals`` attribute is true (diversed.head) also takes the verifier's signals [..., 3] third.
EnsembleHead = Callable[..., torch.Tensor]


@dataclass
class Generation:
    """The generated token ids (prompt excluded), why generation ended, and its statistics."""

    token_ids: list[int]
    finish_reason: str  # "eos", "stop" or "length"
    stats: GenerationStats
    trace: dict[str, torch.Tensor] | None = None  # trace mode: per-token fields, see TRACE_FIELDS
    # method diversed: per generated token, TOKEN_STATS at its position (None for a bonus token,
    # drawn from the target alone)
    token_stats: list[tuple[float, float, float] | None] | None = None


@dataclass
class Row:
    """Host-side state of one prompt of the batch."""

    index: int  # position in the caller's list
    budget: int
    schedule: DraftSchedule
    stats: GenerationStats
    generated: list[int]
    finish: str = "length"
    trace: list[dict[str, torch.Tensor]] = field(default_factory=list)
    token_stats: list[tuple[float, float, float] | None] = field(default_factory=list)


@dataclass
class Draft:
    """One block's drafts, on the device."""

    tokens: torch.Tensor  # [B, L]
    num_drafted: torch.Tensor  # [B]
    q: torch.Tensor  # [B, L, V]
    q_logits: torch.Tensor  # [B, L, V]
    hidden: torch.Tensor | None  # [B, L, d]
    step_seconds: list[float]
    fed: int = 2  # pending columns the first draft step fed (more after plain k = 0 blocks)


@dataclass
class Verified:
    """One block's verification, on the device unless said."""

    accepted: torch.Tensor  # [B] drafts kept
    extra: torch.Tensor  # [B] correction or bonus token
    q_drafted: torch.Tensor  # [B, L] q of each drafted token (float64)
    seconds: float  # of the target forward
    trace: dict[str, torch.Tensor] | None  # trace mode: TRACE_FIELDS at each position, [B, L, ...]
    token_stats: torch.Tensor | None = None  # method diversed: TOKEN_STATS at each position, [B, L, 3]


@dataclass
class Batch:
    """The rows still decoding and their device state: both caches, each row's random stream, the
    token the next verification starts from (``last``) and the draft's pending columns."""

    rows: list[Row]
    rng: RowRandom
    target_cache: RaggedCache
    draft_cache: RaggedCache | None
    last: torch.Tensor  # [B]
    pending: torch.Tensor  # [B, 2], one column more per plain (k = 0) block since the last drafts
    pending_valid: torch.Tensor  # [B, 2] or as wide
    prefill_seconds: float

    def feed_later(self, token: torch.Tensor) -> None:
        """A plain step's token [B], kept as one more pending column for the draft's next forward."""
        self.pending = torch.cat([self.pending, token.unsqueeze(1)], dim=1)
        self.pending_valid = torch.cat(
            [self.pending_valid, torch.ones_like(self.pending_valid[:, :1])], dim=1
        )


# Per drafted position, with a learned (or hand-made) weight: the head's w, TV(p, q) and the
# entropy of the target's temperature-1 distribution, so a decode record shows where w goes.
TOKEN_STATS = ("w", "tv", "entropy")


# Per emitted token y: both last-layer hidden states at its position, p(y), q(y), v(y), and the
# verifier's signals there (TV(p, q), the entropies of both models' raw logits; head.SIGNALS).
TRACE_FIELDS = ("h_draft", "h_target", "p_y", "q_y", "mu", "tv", "entropy_p", "entropy_q")


def trace_fields(
    block: Block,
    v: torch.Tensor,
    accepted: torch.Tensor,
    extra: torch.Tensor,
    h_draft: torch.Tensor,
    h_target: torch.Tensor,
    signals: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """TRACE_FIELDS at every drafted position, for the token emitted there: the kept draft
    before the first rejection, the correction at it (positions after it are never used)."""
    width = block.tokens.shape[1]
    p = block.p[:, :width]
    steps = torch.arange(width, device=accepted.device)
    emitted = torch.where(steps < accepted.unsqueeze(1), block.tokens, extra.unsqueeze(1)).unsqueeze(2)
    return {
        "h_draft": h_draft.half(),
        "h_target": h_target[:, :width].half(),
        "p_y": p.gather(2, emitted)[..., 0],
        "q_y": block.q.gather(2, emitted)[..., 0],
        "mu": v.gather(2, emitted)[..., 0],
        "tv": signals[..., 0],
        "entropy_p": signals[..., 1],
        "entropy_q": signals[..., 2],
    }


def retire(batch: Batch, finished: list[int]) -> list[Row]:
    """Drop the rows that ended from the batch, both caches and the random streams."""
    if not finished:
        return []
    keep = [b for b in range(len(batch.rows)) if b not in finished]
    retired = [batch.rows[b] for b in finished]
    batch.rows = [batch.rows[b] for b in keep]
    if batch.rows:
        index = torch.tensor(keep, device=batch.last.device)
        for cache in (batch.target_cache, batch.draft_cache):
            if cache is not None:
                cache.select(index)
        batch.rng.select(index)
        batch.last, batch.pending = batch.last[index], batch.pending[index]
        batch.pending_valid = batch.pending_valid[index]
    return retired
