"""Commands of the DIVERSED head: ``collect-traces``, ``train-head`` and ``check-head``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from diversed.cli.flags import (
    add_data_flags,
    add_device_flag,
    add_model_flags,
    add_run_flags,
    add_sandbox_flag,
    add_stop_flag,
    check_step_device,
    from_args,
    run_options,
)
from diversed.sandbox import parse_mode


def cmd_collect_traces(args: argparse.Namespace) -> int:
    from diversed.jobs.traces import TraceJob, collect_traces

    job = from_args(
        TraceJob, args, behaviour_weights=tuple(args.behaviour_weights), sandbox=parse_mode(args.sandbox)
    )
    check_step_device(args)
    out = collect_traces(job, args.out, run_options(args), args.data_dir, not args.no_hub, args.replace_stale)
    print(out)
    return 0


def cmd_train_head(args: argparse.Namespace) -> int:
    from diversed.training import TrainConfig, plot_weight_histogram, train_from_traces

    cfg = from_args(TrainConfig, args, reg_lambda=args.reg_lambda[0])
    log_step = (lambda step, figures: args.tracker.metrics(figures, step)) if args.tracker else None
    card = train_from_traces(
        args.traces,
        args.out,
        cfg,
        args.reg_lambda,
        args.validation_share,
        args.acceptance_value,
        args.init,
        log_step=log_step,
        progress=not args.quiet,
        confidence=args.confidence,
        device=args.device,
        min_weight_std=args.min_weight_std,
    )
    plot_weight_histogram(card, args.out)  # beside head.json: a tracked run logs the whole folder
    print(json.dumps({"out": args.out, **card["metrics"]}, indent=2))
    return 0


def cmd_check_head(args: argparse.Namespace) -> int:
    from diversed.jobs.check import CheckJob, check_head
    from diversed.training import plot_weight_histogram

    check_step_device(args)
    record = check_head(
        args.candidate,
        args.out,
        args.traces,
        from_args(CheckJob, args, sandbox=parse_mode(args.sandbox)),
        args.log,
        run_options(args),
        args.data_dir,
        not args.no_hub,
    )
    plot_weight_histogram(json.loads((Path(args.out) / "head.json").read_text()), args.out)
    print(json.dumps({k: v for k, v in record.items() if k != "job"}, indent=2))
    return 0


def add_collect_traces(sub: argparse._SubParsersAction) -> None:
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
    col.add_argument("--head", help="use a trained head (or oracle:digits) as behaviour policy (next round)")
    col.add_argument(
        "--draft-length", type=int, default=4, help="tokens drafted per block of the speculative sampler (4)"
    )
    col.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    col.add_argument("--seed", type=int, default=42, help="subset and sampling seed (42)")
    col.add_argument(
        "--rollouts",
        type=int,
        default=1,
        help="samples of each prompt and behaviour, rolled out together (1)",
    )
    col.add_argument(
        "--partial-credit",
        action="store_true",
        help="code rewards: the share of the task's asserts passed (MBPP), not 1 only when all pass",
    )
    col.add_argument("--out", required=True, help="trace folder; rerun to resume")
    col.add_argument(
        "--replace-stale",
        action="store_true",
        help="delete traces in --out made with other settings (or another head) instead of stopping",
    )
    add_run_flags(col, 1, "rollouts")
    add_sandbox_flag(col)
    add_stop_flag(col)
    add_data_flags(col)
    col.set_defaults(func=cmd_collect_traces)


def add_train_head(sub: argparse._SubParsersAction) -> None:
    tr = sub.add_parser("train-head", help="train the DIVERSED ensemble head on stored traces")
    tr.add_argument(
        "--traces", required=True, nargs="+", help="folder(s) written by collect-traces (every round so far)"
    )
    tr.add_argument("--out", required=True, help="head folder to write (head.safetensors + head.json)")
    tr.add_argument("--init", help="start from this head (the previous round's)")
    tr.add_argument("--epochs", type=int, default=4, help="passes over the traces; each is a checkpoint (4)")
    tr.add_argument("--batch-size", type=int, default=8, help="sequences per step (8)")
    tr.add_argument("--lr", type=float, default=5e-4, help="AdamW learning rate (5e-4)")
    tr.add_argument(
        "--reg-lambda",
        type=float,
        nargs="+",
        default=[1.0],
        help="weight(s) of the acceptance reward, > 0; several: one head each, chosen on validation (1.0)",
    )
    tr.add_argument(
        "--reg-scale",
        choices=["relative", "fixed"],
        default="relative",
        help="relative: lambda x the reward signal's strength, inside the trust region; fixed: the old loss",
    )
    tr.add_argument(
        "--baseline",
        choices=["auto", "group", "batch", "running", "minus_one"],
        default="auto",
        help="reward baseline; auto: with group rollouts (--rollouts G) the group's leave-one-out mean,"
        " else r - 1 for pass/fail rewards, else a running mean (auto)",
    )
    tr.add_argument(
        "--validation-share",
        type=float,
        default=0.25,
        help="share of the trace prompts held out to choose lambda and the epoch (0.25)",
    )
    tr.add_argument(
        "--acceptance-value",
        type=float,
        default=1.0,
        help="reward units one unit of acceptance is worth: checkpoints are ranked by validation reward gain"
        " + this x validation acceptance (1.0)",
    )
    tr.add_argument(
        "--min-weight-std",
        type=float,
        default=0.05,
        help="a checkpoint whose w varies less than this (standard deviation over the validation tokens) is a"
        " static rule in effect, kept only when every trained one is (0.05)",
    )
    tr.add_argument(
        "--confidence",
        type=float,
        default=0.95,
        help="one-sided confidence of the reward bounds each checkpoint's card reports (0.95)",
    )
    tr.add_argument("--hidden", type=int, default=0, help="MLP width; 0 = the paper's linear head (0)")
    tr.add_argument(
        "--signals",
        action="store_true",
        help="the head also reads TV(p, q) and both models' entropies beside the hidden states"
        " (beyond the paper)",
    )
    tr.add_argument("--seed", type=int, default=42, help="seed (42)")
    add_device_flag(tr)
    tr.add_argument("--quiet", action="store_true", help="no progress bar")
    tr.set_defaults(func=cmd_train_head)


def add_check_head(sub: argparse._SubParsersAction) -> None:
    ch = sub.add_parser(
        "check-head",
        help="roll out held-out train prompts under a trained head and under the static rule at its own"
        " mean w (same seeds); keep the head with the verdict in its card",
    )
    add_model_flags(ch, draft_required=True)
    ch.add_argument("--candidate", required=True, help="the head folder train-head wrote")
    ch.add_argument(
        "--traces", required=True, nargs="+", help="its trace folders: their prompts are never checked on"
    )
    ch.add_argument("--out", required=True, help="folder for the kept head, its card carrying the verdict")
    ch.add_argument("--log", help="rollouts, JSON lines, to resume from (default: OUT.check.jsonl)")
    ch.add_argument("--dataset", required=True, help="the traces' task")
    ch.add_argument("--split", default="train", help="split of the held-out prompts (train)")
    ch.add_argument("--n-examples", type=int, default=16, help="held-out prompts (16); 0: no check")
    ch.add_argument("--rollouts", type=int, default=2, help="samples of each prompt under each arm (2)")
    ch.add_argument("--max-new-tokens", type=int, default=128, help="tokens per rollout (128)")
    ch.add_argument("--temperature", type=float, default=1.0, help="sampling temperature, > 0 (1.0)")
    ch.add_argument("--draft-length", type=int, default=4, help="tokens drafted per block (4)")
    ch.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    ch.add_argument("--seed", type=int, default=1042, help="orders the split and seeds the rollouts (1042)")
    ch.add_argument(
        "--confidence", type=float, default=0.95, help="two-sided confidence of the intervals (0.95)"
    )
    ch.add_argument(
        "--partial-credit", action="store_true", help="code rewards as the share of asserts passed"
    )
    ch.add_argument(
        "--acceptance-value",
        type=float,
        default=1.0,
        help="reward units one unit of acceptance is worth in the verdict's J (1.0)",
    )
    add_sandbox_flag(ch)
    add_stop_flag(ch)
    add_run_flags(ch, 4, "rollouts")
    add_data_flags(ch)
    ch.set_defaults(func=cmd_check_head)
