"""The ``diversed`` command line.

Flags use dashes; the original project's underscore spellings (``--num_assistant_tokens``,
``--draft_ensemble_weights``, ``--max_tokens``, ``--do_sample``, ...) are accepted as aliases.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diversed.config import DTYPES, ConfigError, DecodeConfig
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


def cmd_generate(args: argparse.Namespace) -> int:
    from diversed.engine.loop import Decoder
    from diversed.head import load_head_for
    from diversed.models import eos_ids, load_pair, load_tokenizer, prompt_ids

    config = decode_config(args)
    check_method_inputs(config, args)
    tokenizer = load_tokenizer(args.target)
    draft_name = args.draft if config.method.speculative else None
    target, draft = load_pair(
        args.target, draft_name, args.dtype, args.device, attn_implementation=args.attn_implementation
    )
    head = load_head_for(args.head, target, draft) if config.method is Method.DIVERSED else None
    decoder = Decoder(target, draft, config, head=head, eos_token_ids=eos_ids(tokenizer, target))
    prompts = [prompt_ids(tokenizer, prompt, args.chat) for prompt in args.prompt]
    for result in decoder.generate_batch(prompts):  # one batch; every row seeded with --seed
        text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
        if args.json:
            print(json.dumps({"text": text, "token_ids": result.token_ids, "stats": result.stats.to_dict()}))
        else:
            print(text)
            print(f"[{config.method.value}] {result.stats.summary()}", file=sys.stderr)
    return 0


def cmd_decode(args: argparse.Namespace) -> int:
    from diversed.decode_dataset import DecodeJob, run_decode

    config = decode_config(args)
    check_method_inputs(config, args)
    head = args.head if config.method is Method.DIVERSED else None
    job = DecodeJob(
        args.dataset,
        args.split,
        args.n_examples,
        args.target,
        args.draft,
        config,
        args.chat,
        args.dtype,
        head=head,
    )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        print(
            run_decode(
                job,
                args.out,
                args.data_dir,
                not args.no_hub,
                args.device,
                not args.quiet,
                attn_implementation=args.attn_implementation,
                batch_size=args.batch_size,
                latency_examples=args.latency_examples,
            )
        )
        return 0
    # Launched by `accelerate launch --num_processes N`: one process per device, each decodes a shard;
    # after a barrier the first process merges the shards into --out.
    from accelerate import PartialState

    from diversed.decode_dataset import merge_shards

    state = PartialState()
    device = str(state.device)
    shard = (state.process_index, state.num_processes)
    run_decode(
        job,
        args.out,
        args.data_dir,
        not args.no_hub,
        device,
        False,
        shard,
        args.attn_implementation,
        args.batch_size,
        args.latency_examples,
    )
    state.wait_for_everyone()
    if state.is_main_process:
        print(merge_shards(job, args.out, state.num_processes, args.data_dir, not args.no_hub))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from diversed.score import score_file

    strict = args.sandbox == "strict"
    result = score_file(args.dataset, args.input, args.out, args.data_dir, not args.no_hub, strict)
    shown = {k: v for k, v in result.items() if k not in ("settings", "per_example")}
    print(json.dumps(shown, indent=2))
    return 0


def cmd_data_show(args: argparse.Namespace) -> int:
    from diversed.data import load_examples

    for example in load_examples(
        args.dataset, args.split, args.n, directory=args.data_dir, allow_hub=not args.no_hub
    ):
        print(f"===== {example.task} {example.id} =====")
        print(example.prompt)
        print(f"----- reference -----\n{example.reference}\n")
    return 0


def cmd_models_fetch(args: argparse.Namespace) -> int:
    from diversed.embedded import EMBEDDED, fetch

    for name in args.names or list(EMBEDDED):
        print(f"embedded:{name} -> {fetch(name)}")
    return 0


def cmd_models_prepare(args: argparse.Namespace) -> int:
    from diversed.embedded import fetch, is_embedded
    from diversed.models import resolve

    ready = {}
    for role, name in (("target", args.target), ("draft", args.draft)):
        ready[role] = {"name": name, "path": str(fetch(name)) if is_embedded(name) else resolve(name)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(ready, indent=2) + "\n")
    return 0


def cmd_data_status(args: argparse.Namespace) -> int:
    from diversed.data import resolve

    status = {d: resolve(d, args.split, args.data_dir, not args.no_hub) for d in args.datasets}
    text = json.dumps({"split": args.split, "datasets": status}, indent=2) + "\n"
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(text, end="")
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    from diversed.embedded import EMBEDDED, model_dir

    for name, model in EMBEDDED.items():
        state = "fetched" if (model_dir("embedded:" + name) / "config.json").exists() else "not fetched"
        print(f"embedded:{name:<22} {state:<12} {model.description}")
    return 0


def add_data_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", help="folder of <task>/<split>.jsonl files (default $DIVERSED_DATA_DIR)"
    )
    parser.add_argument("--no-hub", action="store_true", help="never try the Hugging Face hub for data")


def cmd_collect_traces(args: argparse.Namespace) -> int:
    from diversed.traces import TraceJob, collect_traces

    job = TraceJob(
        dataset=args.dataset,
        split=args.split,
        n_examples=args.n_examples,
        target=args.target,
        draft=args.draft,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        behaviour_weights=tuple(args.behaviour_weights),
        head=args.head,
        draft_length=args.draft_length,
        chat=args.chat,
        dtype=args.dtype,
        seed=args.seed,
    )
    for weight in job.behaviour_weights:
        if not 0.0 <= weight <= 1.0:
            raise ConfigError(f"behaviour_weights: {weight} is not in [0, 1]")
    out = collect_traces(
        job, args.out, args.data_dir, not args.no_hub, args.device, not args.quiet, args.batch_size
    )
    print(out)
    return 0


def cmd_train_head(args: argparse.Namespace) -> int:
    from diversed.train import TrainConfig, train_from_traces

    if args.reg_lambda <= 0:
        raise ConfigError(f"reg_lambda: {args.reg_lambda} must be > 0 (it rewards accepted drafts)")
    cfg = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        reg_lambda=args.reg_lambda,
        baseline=args.baseline,
        hidden=args.hidden,
        seed=args.seed,
    )
    log_step = (lambda step, figures: args.tracker.metrics(figures, step)) if args.tracker else None
    card = train_from_traces(args.traces, args.out, cfg, log_step=log_step, progress=not args.quiet)
    print(json.dumps({"out": args.out, **card["metrics"]}, indent=2))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from diversed.report import load_scores, write_plots, write_tables

    rows = load_scores(args.scores)
    for path in write_tables(rows, args.tables) + write_plots(rows, args.plots):
        print(path)
    return 0


def cmd_models_tiny(args: argparse.Namespace) -> int:
    from diversed.tiny import write_tiny_pair

    target, draft = write_tiny_pair(args.out, seed=args.seed)
    print(json.dumps({"target": str(target), "draft": str(draft)}))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from diversed.doctor import run_doctor

    return run_doctor(args.data_dir)


def cmd_bench(args: argparse.Namespace) -> int:
    from diversed.bench import run_bench

    run_bench(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diversed", description="Relaxed speculative decoding (DIVERSED) on stock transformers."
    )
    parser.add_argument(
        "--track",
        metavar="STAGE",
        help="log this command as an MLflow child run named STAGE (used by the workflow)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode prompts (one batch) and print the texts and statistics")
    add_model_flags(gen)
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

    dec = sub.add_parser("decode", help="decode a dataset split into a resumable JSONL file")
    add_model_flags(dec)
    add_decoding_flags(dec)
    dec.add_argument("--dataset", required=True, help="gsm8k | cnndm | xsum | wmt | humaneval | mbpp")
    dec.add_argument("--split", default="test", help="split to decode (default test)")
    dec.add_argument("--n-examples", "--n_examples", type=int, help="seeded random subset size (default all)")
    dec.add_argument(
        "--chat", action="store_true", help="wrap prompts in the chat template (default raw text)"
    )
    dec.add_argument("--out", required=True, help="JSONL file; rerun with the same arguments to resume")
    dec.add_argument("--quiet", action="store_true", help="no progress bar")
    dec.add_argument("--head", help="trained ensemble head folder (method diversed)")
    dec.add_argument(
        "--batch-size", type=int, default=1, help="prompts decoded together (1); outputs do not depend on it"
    )
    dec.add_argument(
        "--latency-examples",
        type=int,
        default=0,
        help="decode the job's first N examples one at a time: their timings are its seconds per example (0)",
    )
    add_data_flags(dec)
    dec.set_defaults(func=cmd_decode)

    score = sub.add_parser("score", help="quality and efficiency metrics of a decode JSONL")
    score.add_argument("--dataset", required=True, help="the dataset the file was decoded from")
    score.add_argument("--in", dest="input", required=True, help="decode JSONL file")
    score.add_argument("--out", required=True, help="metrics JSON file to write")
    score.add_argument(
        "--sandbox",
        choices=("best-effort", "strict"),
        default="best-effort",
        help="generated code: run with whatever containment this machine gives and say what is "
        "missing (default), or refuse to run it unless every fence holds",
    )
    add_data_flags(score)
    score.set_defaults(func=cmd_score)

    data = sub.add_parser("data", help="look at the datasets").add_subparsers(
        dest="data_command", required=True
    )
    show = data.add_parser("show", help="print prompts and references, as the model sees them")
    show.add_argument("--dataset", required=True, help="gsm8k | cnndm | xsum | wmt | humaneval | mbpp")
    show.add_argument("--split", default="test", help="split (default test)")
    show.add_argument("-n", type=int, default=3, help="how many examples (default 3)")
    add_data_flags(show)
    show.set_defaults(func=cmd_data_show)

    status = data.add_parser(
        "status", help="where each dataset would come from: package, local, hub or missing"
    )
    status.add_argument("--datasets", nargs="+", required=True, help="dataset names")
    status.add_argument("--split", default="test", help="split (default test)")
    status.add_argument("--out", help="also write the JSON here")
    add_data_flags(status)
    status.set_defaults(func=cmd_data_status)

    models = sub.add_parser("models", help="the embedded models").add_subparsers(
        dest="models_command", required=True
    )
    fetch = models.add_parser("fetch", help="download, verify and convert embedded models (all by default)")
    fetch.add_argument("names", nargs="*", help="e.g. qwen2.5-coder-1.5b")
    fetch.set_defaults(func=cmd_models_fetch)
    prep = models.add_parser("prepare", help="make a target/draft pair loadable (fetches embedded ones)")
    prep.add_argument("--target", required=True, help="target: hub id, local folder or embedded:NAME")
    prep.add_argument("--draft", required=True, help="draft: hub id, local folder or embedded:NAME")
    prep.add_argument("--out", required=True, help="JSON file naming what each resolved to")
    prep.set_defaults(func=cmd_models_prepare)
    listing = models.add_parser("list", help="embedded models and whether they are fetched")
    listing.set_defaults(func=cmd_models_list)
    tiny = models.add_parser("tiny", help="write a tiny random-weight target/draft pair (tests, CI workflow)")
    tiny.add_argument("--out", required=True, help="folder; gets target/ and draft/")
    tiny.add_argument("--seed", type=int, default=0, help="weight seed (0)")
    tiny.set_defaults(func=cmd_models_tiny)

    rep = sub.add_parser("report", help="paper tables and Pareto plots from score files")
    rep.add_argument("--scores", nargs="+", required=True, help="score JSON files")
    rep.add_argument("--tables", required=True, help="output prefix, e.g. results/tables/main")
    rep.add_argument("--plots", required=True, help="output folder for PNG and SVG plots")
    rep.set_defaults(func=cmd_report)

    doc = sub.add_parser("doctor", help="check the installation, models, datasets and tracking store")
    add_data_flags(doc)
    doc.set_defaults(func=cmd_doctor)

    col = sub.add_parser(
        "collect-traces", help="roll out train prompts from a behaviour mixture; store traces"
    )
    add_model_flags(col, draft_required=True)
    col.add_argument("--dataset", required=True, help="gsm8k | cnndm | xsum | wmt | humaneval | mbpp")
    col.add_argument("--split", default="train", help="split (default train; never evaluate on it)")
    col.add_argument("--n-examples", type=int, default=32, help="prompts (default 32)")
    col.add_argument("--max-new-tokens", type=int, default=128, help="tokens per rollout (default 128)")
    col.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    col.add_argument(
        "--behaviour-weights",
        type=float,
        nargs="+",
        default=[0.5, 1.0],
        help="target weights w of mu (0.5 1.0)",
    )
    col.add_argument("--head", help="use a trained head as behaviour policy (next round)")
    col.add_argument(
        "--draft-length", type=int, default=4, help="tokens drafted per block of the speculative sampler (4)"
    )
    col.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    col.add_argument("--seed", type=int, default=42, help="subset and sampling seed (42)")
    col.add_argument("--out", required=True, help="trace folder; rerun to resume")
    col.add_argument("--quiet", action="store_true", help="no progress bar")
    col.add_argument(
        "--batch-size", type=int, default=1, help="rollouts sampled together (1); traces do not depend on it"
    )
    add_data_flags(col)
    col.set_defaults(func=cmd_collect_traces)

    tr = sub.add_parser("train-head", help="train the DIVERSED ensemble head on stored traces")
    tr.add_argument("--traces", required=True, help="folder written by collect-traces")
    tr.add_argument("--out", required=True, help="head folder to write (head.safetensors + head.json)")
    tr.add_argument("--epochs", type=int, default=4, help="passes over the traces (4)")
    tr.add_argument("--batch-size", type=int, default=8, help="sequences per step (8)")
    tr.add_argument("--lr", type=float, default=5e-4, help="AdamW learning rate (5e-4)")
    tr.add_argument(
        "--reg-lambda", type=float, default=0.1, help="weight of the acceptance reward, > 0 (0.1)"
    )
    tr.add_argument(
        "--baseline", choices=["batch", "running"], default="batch", help="reward baseline (batch)"
    )
    tr.add_argument("--hidden", type=int, default=0, help="MLP width; 0 = the paper's linear head (0)")
    tr.add_argument("--seed", type=int, default=42, help="seed (42)")
    tr.add_argument("--quiet", action="store_true", help="no progress bar")
    tr.set_defaults(func=cmd_train_head)

    bench = sub.add_parser(
        "bench", help="time autoregressive HF generate, HF assisted generation and ours on the same prompts"
    )
    bench.add_argument("--target", help="target model (default: a tiny pair built in code)")
    bench.add_argument("--draft", help="draft model (with --target)")
    bench.add_argument(
        "--dtype", default="auto", choices=DTYPES, help="model dtype (auto: see generate --help)"
    )
    bench.add_argument("--prompts", nargs="+", help="prompts (default: a few built-in ones)")
    bench.add_argument(
        "--dataset", help="take the prompts from this dataset's test split instead, e.g. humaneval"
    )
    bench.add_argument("--n-prompts", type=int, default=8, help="prompts taken from --dataset (8)")
    bench.add_argument("--data-dir", help="local dataset folder (default $DIVERSED_DATA_DIR)")
    bench.add_argument(
        "--batch-sizes", type=int, nargs="+", default=[1, 4], help="batch sizes to compare (1 4)"
    )
    bench.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (64)")
    bench.add_argument("--num-assistant-tokens", type=int, default=5, help="draft length k (5)")
    bench.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported (3)")
    bench.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    bench.add_argument(
        "--no-onednn",
        action="store_true",
        help="keep torch's default (MKL) linears instead of pre-packed oneDNN ones on CPU (diversed/cpu.py)",
    )
    bench.add_argument("--out", required=True, help="JSON file to write")
    bench.set_defaults(func=cmd_bench)
    return parser


def run_tracked(args: argparse.Namespace) -> int:
    """Run the command inside an MLflow child run: its flags as params, its JSON output as metrics."""
    from diversed.tracking import job_run

    with job_run(args.track) as run:
        args.tracker = run
        params = {k: v for k, v in vars(args).items() if k not in ("func", "tracker", "track")}
        run.params(params)
        code = args.func(args)
        out = Path(args.out) if getattr(args, "out", None) else None
        if out is not None and out.suffix == ".json" and out.is_file():
            run.metrics(json.loads(out.read_text()))
        if out is not None and (out / "head.json").is_file():
            run.metrics(json.loads((out / "head.json").read_text()).get("metrics", {}))
        if out is not None:
            run.artifact(out)
        return code


def main(argv: Sequence[str] | None = None) -> int:
    # Huge pages for torch's large CPU allocations (read when torch first allocates, so before any
    # import of it): packing a model's weights is bound by page faults (diversed.engine.cpu).
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    args.tracker = None
    try:
        if getattr(args, "dtype", None) == "auto":  # resolved here, so records name the dtype that ran
            from diversed.engine.cpu import choose_dtype

            args.dtype = choose_dtype("auto", getattr(args, "device", "cpu"))[0]
        return run_tracked(args) if args.track else args.func(args)
    except (ValueError, OSError) as err:  # ConfigError, ModelError, DataError, HeadError are ValueErrors
        parser.exit(2, f"diversed {args.command}: error: {err}\n")


if __name__ == "__main__":
    sys.exit(main())
