"""Flags shared by several commands, and the decoding setting they describe."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from diversed.config import (
    ATTENTION,
    AUTO_MAX_DRAFT,
    DRAFT_TRANSFORMS,
    DTYPES,
    QUANTIZE,
    STEPS,
    ConfigError,
    DecodeConfig,
    add_knob_flags,
    check_range,
)
from diversed.methods import Method, parse_method


def add_model_flags(parser: argparse.ArgumentParser, draft_required: bool = False) -> None:
    parser.add_argument(
        "--target", "--target_model", required=True, help="target model: hub id or local folder"
    )
    parser.add_argument(
        "--draft", "--draft_model", required=draft_required, help="draft model: hub id or local folder"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="dtype of both models; auto (default): bfloat16 on CUDA and CPUs with native bf16, else float32",
    )
    parser.add_argument(
        "--quantize",
        default="none",
        choices=QUANTIZE,
        help="weight storage of both models' linears: none (default), fp16 (CPU: fp16 weights, fp32 compute,"
        " ~2x faster on CPUs without native bf16), auto (fp16 where the models would run fp32 on a CPU)",
    )
    parser.add_argument(
        "--draft-transform",
        choices=DRAFT_TRANSFORMS,
        help="study option, never a default: damage the draft for a positive control (digit_swap: the"
        " draft's digit logits permuted 0<->1, 2<->3, ...; see diversed/loading/control.py)",
    )
    add_device_flag(parser)
    parser.add_argument(
        "--attn-implementation",
        choices=ATTENTION,
        help="attention kernel of both models (default: transformers' choice, sdpa where torch has it);"
        " flash_attention_2 is refused: the engine's ragged rows pass a 4-D additive mask, which FA2 does"
        " not take",
    )


def add_device_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        default="auto",
        help="torch device: auto (default: cuda where torch sees a GPU, else cpu), cpu, cuda or cuda:N",
    )


def add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    """The engine's knobs (declared once, in :class:`DecodeConfig`), and two original spellings
    that are not knobs themselves but set one."""
    add_knob_flags(parser, DecodeConfig)
    for action in parser._actions:  # k may also be chosen per block: "auto"
        if action.dest == "num_assistant_tokens":
            action.type = draft_length
            action.help += "; auto: k in 0..6 per block from this machine's cost profile (sd only)"
    parser.add_argument(
        "--do-sample", "--do_sample", action="store_true", help="sample; with temperature 0 this means 1.0"
    )
    parser.add_argument(
        "--draft-ensemble-weights",
        "--draft_ensemble_weights",
        type=float,
        help="original flag: weight on the draft, a = 1 - w",
    )


def draft_length(text: str) -> int | str:
    """A draft length, or "auto"."""
    return text if text == "auto" else int(text)


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    """Flags -> validated :class:`DecodeConfig`, resolving the original project's spellings."""
    values: dict[str, Any] = {item.name: getattr(args, item.name) for item in fields(DecodeConfig)}
    if values["num_assistant_tokens"] == "auto":
        if values["schedule"] not in (None, "cost"):
            raise ConfigError(f"--num-assistant-tokens auto is schedule cost, not {values['schedule']}")
        values.update(num_assistant_tokens=AUTO_MAX_DRAFT, schedule="cost")
    if args.draft_ensemble_weights is not None:
        if values["target_weight"] is not None:
            raise ConfigError("give --target-weight or --draft_ensemble_weights, not both")
        check_range("draft_ensemble_weights", args.draft_ensemble_weights, minimum=0, maximum=1)
        values["target_weight"] = 1.0 - args.draft_ensemble_weights
    if args.do_sample and not values["temperature"]:
        values["temperature"] = 1.0
    if values["method"] is not None:
        values["method"] = parse_method(values["method"]).value
    return DecodeConfig.from_dict(values)


def check_method_inputs(config: DecodeConfig, args: argparse.Namespace) -> None:
    if config.method.speculative and not args.draft:
        raise ConfigError(f"method {config.method.value!r} needs --draft")
    if config.method is Method.DIVERSED and not args.head:
        raise ConfigError("method 'diversed' needs --head (a folder written by `diversed train-head`)")


def from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """An instance of dataclass ``cls`` from the same-named attributes of ``args``; ``overrides``
    win (for flags whose value needs converting), and fields without a flag keep their default."""
    values = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
    return cls(**{**values, **overrides})


def add_step_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--step",
        choices=STEPS,
        default="eager",
        help="how each forward runs: eager (default); graphs: a fixed-shape step replayed from CUDA graphs"
        " (CUDA only, for GPUs where the eager loop is bound by kernel launches); fixed: that step without"
        " the graphs. In fp32 outputs do not depend on it (tested on CPUs; see diversed/engine/cache.py)",
    )


def check_step_device(args: argparse.Namespace) -> None:
    """Refuse ``--step graphs`` off CUDA before any model is loaded (it would fail at the first batch);
    ``args.device`` is already resolved (``auto`` -> ``cuda`` or ``cpu``) by the CLI's main."""
    if args.step == "graphs" and not str(args.device).startswith("cuda"):
        raise ConfigError(f"--step graphs replays CUDA graphs: it needs --device cuda, not {args.device!r}")


def run_options(args: argparse.Namespace) -> Any:
    """How a command runs its models over a dataset (:class:`diversed.jobs.runner.RunOptions`), from
    the flags it has: device, batch size, prefix cache, step, progress bar, attention."""
    from diversed.jobs.runner import RunOptions

    return RunOptions(
        device=args.device,
        batch_size=args.batch_size,
        prefix_cache=args.prefix_cache == "on",
        step=getattr(args, "step", "eager"),
        progress=not getattr(args, "quiet", False),
        attn_implementation=getattr(args, "attn_implementation", None),
    )


def add_run_flags(parser: argparse.ArgumentParser, batch_size: int, what: str) -> None:
    """The flags of :func:`run_options`, for a command that runs models over a dataset: ``what``
    names the batch's items (prompts, rollouts)."""
    parser.add_argument(
        "--batch-size",
        type=int,
        default=batch_size,
        help=f"{what} decoded together ({batch_size}); outputs do not depend on it",
    )
    add_prefix_flag(parser)
    add_step_flag(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def add_prefix_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prefix-cache",
        choices=("on", "off"),
        default="on",
        help="prefill the prompt start every example of the task shares (few-shot block) once per model"
        " (on, default); off prefills every prompt whole, to measure the gain; outputs do not depend on it",
    )


def add_data_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", help="folder of <task>/<split>.jsonl files (default $DIVERSED_DATA_DIR)"
    )
    parser.add_argument("--no-hub", action="store_true", help="never try the Hugging Face hub for data")


def add_sandbox_flag(parser: argparse.ArgumentParser) -> None:
    from diversed.sandbox import ALIASES, MODES

    parser.add_argument(
        "--sandbox",
        choices=(*MODES, *ALIASES),
        default="isolated",
        help="generated code: isolated (default; strict is its old name) runs it only where every fence of"
        " diversed.sandbox holds (own filesystem view, no network, own PIDs) and refuses elsewhere;"
        " rlimits opts in to running it with resource limits alone on a machine that cannot isolate,"
        " and every record says so",
    )


def add_stop_flag(parser: argparse.ArgumentParser) -> None:
    from diversed.data.tasks import STOPS

    parser.add_argument(
        "--stop",
        choices=STOPS,
        default="paper",
        help="where completions stop besides the models' end-of-sequence ids: paper (default: the task's"
        " markers, as the original experiments) or lm-eval (also at </s>, <|im_end|>, <|endoftext|>, as"
        " lm-evaluation-harness stops GSM8K); every record states it",
    )
