"""The decoding loop: autoregressive and speculative, on stock transformers models.

One speculative block (Leviathan et al. 2023, Alg. 1):

1. the draft proposes L <= N tokens, each drawn from its processed distribution q, which is kept;
2. ONE target forward over [last token, x_1..x_L] gives p for the L drafted positions plus one;
3. the method's rule keeps a prefix x_1..x_n and supplies one more token (a correction, or a bonus
   token from the target when all L were kept), so every block emits n + 1 tokens;
4. both KV caches are cropped back to what was kept.

Cache invariant: the target's cache always holds every token but the last one, so the next
forward starts with that last token. The draft's cache may lag behind by up to two tokens (the
last drafted token is never fed to the draft, and neither is the correction); they are fed in
the draft's first forward of the next block instead of in an extra forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from diversed.config import DecodeConfig
from diversed.methods import Method
from diversed.sampling import Sampling, draw, probabilities
from diversed.schedules import make_schedule
from diversed.stats import GenerationStats
from diversed.verify import Block, make_rule, verify

# A head maps the draft's and the target's last-layer hidden states of the L drafted positions,
# [L, d_draft] and [L, d_target], to L target weights w in [0, 1].
EnsembleHead = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Generation:
    """The generated token ids (prompt excluded), why generation ended, and its statistics."""

    token_ids: list[int]
    finish_reason: str  # "eos", "stop" or "length"
    stats: GenerationStats


def _forward(
    model: PreTrainedModel, ids: list[int], cache: DynamicCache, hidden: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits [k, V] (and last-layer hidden states [k, d]) for k new tokens appended to ``cache``."""
    device = model.device
    out = model(
        input_ids=torch.tensor([ids], device=device),
        cache=cache,
        use_cache=True,
        output_hidden_states=hidden,
    )
    states = out.hidden_states[-1][0].float().cpu() if hidden else None
    return out.logits[0].float().cpu(), states


def _prefill(model: PreTrainedModel, prompt: list[int]) -> DynamicCache:
    """A cache holding every prompt token but the last."""
    cache = DynamicCache(config=model.config)
    if len(prompt) > 1:
        model(
            input_ids=torch.tensor([prompt[:-1]], device=model.device),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    return cache


def _crop(cache: DynamicCache, keep: int) -> None:
    extra = cache.get_seq_length() - keep
    if extra > 0:
        cache.crop(-extra)


class Decoder:
    """Generates with a target model and, for speculative methods, a draft model.

    The decoder owns the draft-length schedule, so a ``heuristic`` schedule carries its draft
    length from one ``generate`` call to the next, as in Hugging Face.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | None,
        config: DecodeConfig,
        head: EnsembleHead | None = None,
        eos_token_ids: Iterable[int] = (),
        stop_strings: Iterable[str] = (),
        decode_text: Callable[[list[int]], str] | None = None,
    ) -> None:
        if config.method.speculative and draft is None:
            raise ValueError(f"method {config.method.value!r} needs a draft model")
        if config.method is Method.DIVERSED and head is None:
            raise ValueError("method 'diversed' needs an ensemble head")
        self.target, self.draft, self.config, self.head = target, draft, config, head
        self.sampling = Sampling(config.temperature, config.top_k, config.top_p)
        self.rule = make_rule(config)
        self.schedule = make_schedule(
            config.schedule, config.num_assistant_tokens, config.confidence_threshold
        )
        self.eos_token_ids = set(eos_token_ids)
        self.stop_strings = [s for s in stop_strings if s]
        if self.stop_strings and decode_text is None:
            raise ValueError("stop strings need a decode_text function (a tokenizer)")
        self.decode_text = decode_text

    @torch.inference_mode()
    def generate(
        self, prompt_ids: list[int], max_new_tokens: int | None = None, seed: int | None = None
    ) -> Generation:
        """Continue ``prompt_ids`` by at most ``max_new_tokens`` tokens."""
        if not prompt_ids:
            raise ValueError("the prompt must hold at least one token")
        budget = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        generator = torch.Generator().manual_seed(self.config.seed if seed is None else seed)
        stats = GenerationStats()
        start = time.perf_counter()
        target_cache = _prefill(self.target, prompt_ids)
        draft_cache = _prefill(self.draft, prompt_ids) if self.config.method.speculative else None
        stats.prefill_seconds = time.perf_counter() - start

        tokens = list(prompt_ids)
        generated: list[int] = []
        draft_len = len(prompt_ids) - 1  # tokens held by the draft's cache
        self.schedule.begin()
        finish = "length"
        start = time.perf_counter()
        while len(generated) < budget:
            remaining = budget - len(generated)
            if draft_cache is None:
                drafted, q_rows, q_logits, h_draft = [], None, None, None
            else:
                drafted, q_rows, q_logits, h_draft = self._draft(
                    tokens, draft_len, draft_cache, remaining - 1, generator, stats
                )
                if drafted:
                    draft_len = len(tokens) + len(drafted) - 1
            n, extra = self._verify(
                tokens, drafted, q_rows, q_logits, h_draft, target_cache, generator, stats
            )
            _crop(target_cache, len(tokens) + n)
            if draft_cache is not None:
                draft_len = min(draft_len, len(tokens) + n)
                _crop(draft_cache, draft_len)
            new = drafted[:n] + [extra]
            if drafted:
                self.schedule.observe([float(q_rows[i, t]) for i, t in enumerate(drafted)], n)
            stats.record_block(len(drafted), n)
            tokens.extend(new)
            generated.extend(new)
            finish = self._finished(generated, len(generated) - len(new))
            if finish != "length":
                break
        stats.decode_seconds = time.perf_counter() - start
        stats.new_tokens = len(generated)
        return Generation(generated, finish, stats)

    def _draft(
        self,
        tokens: list[int],
        draft_len: int,
        cache: DynamicCache,
        limit: int,
        generator: torch.Generator,
        stats: GenerationStats,
    ) -> tuple[list[int], torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Draw up to ``limit`` draft tokens; return them with the q rows they were drawn from."""
        count = min(self.schedule.max_tokens(), limit)
        hidden = self.rule.needs_hidden_states
        feed = tokens[draft_len:]
        drafted: list[int] = []
        q_rows, logit_rows, hidden_rows = [], [], []
        for _ in range(count):
            start = time.perf_counter()
            logits, states = _forward(self.draft, feed, cache, hidden)
            stats.draft_seconds += time.perf_counter() - start
            stats.draft_forwards += 1
            q = probabilities(logits[-1], self.sampling)
            token = int(draw(q, self.sampling, generator))
            drafted.append(token)
            q_rows.append(q)
            logit_rows.append(logits[-1])
            if hidden:
                hidden_rows.append(states[-1])
            feed = [token]
            if token in self.eos_token_ids or self.schedule.stop_early(float(q[token])):
                break
        if not drafted:
            return [], None, None, None
        h = torch.stack(hidden_rows) if hidden else None
        return drafted, torch.stack(q_rows), torch.stack(logit_rows), h

    def _verify(
        self,
        tokens: list[int],
        drafted: list[int],
        q_rows: torch.Tensor | None,
        q_logits: torch.Tensor | None,
        h_draft: torch.Tensor | None,
        cache: DynamicCache,
        generator: torch.Generator,
        stats: GenerationStats,
    ) -> tuple[int, int]:
        """One target forward over the last token and the drafts; return (accepted, extra token)."""
        hidden = self.rule.needs_hidden_states and bool(drafted)
        start = time.perf_counter()
        logits, h_target = _forward(self.target, [tokens[-1], *drafted], cache, hidden)
        stats.target_seconds += time.perf_counter() - start
        stats.target_forwards += 1
        p = probabilities(logits, self.sampling)
        num = len(drafted)
        weights = None
        if hidden:
            weights = self.head(h_draft, h_target[:num]).reshape(-1).float()
        block = Block(
            tokens=torch.tensor(drafted, dtype=torch.long),
            p=p,
            q=q_rows if q_rows is not None else p[:0],
            p_logits=logits,
            q_logits=q_logits if q_logits is not None else logits[:0],
            weights=weights,
        )
        return verify(self.rule, block, self.sampling, generator)

    def _finished(self, generated: list[int], first_new: int) -> str:
        """Cut ``generated`` after an EOS or a stop string among the new tokens."""
        for i in range(first_new, len(generated)):
            if generated[i] in self.eos_token_ids:
                del generated[i + 1 :]
                return "eos"
            if self.stop_strings:
                window = self.decode_text(generated[max(0, i - 63) : i + 1])
                if any(s in window for s in self.stop_strings):
                    del generated[i + 1 :]
                    return "stop"
        return "length"
