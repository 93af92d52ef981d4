"""The decoding loop: autoregressive and speculative, for a batch of prompts, on stock transformers.

``Decoder.generate_batch`` reads as its steps: ``_prefill`` both caches, then per block ``_draft``,
``_verify``, ``_accept`` (caches and the next feed, one host transfer), ``_record`` (each row's
tokens and counters, on the host) and ``_retire`` (rows that ended leave the batch).

One speculative block (Leviathan et al. 2023, Alg. 1), for every row of the batch at once:

1. the draft proposes up to L tokens per row, each drawn from its processed distribution q,
   which is kept; a row drafts as many as its own schedule allows (its other slots are padding);
2. ONE target forward over [last token, x_1..x_L] gives p at every drafted position plus one;
3. the method's rule keeps a prefix x_1..x_n of each row and supplies one more token (a
   correction, or a bonus token from the target when the row kept all it drafted), so every row
   emits n + 1 tokens; the rule runs once on [B, L, V], never row by row;
4. the columns a row rejected become holes in both caches (see :mod:`diversed.engine.cache`);
   columns that are holes in every row are cropped.

Invariants, per row:

* the target's cache holds every token of the row but the last, which the next block feeds;
* the draft's cache lags behind by one or two tokens (the last drafted token is never fed to the
  draft, nor is the correction); they are fed as the two *pending* columns of the draft's first
  forward of the next block (the first is a hole when only one is pending), never in an extra
  forward;
* a row's randomness is its own stream (:class:`~diversed.engine.sampling.RowRandom`), advanced
  only by the draws it really makes, so row b of a batch equals a batch-1 run with row b's seed;
* a row that ends (EOS, stop string, budget) leaves the batch, and both caches drop it.

Trace mode (``traces=True``, for head training) records TRACE_FIELDS for every emitted token and
emits no bonus token (a row that kept all its drafts ends the block on its last draft), so every
token is a kept draft or a correction: an exact sample of the verification target v (e.g. the
behaviour mixture of ``static``), its fields from the block's own forwards.

On the device: everything but one host transfer per block (the block's tokens and each drafted
token's q, which the schedules need), and, with a confidence threshold on, a per-draft-step check
whether any row still drafts (a skipped draft forward is worth more than a sync). Batch 1 runs
exactly this code.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from diversed.config import DecodeConfig
from diversed.devices import synced_seconds, timed
from diversed.engine.cache import RaggedCache, check_step
from diversed.engine.prefix import SharedPrefix
from diversed.engine.rules import Block, make_rule, verifier_signals, verify
from diversed.engine.sampling import RowRandom, Sampling, draw, probabilities
from diversed.engine.schedules import CostChooser, make_schedule
from diversed.engine.state import (
    TRACE_FIELDS,
    Batch,
    Draft,
    EnsembleHead,
    Generation,
    Row,
    Verified,
    per_row,
    retire,
    trace_fields,
)
from diversed.engine.stats import GenerationStats
from diversed.methods import Method, Schedule

if TYPE_CHECKING:  # importing transformers' modeling code costs seconds; loading a model pays it
    from transformers import PreTrainedModel


class Decoder:
    """Generates with a target model and, for speculative methods, a draft model.

    With a ``prefix`` (the token ids a job's prompts start with), both models compute its KV once,
    at the first batch, and every row starts from it (see :mod:`diversed.engine.prefix`).

    ``step`` says how each forward runs (:data:`~diversed.config.STEPS`): ``eager`` by default;
    ``graphs`` replays a fixed-shape step from CUDA graphs on a GPU, where the eager loop is bound by
    kernel launches; ``fixed`` is that step without the graphs, so a CPU can test it.

    The decoder owns the draft-length schedule, so a ``heuristic`` schedule carries its draft
    length from one ``generate`` call to the next, as in Hugging Face. Within one batched call
    every row starts from that state; afterwards the decoder keeps the state of the batch's last
    row, as if the rows had been decoded one after another in order.
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
        traces: bool = False,
        prefix: SharedPrefix | None = None,
        step: str = "eager",
        profile: object | None = None,
    ) -> None:
        if traces and not config.method.speculative:
            raise ValueError("trace mode needs a speculative method (the verification target is sampled)")
        if config.method.speculative and draft is None:
            raise ValueError(f"method {config.method.value!r} needs a draft model")
        if config.method is Method.DIVERSED and head is None:
            raise ValueError("method 'diversed' needs an ensemble head")
        self.target, self.draft, self.config = target, draft, config
        self.head = head.to(target.device) if isinstance(head, torch.nn.Module) else head
        self.sampling = Sampling(config.temperature, config.top_k, config.top_p)
        self.rule = make_rule(config)
        self.schedule = make_schedule(
            config.schedule, config.num_assistant_tokens, config.confidence_threshold
        )
        # k auto: one k per block for the batch, from ``profile.costs(rows)`` (a CostProfile)
        self.chooser = None
        if config.schedule is Schedule.COST:
            if profile is None or step != "eager":
                raise ValueError("schedule cost (k auto) needs a cost profile and the eager step")
            self.chooser = CostChooser(profile.costs, config.num_assistant_tokens)
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.stop_strings = [s for s in stop_strings if s]
        if self.stop_strings and decode_text is None:
            raise ValueError("stop strings need a decode_text function (a tokenizer)")
        self.decode_text = decode_text
        self.traces = traces
        self.prefix = prefix
        self.step = check_step(step)  # how each forward runs: diversed.config.STEPS
        self._hidden = self.rule.needs_hidden_states or traces
        device = target.device
        self._eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=device)
        pad = target.config.pad_token_id
        self._pad = pad if isinstance(pad, int) else 0

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int | None = None, seed: int | None = None
    ) -> Generation:
        """Continue one prompt by at most ``max_new_tokens`` tokens (a batch of one)."""
        return self.generate_batch([prompt_ids], max_new_tokens, None if seed is None else [seed])[0]

    @torch.inference_mode()
    def generate_batch(
        self,
        prompts: Sequence[list[int]],
        max_new_tokens: int | Sequence[int] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Continue every prompt; row b uses ``seeds[b]`` (default: the config's seed for all)."""
        if not prompts or any(not p for p in prompts):
            raise ValueError("every prompt must hold at least one token")
        count = len(prompts)
        budgets = per_row(max_new_tokens, self.config.max_new_tokens, count, "max_new_tokens")
        seeds = per_row(seeds, self.config.seed, count, "seeds")
        batch = self._prefill(prompts, budgets, seeds)
        if self.chooser is not None:
            self.chooser.begin()
        done: list[Row] = []
        start = time.perf_counter()
        while batch.rows:
            drafts = self._draft(batch)
            checked = self._verify(batch, drafts)
            host = self._accept(batch, drafts, checked)
            finished = self._record(batch, host, drafts, checked, time.perf_counter() - start)
            done += retire(batch, finished)
        done.sort(key=lambda r: r.index)
        self.schedule = done[-1].schedule
        return [self._result(row, batch.prefill_seconds) for row in done]

    def _prefill(self, prompts: Sequence[list[int]], budgets: list[int], seeds: list[int]) -> Batch:
        """Both caches hold every prompt token but the last, which the first block feeds."""
        count, device = len(prompts), self.target.device
        heads = [list(p[:-1]) for p in prompts]
        rows = []
        for index, budget in enumerate(budgets):
            schedule = copy.deepcopy(self.schedule)
            schedule.begin()
            prefix = self.prefix.common_length(heads[index]) if self.prefix else 0
            stats = GenerationStats(batch_size=count, prefix_tokens=prefix)
            rows.append(Row(index, budget, schedule, stats, []))
        start = time.perf_counter()
        # room for the prompts, the budget and one block of drafts; holes may ask for more (it grows)
        capacity = max(map(len, heads)) + max(budgets) + self.config.num_assistant_tokens + 1
        target_cache = RaggedCache(self.target, count, capacity, self.step)
        target_cache.prefill(heads, self.prefix)
        draft_cache = None
        if self.config.method.speculative:
            draft_cache = RaggedCache(self.draft, count, capacity, self.step)
            draft_cache.prefill(heads, self.prefix)
        last = torch.tensor([p[-1] for p in prompts], dtype=torch.long, device=device)
        return Batch(
            rows=rows,
            rng=RowRandom(list(seeds), device),
            target_cache=target_cache,
            draft_cache=draft_cache,
            last=last,
            pending=torch.stack([torch.full_like(last, self._pad), last], dim=1),
            pending_valid=torch.tensor([[False, True]] * count, device=device),
            prefill_seconds=synced_seconds(device, start),
        )

    def _accept(self, batch: Batch, drafts: Draft | None, checked: Verified) -> list[list[float]]:
        """Turn rejected columns into holes in both caches, set each row's next feed, and bring the
        block to the host in its one transfer: counts, extra tokens, drafted tokens and their q."""
        device = batch.last.device
        accepted, extra = checked.accepted, checked.extra
        if drafts is None:
            tokens = torch.zeros(len(batch.rows), 0, dtype=torch.long, device=device)
            num_drafted = torch.zeros_like(accepted)
        else:
            tokens, num_drafted = drafts.tokens, drafts.num_drafted
        width = tokens.shape[1]
        full = (accepted == num_drafted) & (num_drafted > 0)
        # trace mode emits no bonus token: a row that kept every draft ends on its last draft
        on_draft = full if self.traces else torch.zeros_like(full)
        parts = [
            torch.stack([accepted, extra, num_drafted, on_draft.long()], dim=1).double(),
            tokens.double(),
            checked.q_drafted,
        ]
        if checked.token_stats is not None:
            parts.append(checked.token_stats.double().flatten(1))
        host = torch.cat(parts, dim=1).tolist()
        target = batch.target_cache
        in_target = accepted - on_draft.long()  # kept drafts now in the target's cache
        target.keep_new(width + 1, torch.arange(width + 1, device=device) <= in_target.unsqueeze(1))
        kept = max(int(h[0]) - int(h[3]) for h in host)
        target.crop_trailing(target.columns - width - 1 + kept)
        if drafts is None:
            if batch.draft_cache is not None:  # a plain step (k = 0): the draft sees its token later
                batch.feed_later(extra)
            batch.last = extra
            return host
        draft, fed = batch.draft_cache, drafts.fed
        new = fed + width - 1  # the draft's columns this block: [pending.., x_1..x_{L-1}]
        columns = torch.arange(new, device=device) - (fed - 1)
        draft.keep_new(new, (columns <= accepted.unsqueeze(1)) | (columns < 1))
        kept = fed + max(min(int(h[0]), width - 1) for h in host)
        draft.crop_trailing(draft.columns - new + kept - 1)
        lag = tokens.gather(1, (num_drafted - 1).clamp_min(0).unsqueeze(1)).squeeze(1)  # last draft
        batch.last = torch.where(on_draft, lag, extra)
        lagging = full & ~on_draft  # the last draft was never fed to the draft model
        batch.pending = torch.stack([torch.where(lagging, lag, self._pad), batch.last], dim=1)
        batch.pending_valid = torch.stack([lagging, torch.ones_like(full)], dim=1)
        return host

    def _record(
        self,
        batch: Batch,
        host: list[list[float]],
        drafts: Draft | None,
        checked: Verified,
        elapsed: float,
    ) -> list[int]:
        """Per row, on the host: counters, schedule, emitted tokens, trace; the rows that ended."""
        width = 0 if drafts is None else drafts.tokens.shape[1]
        trace = None if checked.trace is None else {k: v.cpu() for k, v in checked.trace.items()}
        finished = []
        for b, (row, values) in enumerate(zip(batch.rows, host, strict=True)):
            n, token, drafted, ends_on_draft = (int(v) for v in values[:4])
            tokens = [int(t) for t in values[4 : 4 + drafted]]
            row.schedule.observe(values[4 + width : 4 + width + drafted], n)
            if self.chooser is not None and drafted:
                self.chooser.observe(drafted, n)
            row.stats.record_block(drafted, n)
            row.stats.target_forwards += 1
            row.stats.draft_forwards += drafted
            if drafts is not None:
                row.stats.draft_seconds += sum(drafts.step_seconds[:drafted])
            row.stats.target_seconds += checked.seconds
            new = tokens[:n] + ([] if ends_on_draft else [token])
            if trace is not None:
                row.trace.append({k: v[b, : len(new)] for k, v in trace.items()})
            if self.rule.per_token_weights:  # kept drafts and a correction: positions 0..n
                stats = values[4 + 2 * width :]
                at = [tuple(stats[3 * i : 3 * i + 3]) for i in range(min(n + 1, drafted))]
                row.token_stats += at + [None] * (len(new) - len(at))  # a bonus token: none
            row.generated.extend(new)
            row.finish = self._finished(row.generated, len(row.generated) - len(new), row.budget)
            if row.finish:
                row.stats.decode_seconds = elapsed
                finished.append(b)
        return finished

    def _result(self, row: Row, prefill_seconds: float) -> Generation:
        row.stats.prefill_seconds = prefill_seconds
        row.stats.new_tokens = len(row.generated)
        trace = None
        if self.traces:  # cut like the tokens (an end token or stop string inside a block)
            trace = {k: torch.cat([t[k] for t in row.trace])[: len(row.generated)] for k in TRACE_FIELDS}
        token_stats = row.token_stats[: len(row.generated)] if self.rule.per_token_weights else None
        return Generation(row.generated, row.finish, row.stats, trace, token_stats)

    def _draft(self, batch: Batch) -> Draft | None:
        """Draw up to each row's limit of draft tokens (its schedule's, within its budget), with the
        q rows they were drawn from; None when no row may draft (``auto``, or budgets spent)."""
        rows, rng, cache = batch.rows, batch.rng, batch.draft_cache
        if cache is None:
            return None
        k = self.chooser.choose(len(rows)) if self.chooser is not None else None
        bonus = 0 if self.traces else 1  # room left in the budget for the block's extra token
        limits = [
            min(r.schedule.max_tokens() if k is None else k, r.budget - len(r.generated) - bonus)
            for r in rows
        ]
        if max(limits) <= 0:
            return None
        device = batch.pending.device
        limit = torch.tensor(limits, device=device)
        thresholds = [r.schedule.call_threshold for r in rows]
        threshold = torch.tensor(thresholds, device=device)
        confidence_stop = any(t > 0 for t in thresholds)
        hidden = self._hidden
        stopped = torch.zeros(len(rows), dtype=torch.bool, device=device)
        tokens, q_rows, logit_rows, hidden_rows, seconds = [], [], [], [], []
        drafted = torch.zeros(len(rows), dtype=torch.long, device=device)
        feed, feed_valid = batch.pending, batch.pending_valid
        for step in range(max(limits)):
            active = (step < limit) & ~stopped
            feed_valid = feed_valid & active.unsqueeze(1)
            with timed(device, seconds):
                logits, states = cache.forward(feed, feed_valid, hidden, logits_to_keep=1)
                q = probabilities(logits[:, -1], self.sampling)
                uniforms = None if self.sampling.greedy else rng.uniform(1, active)[:, 0]
                token = draw(q, self.sampling, uniforms)
            tokens.append(token)
            q_rows.append(q)
            logit_rows.append(logits[:, -1].float())
            if hidden:
                hidden_rows.append(states[:, -1])
            drafted = drafted + active.long()
            q_token = q.gather(1, token.unsqueeze(1)).squeeze(1)
            stopped = stopped | ~active | torch.isin(token, self._eos) | (q_token < threshold)
            feed, feed_valid = token.unsqueeze(1), torch.ones_like(active).unsqueeze(1)
            if confidence_stop and bool(stopped.all()):
                break
        return Draft(
            tokens=torch.stack(tokens, dim=1),
            num_drafted=drafted,
            q=torch.stack(q_rows, dim=1),
            q_logits=torch.stack(logit_rows, dim=1),
            hidden=torch.stack(hidden_rows, dim=1) if hidden else None,
            step_seconds=seconds,
            fed=batch.pending.shape[1],
        )

    def _verify(self, batch: Batch, drafts: Draft | None) -> Verified:
        """One target forward over the last token and the drafts, and the rule's verdict."""
        cache, last, rng = batch.target_cache, batch.last, batch.rng
        device = last.device
        first = torch.ones(last.shape[0], 1, dtype=torch.bool, device=device)  # the last token: real
        if drafts is None:
            ids, valid, width = last.unsqueeze(1), first, 0
        else:
            width = drafts.tokens.shape[1]
            ids = torch.cat([last.unsqueeze(1), drafts.tokens], dim=1)
            steps = torch.arange(width, device=device)
            valid = torch.cat([first, steps < drafts.num_drafted.unsqueeze(1)], dim=1)
        hidden = self._hidden and width > 0
        with timed(device, elapsed := []):
            logits, h_target = cache.forward(ids, valid, hidden)
        seconds = elapsed[0]
        logits = logits.float()
        p = probabilities(logits, self.sampling)
        if drafts is None:
            tokens = torch.zeros(last.shape[0], 0, dtype=torch.long, device=device)
            block = Block(tokens, torch.zeros_like(last), p, p[:, :0], logits, logits[:, :0])
            accepted, extra, _ = verify(self.rule, block, self.sampling, rng)
            return Verified(accepted, extra, tokens.double(), seconds, None)
        weights = self.rule.weights(p[:, :width], drafts.q)
        signals = None
        if self.traces or self.rule.per_token_weights:
            signals = verifier_signals(p[:, :width], drafts.q, logits[:, :width], drafts.q_logits)
        if self.rule.needs_hidden_states:
            reads = (signals,) if getattr(self.head, "signals", False) else ()
            weights = self.head(drafts.hidden, h_target[:, :width], *reads).float()
        block = Block(drafts.tokens, drafts.num_drafted, p, drafts.q, logits, drafts.q_logits, weights)
        accepted, extra, v = verify(self.rule, block, self.sampling, rng)
        q_drafted = drafts.q.gather(2, drafts.tokens.unsqueeze(2)).squeeze(2).double()
        seen = (block, v, accepted, extra, drafts.hidden, h_target, signals)
        trace = trace_fields(*seen) if self.traces else None
        token_stats = None
        if weights is not None:  # w, TV and the target's entropy: TOKEN_STATS
            token_stats = torch.stack([weights, signals[..., 0], signals[..., 1]], dim=2)
        return Verified(accepted, extra, q_drafted, seconds, trace, token_stats)

    def _finished(self, generated: list[int], first_new: int, budget: int) -> str:
        """Cut ``generated`` after an EOS or a stop string among the new tokens; '' if not done."""
        for i in range(first_new, len(generated)):
            if generated[i] in self.eos_token_ids:
                del generated[i + 1 :]
                return "eos"
            if self.stop_strings:
                window = self.decode_text(generated[max(0, i - 63) : i + 1])
                if any(s in window for s in self.stop_strings):
                    del generated[i + 1 :]
                    return "stop"
        return "length" if len(generated) >= budget else ""
