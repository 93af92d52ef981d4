"""Counters and timings of one generation, with vLLM's definitions of the derived rates."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GenerationStats:
    """What one ``generate`` call did.

    ``target_forwards`` and ``draft_forwards`` count decode-phase forwards (prefill excluded);
    a block is one target verification forward, whether or not anything was drafted for it.
    """

    new_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    blocks: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    accepted_histogram: list[int] = field(default_factory=list)  # [k] = blocks that kept k drafts
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    draft_seconds: float = 0.0  # inside decode: time in draft forwards
    target_seconds: float = 0.0  # inside decode: time in target (verification) forwards
    batch_size: int = 1  # prompts decoded together; times are the batch's wall times
    prefix_tokens: int = 0  # prompt tokens taken from a shared prefix's KV instead of prefilled anew

    def record_block(self, num_drafted: int, num_accepted: int) -> None:
        self.blocks += 1
        self.drafted += num_drafted
        self.accepted += num_accepted
        if len(self.accepted_histogram) <= num_accepted:
            self.accepted_histogram.extend([0] * (num_accepted + 1 - len(self.accepted_histogram)))
        self.accepted_histogram[num_accepted] += 1

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted (None when nothing was drafted, e.g. ``auto``)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        """(accepted + blocks) / blocks: tokens produced per target forward."""
        return (self.accepted + self.blocks) / self.blocks if self.blocks else None

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "new_tokens": self.new_tokens,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "blocks": self.blocks,
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            "accepted_histogram": list(self.accepted_histogram),
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
            "batch_size": self.batch_size,
            "prefix_tokens": self.prefix_tokens,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GenerationStats:
        """Rebuild from :meth:`to_dict` output (derived rates are recomputed, not read)."""
        return cls(**{k: values[k] for k in cls.__dataclass_fields__ if k in values})

    @classmethod
    def total(cls, runs: Iterable[GenerationStats]) -> GenerationStats:
        """Sum counters and times over several generations (rates are then pooled, not averaged)."""
        out = cls()
        for s in runs:
            out.new_tokens += s.new_tokens
            out.drafted += s.drafted
            out.accepted += s.accepted
            out.blocks += s.blocks
            out.target_forwards += s.target_forwards
            out.draft_forwards += s.draft_forwards
            out.prefill_seconds += s.prefill_seconds
            out.decode_seconds += s.decode_seconds
            out.draft_seconds += s.draft_seconds
            out.target_seconds += s.target_seconds
            out.prefix_tokens += s.prefix_tokens
            out.batch_size = max(out.batch_size, s.batch_size)
            for k, count in enumerate(s.accepted_histogram):
                if len(out.accepted_histogram) <= k:
                    out.accepted_histogram.append(0)
                out.accepted_histogram[k] += count
        return out

    def summary(self) -> str:
        """One line in gpt-fast's spirit: speed first, then acceptance."""
        line = f"{self.new_tokens} tokens in {self.seconds:.2f} s ({self.tokens_per_second:.2f} tok/s)"
        if self.drafted:
            line += (
                f" | acceptance {self.acceptance_rate:.1%} ({self.accepted}/{self.drafted})"
                f" | mean accepted length {self.mean_accepted_length:.2f}"
                f" | accepted per block {self.accepted_histogram}"
            )
        return line


def leviathan_speedup(alpha: float, k: int, c: float, verify_cost: float) -> float:
    """Leviathan et al.'s expected speed-up: tokens per block over the block's cost in target steps.

    E[tokens per block] = (1 - alpha^(k+1)) / (1 - alpha) for i.i.d. acceptance alpha; the block
    costs k draft steps (c each) and one verification forward (``verify_cost`` target steps).
    """
    expected = k + 1 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return expected / (k * c + verify_cost)
