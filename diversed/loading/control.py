"""A positive control for the ensemble head: a setting where the right per-token weight is known.

``digit_swap`` damages the draft on purpose: the logits of the ten digit tokens are permuted in
pairs (0<->1, 2<->3, ...), the target is untouched. On GSM8K every number the draft proposes is then
wrong, so any static weight w pays twice: protecting the digits needs w near 1, which costs
acceptance on every other token. A per-token weight that trusts the draft except where the next
token is a digit keeps the target's accuracy at nearly the acceptance of w = 0. :class:`DigitOracle`
is that rule written by hand (w = 1 where the target's most likely next token is a digit, else 0):
the reference for how much a per-token weight can win, and what a trained head should approach.

Study options only, never defaults: a transform is named in a study's config (``models.draft_transform``)
or on the command line (``--draft-transform``), and is part of every record's settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from diversed.config import DRAFT_TRANSFORMS

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

ORACLES = ("oracle:digits",)


def digit_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids of the tokens "0".."9", in that order; an error when a digit is not one token (the
    control needs a tokenizer that splits numbers into digits, as Qwen's and Llama-3's do)."""
    ids = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    unknown = tokenizer.unk_token_id
    if any(i is None or (unknown is not None and i == unknown) for i in ids):
        raise ValueError("the digit-swap control needs a tokenizer with one token per digit 0-9")
    return ids


def digit_swap_permutation(vocab: int, digits: list[int]) -> torch.Tensor:
    """Column order that swaps the logits of digits 0<->1, 2<->3, 4<->5, 6<->7, 8<->9."""
    order = torch.arange(vocab)
    for a, b in zip(digits[0::2], digits[1::2], strict=True):
        order[a], order[b] = b, a
    return order


def apply_draft_transform(draft: PreTrainedModel, name: str, tokenizer: PreTrainedTokenizerBase) -> None:
    """Change the draft's output logits as ``name`` says, with a forward hook on its output layer
    (so every path that reads the draft's logits sees it; hidden states are untouched)."""
    if name not in DRAFT_TRANSFORMS:
        raise ValueError(f"unknown draft transform {name!r}; choose one of: {', '.join(DRAFT_TRANSFORMS)}")
    head = draft.get_output_embeddings()
    vocab = draft.config.vocab_size
    order = digit_swap_permutation(vocab, digit_ids(tokenizer)).to(draft.device)

    def swap(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        if output.shape[-1] != vocab:  # an output layer padded beyond the vocabulary
            return torch.cat([output[..., :vocab][..., order], output[..., vocab:]], dim=-1)
        return output[..., order]

    head.register_forward_hook(swap)


class DigitOracle:
    """A hand-made head: w = 1 where the target's most likely next token is a digit, else 0.

    It reads the target's hidden state at each drafted position, where the target's output layer
    gives the distribution the drafted token is verified against. A plain callable, not a module:
    it uses the target's own output layer (packed, on the target's device) and trains nothing.
    """

    def __init__(self, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        self.output = target.get_output_embeddings()
        self.digits = torch.tensor(digit_ids(tokenizer), device=target.device)

    def __call__(self, h_draft: torch.Tensor, h_target: torch.Tensor) -> torch.Tensor:
        best = self.output(h_target).argmax(-1)
        return torch.isin(best, self.digits).float()
