"""Flags shared by several commands, and the decoding setting they describe."""

from __future__ import annotations

import argparse
from typing import Any

from diversed.config import DTYPES, QUANTIZE, ConfigError, DecodeConfig
from diversed.methods import Method, method_choices, parse_method


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
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument(
        "--attn-implementation", help="attention kernel for both models, e.g. sdpa or flash_attention_2"
    )


def add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    """The engine's knobs; defaults come from the shared schema (left as None here)."""
    add = parser.add_argument
    add("--method", help=f"decoding method (default sd): {', '.join(method_choices())}")
    add(
        "--max-new-tokens",
        "--max_tokens",
        "--max_new_tokens",
        type=int,
        help="tokens to generate at most (128)",
    )
    add("--num-assistant-tokens", "--num_assistant_tokens", type=int, help="draft length N (5)")
    add(
        "--assistant-schedule",
        "--assistant_schedule",
        dest="schedule",
        help="constant | heuristic | heuristic_transient | dynamic (constant)",
    )
    add(
        "--assistant-confidence-threshold",
        "--assistant_confidence_threshold",
        dest="confidence_threshold",
        type=float,
        help="stop drafting below this draft probability (0 = off; dynamic: 0.4)",
    )
    add("--temperature", type=float, help="0 = greedy (default 0)")
    add("--do-sample", "--do_sample", action="store_true", help="sample; with temperature 0 this means 1.0")
    add("--top-k", "--top_k", type=int, help="top-k filter (0 = off)")
    add("--top-p", "--top_p", type=float, help="nucleus filter (1 = off)")
    add("--seed", type=int, help="sampling seed (42)")
    add("--target-weight", type=float, help="static ensemble weight on the target, w in [0, 1] (0.5)")
    add(
        "--draft-ensemble-weights",
        "--draft_ensemble_weights",
        type=float,
        help="original flag: weight on the draft, a = 1 - w",
    )
    add("--ensemble-space", help="probs (paper) | logits (released code) (probs)")
    add("--lenience", type=float, help="lossy SD lenience l in (0, 1] (0.5)")
    add("--cascade-rule", help="chow | diff | opt | token (opt)")
    add("--cascade-alpha", type=float, help="cascade deferral parameter alpha (0)")


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    """Flags -> validated :class:`DecodeConfig`, resolving the original project's spellings."""
    target_weight = args.target_weight
    if args.draft_ensemble_weights is not None:
        if target_weight is not None:
            raise ConfigError("give --target-weight or --draft_ensemble_weights, not both")
        if not 0.0 <= args.draft_ensemble_weights <= 1.0:
            raise ConfigError(f"draft_ensemble_weights: {args.draft_ensemble_weights} is not in [0, 1]")
        target_weight = 1.0 - args.draft_ensemble_weights
    temperature = args.temperature
    if args.do_sample and not temperature:
        temperature = 1.0
    values: dict[str, Any] = {
        "method": args.method,
        "max_new_tokens": args.max_new_tokens,
        "num_assistant_tokens": args.num_assistant_tokens,
        "schedule": args.schedule,
        "confidence_threshold": args.confidence_threshold,
        "temperature": temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "target_weight": target_weight,
        "ensemble_space": args.ensemble_space,
        "lenience": args.lenience,
        "cascade_rule": args.cascade_rule,
        "cascade_alpha": args.cascade_alpha,
    }
    if values["method"] is not None:
        values["method"] = parse_method(values["method"]).value
    return DecodeConfig.from_dict(values)


def check_method_inputs(config: DecodeConfig, args: argparse.Namespace) -> None:
    if config.method.speculative and not args.draft:
        raise ConfigError(f"method {config.method.value!r} needs --draft")
    if config.method is Method.DIVERSED and not args.head:
        raise ConfigError("method 'diversed' needs --head (a folder written by `diversed train-head`)")


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
