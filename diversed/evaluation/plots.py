"""The paper's pictures from the workflow's score rows (:func:`diversed.evaluation.report.load_scores`), and
the histogram of each head's w on its decoded test tokens. One panel per dataset and temperature:
quality against acceptance and against time, with error bars (95% bootstrap intervals), the
static-ensemble sweep as a labelled line, a marker per method and DIVERSED distinct (the paper's
Pareto picture); speed-up against draft length with Leviathan's prediction from the measured
acceptance alpha, draft/target step ratio c and verification cost.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from diversed.engine.stats import leviathan_speedup
from diversed.evaluation.comparisons import static_sweep
from diversed.evaluation.frontier import hull
from diversed.evaluation.report import METHOD_ORDER
from diversed.evaluation.tables import cell_sizes


def write_plots(rows: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    datasets = sorted({r["dataset"] for r in rows})
    panels = sorted({(r["dataset"], r["temperature"]) for r in rows})
    written: list[Path] = []
    for x_key, x_label, name in (
        ("acceptance_rate", "acceptance rate", "quality_vs_acceptance"),
        ("seconds_per_example", "seconds per example (batch 1)", "quality_vs_time"),
    ):
        fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 4), squeeze=False)
        for ax, (dataset, temperature) in zip(axes[0], panels, strict=True):
            panel = [r for r in rows if (r["dataset"], r["temperature"]) == (dataset, temperature)]
            mine = [r for r in panel if r[x_key] is not None]
            _pareto_panel(ax, mine, x_key)
            for r in panel:  # auto has no acceptance: its quality is a reference band across the panel
                if r[x_key] is None and r["method"] == "auto":
                    _reference_band(ax, r)
            if not mine:  # latency is printed only from enough batch-1 examples (report.load_scores)
                ax.text(
                    0.5,
                    0.5,
                    "not measured at batch 1 on enough examples",
                    ha="center",
                    transform=ax.transAxes,
                )
            n = cell_sizes(mine).get(dataset, "?") if mine else "?"
            ax.set_title(f"{dataset}, T = {temperature:g} (n = {n} per point)", fontsize=9)
            ax.set_xlabel(x_label)
            ax.set_ylabel(f"{mine[0]['quality_name']} (95% CI)" if mine else "quality")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:  # an empty latency panel has nothing to name
                ax.legend(fontsize=7, loc="best")
        written += _save(fig, out, name, plt)
    written += _speedup_plot(rows, datasets, out, plt)
    written += _weights_plot(rows, out, plt)
    return written


def _weights_plot(rows, out: Path, plt) -> list[Path]:
    """Histogram of w on the decoded test tokens, one panel per setting with per-token weights."""
    weighted = [r for r in rows if r.get("w_test")]
    if not weighted:
        return []
    fig, axes = plt.subplots(1, len(weighted), figsize=(4.5 * len(weighted), 3.2), squeeze=False)
    for ax, r in zip(axes[0], weighted, strict=True):
        w = r["w_test"]
        ax.stairs(w["histogram"]["counts"], w["histogram"]["edges"], fill=True, alpha=0.7)
        summary = f"mean {w['w_mean']:.2f}, std {w['w_std']:.2f}, n = {w['tokens']} tokens"
        ax.set_title(f"{r['dataset']} {r['setting']}\n{summary}", fontsize=8)  # two lines: long names fit
        ax.set_xlabel("target weight w on decoded tokens")
        ax.set_ylabel("tokens")
    return _save(fig, out, "w_test_histogram", plt)


def _save(fig, out: Path, name: str, plt) -> list[Path]:
    """``name``.png and .svg in ``out``; the figure is closed."""
    fig.tight_layout()
    paths = [out / f"{name}{suffix}" for suffix in (".png", ".svg")]
    for path in paths:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return paths


MARKERS = {"auto": "s", "sd": "o", "lossy": "v", "cascade": "D", "gate": "^", "diversed": "*"}
# Each training-free gate is a family swept over its threshold: a line of its own, like static's.
GATE_COLOURS = {"tv": "tab:olive", "kl": "tab:cyan", "entropy": "tab:brown"}
# One colour per method in every panel: matplotlib's cycle recolours a method by what else a panel holds.
COLOURS = {
    "auto": "tab:purple",
    "sd": "tab:blue",
    "lossy": "tab:orange",
    "cascade": "tab:red",
    "diversed": "tab:green",
}


def _errors(rows: list[dict[str, Any]], key: str):
    """Asymmetric error bars [2, n] from ``key_ci`` (zero where a point has no interval)."""
    low, high = [], []
    for r in rows:
        interval = r.get(f"{key}_ci") or (r[key], r[key])
        low.append(max(r[key] - interval[0], 0.0))
        high.append(max(interval[1] - r[key], 0.0))
    return [low, high]


def _pareto_panel(ax, rows: list[dict[str, Any]], x_key: str) -> None:
    """The static sweep (:func:`static_sweep`) as a labelled line (w beside each point), every other
    setting a marker of its method, DIVERSED a large star; all with their 95% intervals as error bars."""
    weighted = static_sweep(rows)
    sweep = [r for _, r in weighted]
    if sweep:
        _family_line(ax, sweep, x_key, "-o", "grey", 4, "static ensemble, w = 0 ... 1")
        if x_key == "acceptance_rate":  # what mixing static weights over examples can reach
            edge = hull([(r[x_key], r["quality"]) for r in sweep])
            ax.plot(
                *zip(*edge, strict=True),
                ls="--",
                color="black",
                lw=1,
                label="static frontier (concave envelope)",
            )
        for w, r in weighted:
            ax.annotate(
                f"w={w:g}" + (" (sd)" if r["method"] == "sd" else ""),
                (r[x_key], r["quality"]),
                fontsize=6,
                xytext=(3, -8),
                textcoords="offset points",
                color="grey",
            )
    for signal, colour in GATE_COLOURS.items():
        family = [r for r in rows if r["method"] == "gate" and r["gate"] == signal]
        if family:
            family.sort(key=lambda r: r[x_key])
            thresholds = ", ".join(f"{r['gate_threshold']:g}" for r in family)
            _family_line(ax, family, x_key, "-^", colour, 5, f"gate {signal}, t = {thresholds}")
    for method in [m for m in METHOD_ORDER if m not in ("static", "gate")]:
        points = [r for r in rows if r["method"] == method]
        if not points:
            continue
        labels = sorted({r["setting"] for r in points})
        ax.errorbar(
            [r[x_key] for r in points],
            [r["quality"] for r in points],
            xerr=_errors(points, x_key),
            yerr=_errors(points, "quality"),
            fmt=MARKERS.get(method, "o"),
            color=COLOURS.get(method),
            ms=14 if method == "diversed" else 6,
            capsize=2,
            zorder=4 if method == "diversed" else 3,
            label=labels[0] if len(labels) == 1 else method,
        )
        if len(labels) > 1:  # several settings share the method's marker: name each, upright above its bar
            for r in points:
                top = (r.get("quality_ci") or [None, r["quality"]])[1]
                ax.annotate(
                    re.sub(r" T=\S+$", "", r["setting"].removeprefix(method).strip()),
                    (r[x_key], top),
                    fontsize=6,
                    xytext=(0, 3),
                    textcoords="offset points",
                    rotation=90,
                    ha="center",
                    va="bottom",
                    color=COLOURS.get(method),
                )


def _family_line(
    ax, family: list[dict[str, Any]], x_key: str, fmt: str, colour: str, size: int, label: str
) -> None:
    """A method swept over one knob (static over w, a gate over its threshold) as one line."""
    ax.errorbar(
        [r[x_key] for r in family],
        [r["quality"] for r in family],
        xerr=_errors(family, x_key),
        yerr=_errors(family, "quality"),
        fmt=fmt,
        color=colour,
        ms=size,
        capsize=2,
        label=label,
    )


def _reference_band(ax, row: dict[str, Any]) -> None:
    """A setting without an x value (auto on the acceptance axis) as its quality line and 95% band."""
    ax.axhline(row["quality"], color=COLOURS.get(row["method"]), ls="--", lw=1, label=row["setting"])
    if row.get("quality_ci"):
        ax.axhspan(*row["quality_ci"], color=COLOURS.get(row["method"]), alpha=0.08, lw=0)


def _speedup_plot(rows, datasets, out: Path, plt) -> list[Path]:
    """Measured speed-up of sd against draft length, with Leviathan's prediction from measured alpha, c."""
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 4), squeeze=False)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        for temperature in sorted({r["temperature"] for r in rows if r["dataset"] == dataset}):
            sd = sorted(
                (
                    r
                    for r in rows
                    if r["dataset"] == dataset and r["method"] == "sd" and r["temperature"] == temperature
                ),
                key=lambda r: r["k"],
            )
            auto = [
                r
                for r in rows
                if r["dataset"] == dataset and r["method"] == "auto" and r["temperature"] == temperature
            ]
            if not sd or not auto or not auto[0]["target_step_seconds"]:
                continue
            step = auto[0]["target_step_seconds"]
            measured = [float("nan") if r["speedup"] is None else r["speedup"] for r in sd]
            predicted = [
                leviathan_speedup(
                    r["acceptance_rate"],
                    r["k"],
                    r["draft_step_seconds"] / step,
                    r["target_step_seconds"] / step,
                )
                for r in sd
            ]
            ks = [r["k"] for r in sd]
            ax.plot(ks, measured, "o-", label=f"measured T={temperature:g}")
            ax.plot(ks, predicted, "x--", label=f"Leviathan (measured alpha, c) T={temperature:g}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(dataset)
        ax.set_xlabel("draft length k")
        ax.set_ylabel("speed-up over auto")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:  # no auto cell to measure against yet
            ax.text(0.5, 0.5, "no auto run at this temperature", ha="center", transform=ax.transAxes)
    return _save(fig, out, "speedup_vs_draft_length", plt)
