"""Models over a dataset: the one sequence decode, trace collection and the on-policy check share.

Each of them loads the stack (tokenizer, pair, head) once, tokenises its prompts, prefills the
task's shared prompt start once per model, and builds a decoder per setting that stops where the
task stops; then each batches its own work and writes its own resumable file. :class:`RunOptions`
holds how a job runs, which changes no output in fp32 (device, batch size, prefix cache, step,
progress bar), declared and checked once here; :class:`ModelRun` is the loaded part.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from diversed.config import DecodeConfig, check_range
from diversed.data import Example, Task, get_task
from diversed.engine.cache import check_step

if TYPE_CHECKING:
    from diversed.engine.loop import Decoder
    from diversed.engine.prefix import SharedPrefix
    from diversed.loading.stack import Stack


@dataclass(frozen=True)
class RunOptions:
    """How a job runs its models; none of these changes a token in fp32, only where and how fast."""

    device: str = "cpu"
    batch_size: int = 1  # prompts decoded together
    prefix_cache: bool = True  # the task's shared prompt start prefilled once per model
    step: str = "eager"  # how each forward runs (diversed.config.STEPS)
    progress: bool = True  # a progress bar on stderr
    attn_implementation: str | None = None

    def __post_init__(self) -> None:
        check_range("batch_size", self.batch_size, minimum=1)
        check_step(self.step)


class ModelJob(Protocol):
    """What a job names of its models and task (DecodeJob, TraceJob and CheckJob all do)."""

    dataset: str
    target: str
    draft: str | None
    dtype: str
    quantize: str
    draft_transform: str | None
    chat: bool
    stop: str


@dataclass
class ModelRun:
    """A job's loaded stack, its prompts as token ids (by example id) and the shared prefix."""

    stack: Stack
    task: Task
    prompts: dict[str, list[int]]
    prefix: SharedPrefix | None
    options: RunOptions
    stop: str

    def decoder(self, config: DecodeConfig, **kwargs: Any) -> Decoder:
        """A decoder for ``config`` over the stack, stopping where the task stops (``kwargs``:
        ``head``, ``traces``)."""
        return self.stack.decoder(
            config, self.task.stops(self.stop), prefix=self.prefix, step=self.options.step, **kwargs
        )

    def decode_text(self, token_ids: list[int]) -> str:
        return self.stack.tokenizer.decode(token_ids, skip_special_tokens=True)


def open_run(
    job: ModelJob,
    examples: Sequence[Example],
    options: RunOptions,
    draft: str | None = None,
    head: str | None = None,
) -> ModelRun:
    """Load ``job``'s models (``draft``, and the transform, only when given: a method without a
    draft loads none), tokenise ``examples`` and find the prompt start they share."""
    from diversed.loading.models import prompt_ids, shared_prefix
    from diversed.loading.stack import load_stack

    stack = load_stack(
        job.target,
        draft,
        job.dtype,
        options.device,
        job.quantize,
        options.attn_implementation,
        head,
        job.draft_transform if draft else None,
    )
    prompts = {e.id: prompt_ids(stack.tokenizer, e.prompt, job.chat) for e in examples}
    prefix = None
    if options.prefix_cache and examples:
        prefix = shared_prefix(stack.tokenizer, examples[0].prefix, job.chat, prompts.values())
    return ModelRun(stack, get_task(job.dataset), prompts, prefix, options, job.stop)


def batched(items: Iterable[Any], size: int) -> list[list[Any]]:
    """``items`` in consecutive batches of ``size`` (the last may be shorter)."""
    items = list(items)
    return [items[i : i + size] for i in range(0, len(items), size)]
