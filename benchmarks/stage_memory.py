"""Peak resident memory and wall time of each workflow stage on the embedded pair, one small job
each, measured by GNU time (``/usr/bin/time -f "%M %e"``) around the very command the rule runs
(tracked in MLflow, as there, into a scratch store); each decode job ``--repeats`` times, its log's
"ready to decode" seconds kept.

    python benchmarks/stage_memory.py --out benchmarks/results/stage-memory.json [--convert] [--repeats 3]

``--convert`` also times the one-time GGUF -> safetensors conversion of the 1.5B target into a
scratch cache (the GGUF files are linked from the real cache, nothing is downloaded).
The packed-weight store starts empty in the scratch folder: the first job (collect-traces) packs
both models and writes it, as on a fresh machine, and the decode jobs after it map it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TARGET, DRAFT = "embedded:qwen2.5-coder-1.5b", "embedded:qwen2.5-coder-0.5b"


def measure(name: str, command: list[str], env: dict[str, str] | None = None) -> dict:
    """Run ``command`` under GNU time; its peak RSS (GiB) and wall seconds."""
    run = subprocess.run(
        ["/usr/bin/time", "-f", "%M %e", *command], capture_output=True, text=True, env=env, check=False
    )
    if run.returncode != 0:
        raise RuntimeError(f"{name} failed ({run.returncode}): {run.stderr[-2000:]}")
    kib, seconds = run.stderr.strip().splitlines()[-1].split()
    ready = [line for line in run.stderr.splitlines() if "ready to decode" in line]
    row = {"stage": name, "peak_rss_gib": int(kib) / 2**20, "wall_seconds": float(seconds)}
    if ready:
        row["log"] = ready[-1].strip()
        row["ready_seconds"] = float(re.search(r"ready to decode ([0-9.]+) s", ready[-1]).group(1))
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--convert", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each decode job")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="diversed-stages-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlruns.db'}"
    os.environ["DIVERSED_PACKED_CACHE"] = str(work / "packed")  # empty: the first job packs and stores

    def exe(stage: str) -> list[str]:
        return [str(Path(sys.executable).with_name("diversed")), "--track", stage]

    models = ["--target", TARGET, "--draft", DRAFT]
    rows = []
    try:
        if args.convert:
            from diversed.files import cache_dir

            scratch = work / "cache"
            scratch.mkdir()
            (scratch / "gguf").symlink_to(cache_dir() / "gguf")
            env = {**os.environ, "DIVERSED_CACHE": str(scratch)}
            rows.append(
                measure(
                    "convert 1.5B (once)",
                    [*exe("prepare_models"), "models", "fetch", "qwen2.5-coder-1.5b"],
                    env,
                )
            )
        traces, head = work / "traces", work / "head"
        rows.append(
            measure(
                "collect-traces (2 MBPP train prompts x 32 tokens, B=2)",
                [
                    *exe("collect_traces"),
                    "collect-traces",
                    "--dataset",
                    "mbpp",
                    *models,
                    "--n-examples",
                    "2",
                    "--max-new-tokens",
                    "32",
                    "--batch-size",
                    "2",
                    "--behaviour-weights",
                    "0.5",
                    "--quiet",
                    "--out",
                    str(traces),
                ],
            )
        )
        rows.append(
            measure(
                "train-head",
                [*exe("train_head"), "train-head", "--traces", str(traces), "--out", str(head), "--quiet"],
            )
        )
        decodes = (("auto", []), ("sd", []), ("diversed", ["--head", str(head)])) * args.repeats
        for method, extra in decodes:
            out = work / f"{method}.jsonl"
            out.unlink(missing_ok=True)
            rows.append(
                measure(
                    f"decode {method} (2 HumanEval prompts x 32 tokens, B=2)",
                    [
                        *exe("decode"),
                        "decode",
                        "--dataset",
                        "humaneval",
                        "--n-examples",
                        "2",
                        "--max-new-tokens",
                        "32",
                        "--method",
                        method,
                        *models,
                        "--batch-size",
                        "2",
                        "--out",
                        str(out),
                        *extra,
                    ],
                )
            )
        score = work / "sd.json"
        rows.append(
            measure(
                "score",
                [
                    *exe("score"),
                    "score",
                    "--dataset",
                    "humaneval",
                    "--in",
                    str(work / "sd.jsonl"),
                    "--out",
                    str(score),
                ],
            )
        )
        rows.append(
            measure(
                "report",
                [
                    *exe("report"),
                    "report",
                    "--scores",
                    str(score),
                    "--tables",
                    str(work / "t" / "main"),
                    "--plots",
                    str(work / "plots"),
                ],
            )
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    from diversed.devices import choose_dtype
    from diversed.jobs.bench import provenance

    record = {"stages": rows, "dtype": "auto -> {} ({})".format(*choose_dtype("auto")), **provenance()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
