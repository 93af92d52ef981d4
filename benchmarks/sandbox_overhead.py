"""Sandbox overhead per program: ``run_program("pass")`` against a bare ``python -c pass``.

Both start the same interpreter; the difference is the launcher (a second, site-less interpreter
start), the namespaces, the mounts of the private root and the temporary files. Interleaved runs,
medians, and the fences the sandbox reported. Usage:

    python benchmarks/sandbox_overhead.py --runs 50 --out benchmarks/results/sandbox-overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from diversed.sandbox import _layout, run_program


def bare(interpreter: str) -> float:
    start = time.perf_counter()
    subprocess.run([interpreter, "-I", "-B", "-c", "pass"], check=True)
    return time.perf_counter() - start


def sandboxed() -> tuple[float, list[str], list[str]]:
    start = time.perf_counter()
    result = run_program("pass\n")
    seconds = time.perf_counter() - start
    if not result.passed:
        raise RuntimeError(f"the sandbox failed to run 'pass': {result.reason}")
    return seconds, result.enforced, result.missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    interpreter = _layout()["interpreter"]
    bare(interpreter), sandboxed()  # warm the page cache and the layout
    plain, fenced = [], []
    for _ in range(args.runs):
        plain.append(bare(interpreter))
        seconds, enforced, missing = sandboxed()
        fenced.append(seconds)
    record = {
        "runs": args.runs,
        "bare_python_ms": 1000 * statistics.median(plain),
        "sandboxed_ms": 1000 * statistics.median(fenced),
        "overhead_ms": 1000 * (statistics.median(fenced) - statistics.median(plain)),
        "sandboxed_p90_ms": 1000 * statistics.quantiles(fenced, n=10)[-1],
        "enforced": enforced,
        "missing": missing,
        "caller": "root" if os.geteuid() == 0 else "non-root",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%d"),
    }
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
