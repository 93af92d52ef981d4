"""Paper-style tables and Pareto plots from the workflow's score files.

``main.{md,csv,tex}``: one row per method setting, one column group per dataset: acceptance rate,
mean accepted length, the task's quality metric, seconds per example and speed-up over ``auto``
at the same temperature (same machine, same run), both measured at batch 1 as the paper does,
and the job's throughput at its decoding batch size; each timing column names its batch size.
Plots: quality against acceptance and against
time, with the static-ensemble sweep drawn as a line and the other methods as labelled points
(the paper's Pareto picture); speed-up against draft length with Leviathan's prediction from the
measured acceptance alpha, draft/target step ratio c and verification cost.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diversed.data import get_task
from diversed.engine.stats import leviathan_speedup

QUALITY = {"accuracy": "accuracy", "rouge": "rouge2", "bleu": "bleu", "pass@1": "pass@1"}


def setting_label(s: dict[str, Any]) -> str:
    """A short human name of a method setting, e.g. 'static w=0.7 k=5 T=0'."""
    method = s["method"]
    parts = [method]
    if method == "static":
        parts.append(
            f"w={s['target_weight']:g}" + (" (logits)" if s.get("ensemble_space") == "logits" else "")
        )
    elif method == "lossy":
        parts.append(f"l={s['lenience']:g}")
    elif method == "cascade":
        parts.append(f"{s['cascade_rule']} a={s['cascade_alpha']:g}")
    if method != "auto":
        parts.append(f"k={s['num_assistant_tokens']}")
        if s.get("schedule", "constant") != "constant":
            parts.append(s["schedule"])
    parts.append(f"T={s['temperature']:g}")
    head = Path(s["head"]).name if s.get("head") else None
    if head and head != s.get("dataset"):
        parts.append(f"(head: {head.replace('.', '/')})")  # a head trained on another task or split
    return " ".join(parts)


def load_scores(paths: list[str | Path]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        score = json.loads(Path(path).read_text())
        task = get_task(score["dataset"])
        settings = score["settings"]
        rows.append(
            {
                "dataset": score["dataset"],
                "setting": setting_label(settings),
                "method": settings["method"],
                "temperature": settings["temperature"],
                "k": settings["num_assistant_tokens"],
                "target_weight": settings.get("target_weight"),
                "quality_name": QUALITY[task.metric],
                "quality": score[QUALITY[task.metric]],
                "acceptance_rate": score["acceptance_rate"],
                "mean_accepted_length": score["mean_accepted_length"],
                "seconds_per_example": score["seconds_per_example"],
                "tokens_per_second": score["tokens_per_second"],
                "batch_size": score.get("batch_size", 1),
                "target_step_seconds": score.get("target_step_seconds"),
                "draft_step_seconds": score.get("draft_step_seconds"),
            }
        )
    for row in rows:  # speed-up over auto of the same dataset and temperature
        auto = [
            r
            for r in rows
            if r["method"] == "auto"
            and r["dataset"] == row["dataset"]
            and r["temperature"] == row["temperature"]
        ]
        latency = row["seconds_per_example"]
        row["speedup"] = auto[0]["seconds_per_example"] / latency if auto and latency else None
    return rows


def main_table(rows: list[dict[str, Any]]):
    """A wide DataFrame: settings x (dataset, figure)."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    figures = [
        "acceptance_rate",
        "mean_accepted_length",
        "quality",
        "seconds_per_example",
        "speedup",
        "tokens_per_second",
    ]
    wide = frame.pivot_table(index="setting", columns="dataset", values=figures, aggfunc="first")
    wide = wide.swaplevel(0, 1, axis=1).sort_index(axis=1, level=0)
    order = {"auto": 0, "sd": 1, "lossy": 2, "static": 3, "cascade": 4, "diversed": 5}
    wide = wide.loc[sorted(wide.index, key=lambda s: (order.get(s.split()[0], 9), s))]
    names = {r["dataset"]: r["quality_name"] for r in rows}
    batch = max(r["batch_size"] for r in rows)
    timing = {
        "seconds_per_example": "s/example (B=1)",
        "speedup": "speed-up (B=1)",
        "tokens_per_second": f"tok/s (B={batch})",
    }
    wide.columns = [f"{d} {names[d] if f == 'quality' else timing.get(f, f)}" for d, f in wide.columns]
    return wide


def write_tables(rows: list[dict[str, Any]], out_prefix: str | Path) -> list[Path]:
    out = Path(out_prefix)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = main_table(rows)
    paths = [out.with_suffix(".csv"), out.with_suffix(".md"), out.with_suffix(".tex")]
    table.to_csv(paths[0], float_format="%.4g")
    paths[1].write_text(table.to_markdown(floatfmt=".3g") + "\n")
    paths[2].write_text(table.to_latex(float_format="%.3g", na_rep="--") + "\n")
    return paths


def write_plots(rows: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    datasets = sorted({r["dataset"] for r in rows})
    written: list[Path] = []
    for x_key, x_label, name in (
        ("acceptance_rate", "acceptance rate", "quality_vs_acceptance"),
        ("seconds_per_example", "seconds per example (batch 1)", "quality_vs_time"),
    ):
        fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 4), squeeze=False)
        for ax, dataset in zip(axes[0], datasets, strict=True):
            mine = [r for r in rows if r["dataset"] == dataset and r[x_key] is not None]
            for temperature in sorted({r["temperature"] for r in mine}):
                sweep = sorted(
                    (r for r in mine if r["method"] == "static" and r["temperature"] == temperature),
                    key=lambda r: r["target_weight"],
                )
                if sweep:
                    ax.plot(
                        [r[x_key] for r in sweep],
                        [r["quality"] for r in sweep],
                        "o-",
                        label=f"static sweep T={temperature:g}",
                    )
            for r in mine:
                if r["method"] != "static":
                    ax.scatter(r[x_key], r["quality"], marker="s", zorder=3)
                    ax.annotate(
                        r["setting"],
                        (r[x_key], r["quality"]),
                        fontsize=7,
                        xytext=(3, 3),
                        textcoords="offset points",
                    )
            ax.set_title(dataset)
            ax.set_xlabel(x_label)
            ax.set_ylabel(mine[0]["quality_name"] if mine else "quality")
            ax.legend(fontsize=7)
        fig.tight_layout()
        for suffix in (".png", ".svg"):
            fig.savefig(out / f"{name}{suffix}", dpi=120)
            written.append(out / f"{name}{suffix}")
        plt.close(fig)
    written += _speedup_plot(rows, datasets, out, plt)
    return written


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
            measured = [r["speedup"] for r in sd]
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
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths = []
    for suffix in (".png", ".svg"):
        fig.savefig(out / f"speedup_vs_draft_length{suffix}", dpi=120)
        paths.append(out / f"speedup_vs_draft_length{suffix}")
    plt.close(fig)
    return paths
