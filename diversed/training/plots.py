"""Pictures of a trained head."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_weight_histogram(card: dict[str, Any], out: str | Path) -> Path:
    """``w_histogram.png`` in the head folder: where the chosen head puts its weight."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist, metrics = card["w_histogram"], card["metrics"]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.stairs(hist["counts"], hist["edges"], fill=True, alpha=0.7)
    ax.set_xlabel("target weight w")
    ax.set_ylabel("tokens")
    ax.set_title(
        f"{card['task']}: mean {metrics['w_mean']:.2f}, <0.1 {metrics['w_below_0.1']:.0%}, "
        f">0.9 {metrics['w_above_0.9']:.0%} (n = {sum(hist['counts'])})",
        fontsize=9,
    )
    fig.tight_layout()
    path = Path(out) / "w_histogram.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
