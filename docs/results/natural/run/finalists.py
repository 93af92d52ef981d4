"""The natural study's finalist rule (step 3), chosen before any test cell: per head seed, the lambda
whose last epoch has the best validation reward change against the untrained start.

The trainer's own selection kept the start for every seed (its 95% lower bounds on 8 validation
prompts are too wide to vouch for any move), so the study decodes, per seed, the trained head that
validation liked best and sets it against the static line at its own mean w.

Usage: python docs/results/natural/run/finalists.py docs/results/natural/heads/<task>/s<seed> ...
"""

import json
import sys
from pathlib import Path


def finalist(seed_dir: Path) -> str:
    """Print each lambda's last-epoch validation figures; return the finalist's lambda."""
    candidates = json.loads((seed_dir / "head.json").read_text())["selection"]["candidates"]
    last = max(c["epoch"] for c in candidates)
    finals = [c for c in candidates if c["epoch"] == last and c["reg_lambda"] is not None]
    print(seed_dir)
    for c in finals:
        print(
            f"  lambda {c['reg_lambda']:g}: reward vs start {c['val_reward_vs_start']:+.3f} "
            f"[95% lower bound {c['val_reward_vs_start_low']:+.3f}], vs static at its w "
            f"{c['val_reward_vs_static']:+.3f}, acceptance {c['val_acceptance']:.3f}, "
            f"w {c['val_mean_weight']:.3f}"
        )
    best = max(finals, key=lambda c: c["val_reward_vs_start"])
    print(f"  finalist: lambda {best['reg_lambda']:g}")
    return f"{best['reg_lambda']:g}"


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        finalist(Path(folder))
