"""Commands that decode: ``generate`` (prompts), ``decode`` (a dataset split), ``bench``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from diversed.cli.flags import (
    add_data_flags,
    add_decoding_flags,
    add_device_flag,
    add_model_flags,
    add_run_flags,
    add_step_flag,
    add_stop_flag,
    check_method_inputs,
    check_step_device,
    decode_config,
    from_args,
    run_options,
)
from diversed.config import DTYPES, QUANTIZE, ConfigError, DecodeConfig
from diversed.methods import Method


def cmd_generate(args: argparse.Namespace) -> int:
    from diversed.loading.models import prompt_ids
    from diversed.loading.stack import load_stack

    config = decode_config(args)
    check_method_inputs(config, args)
    check_step_device(args)
    stack = load_stack(
        args.target,
        args.draft if config.method.speculative else None,
        args.dtype,
        args.device,
        args.quantize,
        args.attn_implementation,
        args.head if config.method is Method.DIVERSED else None,
        args.draft_transform if config.method.speculative else None,
    )
    tokenizer, decoder = stack.tokenizer, stack.decoder(config, step=args.step)
    prompts = [prompt_ids(tokenizer, prompt, args.chat) for prompt in args.prompt]
    for result in decoder.generate_batch(prompts):  # one batch; every row seeded with --seed
        text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
        if args.json:
            print(json.dumps({"text": text, "token_ids": result.token_ids, "stats": result.stats.to_dict()}))
        else:
            print(text)
            print(f"[{config.method.value}] {result.stats.summary()}", file=sys.stderr)
    return 0


def matched_config(config: DecodeConfig, path: str) -> DecodeConfig:
    """``static`` at the mean weight a DIVERSED head put on the tokens of a decode file: the fixed
    weight that head is to beat (the same w on average, spent evenly instead of per token)."""
    from diversed.evaluation.weights import matched_weight
    from diversed.files import read_jsonl

    if config.method is not Method.STATIC:
        raise ConfigError(f"--target-weight-from sets a static weight; method is {config.method.value}")
    w = matched_weight(read_jsonl(path))
    if w is None:
        raise ConfigError(f"{path}: no record carries a head's per-token weights (a diversed decode file)")
    return replace(config, target_weight=w)


def cmd_decode(args: argparse.Namespace) -> int:
    from diversed.data import get_task
    from diversed.jobs.decode import DecodeJob, run_decode

    budget = get_task(args.dataset).max_new_tokens
    if args.max_new_tokens is None and budget is not None:  # the benchmark's own (Spec-Bench: 1024)
        args.max_new_tokens = budget
    config = decode_config(args)
    check_method_inputs(config, args)
    check_step_device(args)
    if args.target_weight_from:
        config = matched_config(config, args.target_weight_from)
    head = args.head if config.method is Method.DIVERSED else None
    job = from_args(DecodeJob, args, config=config, head=head, categories=tuple(args.categories or ()))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        print(
            run_decode(
                job,
                args.out,
                run_options(args),
                args.data_dir,
                not args.no_hub,
                latency_examples=args.latency_examples,
                replace_stale=args.replace_stale,
            )
        )
        return 0
    # Launched by `accelerate launch --num_processes N`: one process per device, each decodes a shard;
    # after a barrier the first process merges the shards into --out.
    from accelerate import PartialState

    from diversed.jobs.decode import merge_shards

    state = PartialState()
    shard = (state.process_index, state.num_processes)
    options = replace(run_options(args), device=str(state.device), progress=False)
    run_decode(
        job,
        args.out,
        options,
        args.data_dir,
        not args.no_hub,
        shard,
        args.latency_examples,
        args.replace_stale,
    )
    state.wait_for_everyone()
    if state.is_main_process:
        print(merge_shards(job, args.out, state.num_processes, args.data_dir, not args.no_hub))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from diversed.jobs.bench import BenchSpec, run_bench
    from diversed.jobs.peers import run_peers

    spec = from_args(
        BenchSpec,
        args,
        prompts=tuple(args.prompts or ()),
        batch_sizes=tuple(args.batch_sizes),
        onednn=not args.no_onednn,
    )
    if args.dataset == "specbench":  # Spec-Bench's subset, per category, beside Hugging Face's peers
        run_peers(spec, args.per_category or 1, args.target_weight)
    else:
        run_bench(spec)
    return 0


def add_generate(sub: argparse._SubParsersAction) -> None:
    gen = sub.add_parser("generate", help="decode prompts (one batch) and print the texts and statistics")
    add_model_flags(gen)
    add_step_flag(gen)
    add_decoding_flags(gen)
    gen.add_argument(
        "--prompt",
        required=True,
        action="append",
        help="prompt text; repeat the flag to decode several prompts as one batch, each seeded with --seed",
    )
    gen.add_argument("--head", help="trained ensemble head folder (method diversed)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    gen.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per prompt, one per line, in prompt order: text, token_ids, stats",
    )
    gen.set_defaults(func=cmd_generate)


def add_decode(sub: argparse._SubParsersAction) -> None:
    dec = sub.add_parser("decode", help="decode a dataset split into a resumable JSONL file")
    add_model_flags(dec)
    add_decoding_flags(dec)
    dec.add_argument(
        "--dataset", required=True, help="gsm8k | cnndm | xsum | wmt | humaneval | mbpp | specbench"
    )
    dec.add_argument("--split", default="test", help="split to decode (default test)")
    dec.add_argument("--n-examples", "--n_examples", type=int, help="seeded random subset size (default all)")
    dec.add_argument(
        "--first-example",
        type=int,
        default=0,
        help="skip the subset's first N examples (0): a confirmatory cell decodes only examples it never saw",
    )
    dec.add_argument(
        "--categories",
        nargs="+",
        help="a benchmark's categories to decode (specbench: e.g. translation qa; default all)",
    )
    dec.add_argument(
        "--per-category",
        type=int,
        help="the first N questions of each category by id (specbench's stratified subset; default all)",
    )
    dec.add_argument(
        "--chat",
        action="store_true",
        help="wrap prompts in the chat template (default raw text; specbench always is)",
    )
    dec.add_argument(
        "--out",
        required=True,
        help="JSONL file; rerun with the same arguments to resume, or with more examples to grow it",
    )
    dec.add_argument(
        "--replace-stale",
        action="store_true",
        help="start --out over when it holds another setting's records, instead of refusing (the workflow)",
    )
    dec.add_argument("--head", help="trained ensemble head folder (method diversed)")
    dec.add_argument(
        "--target-weight-from",
        metavar="DECODE_JSONL",
        help="method static: w = the mean weight the head of this diversed decode file put on its tokens"
        " (the direct static comparator of that head)",
    )
    dec.add_argument(
        "--latency-examples",
        type=int,
        default=0,
        help="decode the job's first N examples one at a time: their timings are its seconds per example (0)",
    )
    add_run_flags(dec, 1, "prompts")
    add_stop_flag(dec)
    add_data_flags(dec)
    dec.set_defaults(func=cmd_decode)


def add_bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench", help="time autoregressive HF generate, HF assisted generation and ours on the same prompts"
    )
    bench.add_argument("--target", help="target model (default: a tiny pair built in code)")
    bench.add_argument("--draft", help="draft model (with --target)")
    bench.add_argument(
        "--dtype", default="auto", choices=DTYPES, help="model dtype (auto: see generate --help)"
    )
    bench.add_argument(
        "--quantize",
        default="none",
        choices=QUANTIZE,
        help="weight storage of the linears: none, fp16 or auto (see generate --help)",
    )
    bench.add_argument("--prompts", nargs="+", help="prompts (default: a few built-in ones)")
    bench.add_argument(
        "--dataset", help="take the prompts from this dataset's test split instead, e.g. humaneval"
    )
    bench.add_argument("--n-prompts", type=int, default=8, help="prompts taken from --dataset (8)")
    bench.add_argument(
        "--per-category",
        type=int,
        help="--dataset specbench: the first N questions of each category (1); ours beside HF per category",
    )
    bench.add_argument(
        "--target-weight",
        type=float,
        default=0.5,
        help="--dataset specbench: w of ours static and of HF's assistant_ensemble_weight (0.5)",
    )
    bench.add_argument("--data-dir", help="local dataset folder (default $DIVERSED_DATA_DIR)")
    bench.add_argument(
        "--batch-sizes", type=int, nargs="+", default=[1, 4], help="batch sizes to compare (1 4)"
    )
    bench.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (64)")
    bench.add_argument("--num-assistant-tokens", type=int, default=5, help="draft length k (5)")
    bench.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported (3)")
    bench.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    add_device_flag(bench)
    bench.add_argument(
        "--no-onednn",
        action="store_true",
        help="keep torch's default (MKL) linears instead of pre-packed oneDNN ones on CPU (diversed/cpu.py)",
    )
    bench.add_argument("--out", required=True, help="JSON file to write")
    bench.set_defaults(func=cmd_bench)
