"""The decoding stack, loaded in one place: tokenizer, target and draft, ensemble head, end tokens.

``generate``, dataset decoding and trace collection all need the same sequence (the target's
tokenizer, the pair checked to share one vocabulary, a head checked against both models' hidden
sizes, the end-of-sequence ids of tokenizer and generation config), and then a
:class:`~diversed.engine.loop.Decoder` per setting over it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import diversed.backends.cuda  # noqa: F401  (registers the engine's graphs step)
from diversed.config import DecodeConfig
from diversed.engine.loop import Decoder
from diversed.methods import Schedule

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from diversed.head import EnsembleHead


@dataclass
class Stack:
    """What a decode job holds for its whole life."""

    tokenizer: PreTrainedTokenizerBase
    target: PreTrainedModel
    draft: PreTrainedModel | None
    head: EnsembleHead | None
    eos_ids: set[int]
    names: dict[str, Any] = field(default_factory=dict)  # as loaded: the key of its cost profile
    profiles: dict[int, Any] = field(default_factory=dict)  # CostProfile by the most k it covers

    def cost_profile(self, max_k: int) -> Any:
        """This machine's cost profile of the pair (``--num-assistant-tokens auto``): stored, or
        measured once now (:mod:`diversed.backends.cost_profile`)."""
        if max_k not in self.profiles:
            from diversed.backends.cost_profile import load_or_measure

            self.profiles[max_k] = load_or_measure(self.target, self.draft, max_k, self.names)[0]
        return self.profiles[max_k]

    def decoder(
        self,
        config: DecodeConfig,
        stop_strings: Iterable[str] = (),
        head: EnsembleHead | None = None,
        **kwargs: Any,
    ) -> Decoder:
        """A decoder for one setting over this stack (``kwargs``: ``traces``, ``prefix``, ``step``); ``head``
        replaces the stack's own (the on-policy check decodes under two heads on one stack)."""
        if config.schedule is Schedule.COST:
            kwargs.setdefault("profile", self.cost_profile(config.num_assistant_tokens))
        return Decoder(
            self.target,
            self.draft if config.method.speculative else None,
            config,
            head=head if head is not None else self.head,
            eos_token_ids=self.eos_ids,
            stop_strings=stop_strings,
            decode_text=self.tokenizer.decode,
            **kwargs,
        )


def load_stack(
    target: str,
    draft: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    quantize: str = "none",
    attn_implementation: str | None = None,
    head: str | None = None,
    draft_transform: str | None = None,
) -> Stack:
    """Load the stack for a target (and draft, and head) by name; errors name what is wrong.

    ``head`` is a folder written by ``train-head`` or a hand-made rule of :mod:`diversed.loading.control`
    (``oracle:digits``); ``draft_transform`` damages the draft for a positive control.
    """
    from diversed.head import load_head_for
    from diversed.loading.control import ORACLES, DigitOracle, apply_draft_transform
    from diversed.loading.models import eos_ids, load_pair, load_tokenizer

    tokenizer = load_tokenizer(target)
    target_model, draft_model = load_pair(
        target, draft, dtype, device, attn_implementation=attn_implementation, quantize=quantize
    )
    if draft_transform is not None:
        if draft_model is None:
            raise ValueError("a draft transform needs a draft model")
        apply_draft_transform(draft_model, draft_transform, tokenizer)
    loaded_head = None
    if head in ORACLES:
        loaded_head = DigitOracle(target_model, tokenizer)
    elif head is not None:
        if draft_model is None:
            raise ValueError("an ensemble head needs a draft model")
        loaded_head = load_head_for(head, target_model, draft_model)
    names = {"target": target, "draft": draft, "dtype": str(target_model.dtype), "quantize": quantize}
    names.update(device=str(target_model.device), draft_transform=draft_transform)
    return Stack(tokenizer, target_model, draft_model, loaded_head, eos_ids(tokenizer, target_model), names)
