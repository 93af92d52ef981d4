"""Coverage of the frontier intervals on synthetic studies with a known answer (issue 49, item 2).

Three true static curves (concave, convex, and the verdict's own non-monotone GSM8K sweep), a rule
on, 6 points above and 6 points below the true frontier, n = 200 and 500 examples, 1,000 studies
per case (``diversed/evaluation/simulate.py`` builds them). For each interval method: the share of
studies whose 95% interval holds the true gap, the share that calls the rule above the frontier
(lower end > 0), and the mean error of the estimate. Resumable: each finished case is written.

    python benchmarks/frontier_coverage.py --out benchmarks/results/frontier-coverage.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

from diversed.evaluation.simulate import CURVES, Case, coverage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--studies", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=400, help="bootstrap resamples per study (400)")
    args = parser.parse_args()
    out = Path(args.out)
    record = json.loads(out.read_text()) if out.exists() else {"cases": []}
    done = {(c["curve"], c["delta"], c["n"]) for c in record["cases"]}
    record.update(
        studies=args.studies,
        resamples=args.resamples,
        commit=subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        machine=f"{platform.processor() or platform.machine()}, {platform.node()}",
    )
    for n in (200, 500):
        for curve in CURVES:
            for delta in (0.0, 6.0, -6.0):
                if (curve, delta, n) in done:
                    continue
                start = time.perf_counter()
                found = coverage(
                    Case(curve, delta, n), args.studies, seed=n + int(delta), resamples=args.resamples
                )
                record["cases"].append(
                    {
                        "curve": curve,
                        "delta": delta,
                        "n": n,
                        "methods": found,
                        "seconds": round(time.perf_counter() - start, 1),
                    }
                )
                record["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
                out.write_text(json.dumps(record, indent=1) + "\n")
                print(curve, delta, n, {k: round(v["coverage"], 3) for k, v in found.items()}, flush=True)


if __name__ == "__main__":
    main()
