"""Is the CPU path as fast as it was? Two commits' engines side by side on the embedded pair.

Each commit is checked out in a git worktree and run in processes of its own (``PYTHONPATH`` set to
that worktree), alternating base, head, base, head ... so that load from anything else on the
machine falls on both alike. Every process loads the pair as a decode job does (in the dtype
``--dtype auto`` picks: bf16 where the CPU has it) and times greedy ``auto`` and ``sd`` at batch 1
and batch B on the same HumanEval prompts after one untimed warm-up batch. Prints and writes the
median tokens/s per commit and case, head over base, and whether the two commits produced the same
tokens.

    .venv/bin/python benchmarks/cpu_regression.py --base af8cd1b^ \\
        --out benchmarks/results/cpu-regression-<machine>.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = (("auto", 1), ("sd", 1), ("auto", "B"), ("sd", "B"))


def child(prompts: int, new_tokens: int, batch: int, dtype: str) -> dict:
    """One process's timings, from whichever ``diversed`` its ``PYTHONPATH`` names."""
    from diversed import DecodeConfig
    from diversed.data import load_examples
    from diversed.loading.models import prompt_ids
    from diversed.loading.stack import load_stack

    embedded = ("embedded:qwen2.5-coder-1.5b", "embedded:qwen2.5-coder-0.5b")
    stack = load_stack(embedded[0], embedded[1], dtype, "cpu", "none")
    examples = load_examples("humaneval", "test", prompts, allow_hub=False)
    ids = [prompt_ids(stack.tokenizer, e.prompt, False) for e in examples]
    cases = {}
    for method, size in CASES:
        size = batch if size == "B" else size
        knobs = {"method": method, "max_new_tokens": new_tokens, "num_assistant_tokens": 4}
        config = DecodeConfig.from_dict(knobs)
        decoder = stack.decoder(config)
        decoder.generate_batch(ids[:size])  # warm-up: first-call allocations and kernel choices
        start = time.perf_counter()
        tokens = []
        for i in range(0, len(ids), size):
            tokens += [g.token_ids for g in decoder.generate_batch(ids[i : i + size])]
        seconds = time.perf_counter() - start
        cases[f"{method}@{size}"] = {"tok_s": sum(map(len, tokens)) / seconds, "tokens": tokens}
    return {"dtype": str(stack.target.dtype), "cases": cases}


def worktree(commit: str, folder: Path) -> tuple[Path, str]:
    """A detached worktree of ``commit`` in ``folder`` and its full hash."""
    full = subprocess.run(["git", "rev-parse", commit], cwd=ROOT, capture_output=True, text=True, check=True)
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), commit], cwd=ROOT, check=True)
    return folder, full.stdout.strip()


def run_child(tree: Path, args: argparse.Namespace) -> dict:
    argv = [sys.executable, __file__, "--child", "--prompts", str(args.prompts)]
    argv += ["--new-tokens", str(args.new_tokens), "--batch", str(args.batch), "--dtype", args.dtype]
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(argv, env=environment, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the engine at {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="the commit to compare against (e.g. the one before a change)")
    parser.add_argument("--head", default="HEAD", help="the commit under test (HEAD)")
    parser.add_argument("--prompts", type=int, default=4, help="HumanEval test prompts (4)")
    parser.add_argument("--new-tokens", type=int, default=64, help="greedy tokens per prompt (64)")
    parser.add_argument("--batch", type=int, default=4, help="the batched cases' B (4)")
    parser.add_argument("--repeats", type=int, default=3, help="processes per commit (3)")
    parser.add_argument("--dtype", help="both models' dtype (default: what --dtype auto picks here)")
    parser.add_argument("--out", help="JSON record to write")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.prompts, args.new_tokens, args.batch, args.dtype)))
        return None
    if not args.base:
        parser.error("--base is required")
    if not args.dtype:
        from diversed.devices import choose_dtype

        args.dtype = choose_dtype("auto", "cpu")[0]  # bf16 where the CPU has it, as a decode job runs
    started = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        trees = {}
        try:
            for name in ("base", "head"):
                commit = getattr(args, name)
                trees[name] = worktree(commit, Path(scratch) / name)
            runs: dict[str, list[dict]] = {"base": [], "head": []}
            for repeat in range(args.repeats):
                for name in ("base", "head") if repeat % 2 == 0 else ("head", "base"):
                    runs[name].append(run_child(trees[name][0], args))
                    print(name, repeat, {c: round(v["tok_s"], 2) for c, v in runs[name][-1]["cases"].items()})
        finally:
            for tree, _ in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    cases = {}
    for case in runs["head"][0]["cases"]:
        median = {n: statistics.median(r["cases"][case]["tok_s"] for r in runs[n]) for n in runs}
        cases[case] = {
            "tok_s": median,
            "head_over_base": median["head"] / median["base"],
            "runs": {n: [r["cases"][case]["tok_s"] for r in runs[n]] for n in runs},
            "identical": all(
                r["cases"][case]["tokens"] == runs["base"][0]["cases"][case]["tokens"]
                for n in runs
                for r in runs[n]
            ),
        }
        print(case, json.dumps({k: v for k, v in cases[case].items() if k != "runs"}), flush=True)
    import torch

    from diversed.devices import native_bf16
    from diversed.jobs import bench

    record = {
        **bench.provenance(),
        "cpu": {"capability": torch.backends.cpu.get_cpu_capability(), "native_bf16": native_bf16()},
        "commits": {n: trees[n][1] for n in trees},
        "pair": "embedded qwen2.5-coder-1.5b / 0.5b",
        "dtype": runs["head"][0]["dtype"],
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "wall_seconds": round(time.time() - started, 1),
        "cases": cases,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    return record


if __name__ == "__main__":
    main()
