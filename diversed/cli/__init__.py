"""The ``diversed`` command line: the parser and ``main``; each command sits with its kind in
this folder (decoding, head, results, tools; shared flags in flags).

Flags use dashes; the original project's underscore spellings (``--num_assistant_tokens``,
``--draft_ensemble_weights``, ``--max_tokens``, ``--do_sample``, ...) are accepted as aliases. The
top layer: it may import every other package, and none imports it.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path

from diversed.cli import decoding, results, tools, training


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diversed", description="Relaxed speculative decoding (DIVERSED) on stock transformers."
    )
    parser.add_argument(
        "--track",
        metavar="'STAGE [CELL ...]'",
        help="log this command as an MLflow child run named by its stage and cell, e.g."
        " 'decode humaneval sd-k4-T1' (the workflow's jobs); the first word is its stage tag",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    decoding.add_generate(sub)
    decoding.add_decode(sub)
    results.add_score(sub)
    results.add_export(sub)
    results.add_confirm(sub)
    tools.add_data(sub)
    tools.add_models(sub)
    results.add_report(sub)
    results.add_specbench(sub)
    results.add_gate_thresholds(sub)
    tools.add_doctor(sub)
    tools.add_stage_times(sub)
    tools.add_tracking_server(sub)
    training.add_collect_traces(sub)
    training.add_train_head(sub)
    training.add_check_head(sub)
    decoding.add_bench(sub)
    return parser


def resolve_choices(args: argparse.Namespace) -> None:
    """``--device auto``, then ``--dtype auto`` and ``--quantize auto`` for that device, resolved
    here before anything loads, so records name what ran; an fp16 request checked against the device."""
    if getattr(args, "device", None) is not None:
        from diversed.devices import resolve_device

        args.device = resolve_device(args.device)
    device = getattr(args, "device", "cpu")
    if getattr(args, "dtype", None) == "auto":
        from diversed.devices import choose_dtype

        args.dtype = choose_dtype("auto", device)[0]
    if getattr(args, "quantize", None):
        from diversed.backends.cpu.quantize import choose_quantize

        args.quantize = choose_quantize(args.quantize, args.dtype, device)[0]


def run_tracked(args: argparse.Namespace) -> int:
    """Run the command inside an MLflow child run: its flags as params, its JSON output as metrics.
    The run's process starts first, so that it opens the store while this one imports torch."""
    from diversed.pipeline.tracking import job_run

    with job_run(args.track) as run:
        resolve_choices(args)
        args.tracker = run
        params = {k: v for k, v in vars(args).items() if k not in ("func", "tracker", "track")}
        run.params(params)
        code = args.func(args)
        out = Path(args.out) if getattr(args, "out", None) else None
        if out is not None and out.suffix == ".json" and out.is_file():
            run.metrics(json.loads(out.read_text()))
        if out is not None and ".jsonl" in out.suffixes and out.is_file():  # a decode job: its efficiency
            from diversed.evaluation.score import efficiency, read_records

            run.metrics(efficiency(read_records(out)))
        if out is not None and (out / "manifest.json").is_file():  # a trace collection: its summary
            from diversed.training.traces import collection_figures

            run.metrics(collection_figures(out))
            run.artifact(out / "manifest.json")  # the sequences' tensors (GBs) stay on disk
        elif out is not None:
            run.artifact(out)
        if out is not None and (out / "head.json").is_file():
            run.metrics(json.loads((out / "head.json").read_text()).get("metrics", {}))
        return code


def main(argv: Sequence[str] | None = None) -> int:
    # Huge pages for torch's large CPU allocations (read when torch first allocates, so before any
    # import of it): packing a model's weights is bound by page faults (diversed.backends.cpu.onednn).
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    args.tracker = None
    try:
        if args.track:
            return run_tracked(args)
        resolve_choices(args)
        return args.func(args)
    except (ValueError, OSError) as err:  # ConfigError, ModelError, DataError, HeadError are ValueErrors
        parser.exit(2, f"diversed {args.command}: error: {err}\n")
