"""Paper-style tables of the report rows (:mod:`diversed.evaluation.report`), every figure with its n
and its 95% bootstrap interval.

``main.{md,csv,tex}``: one row per method setting, one column group per dataset: the number of
examples n, the share of completions that ended on their own (EOS or a stop string, not the token
budget: a cut-off completion scores as wrong), acceptance rate, mean accepted length, the task's
quality metric, seconds per example (each printed as ``value [low, high]``; the CSV has
``_low``/``_high`` columns) and speed-up over ``auto`` at the same temperature (same machine, same
run), both measured at batch 1 as the paper does, and the job's throughput at its decoding batch
size; each timing column names its batch size. ``paired_vs_sd.{md,csv}``: each setting minus ``sd``
at the same temperature and draft length on the same examples (quality and acceptance, paired
intervals), and for DIVERSED and the other non-static rules their quality minus the static frontier
at the same acceptance (:mod:`diversed.evaluation.frontier`; paired over every static setting's
examples) with its interval when all the rules of the cell must hold together, minus the neighbour
line of the sweep, and the 80%-power effect of each comparison.
``frontier.md``: the verdict, each relaxed rule minus the static frontier. ``weights.md``: where
each head put its weight on its decoded test tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diversed.evaluation import frontier
from diversed.evaluation.report import CI_FIGURES, METHOD_ORDER, head_note


def effect_80(interval: list[float] | None) -> str:
    """The smallest true difference a paired comparison detects with 80% power (two-sided 5%),
    from its 95% interval: (z_0.975 + z_0.8) standard errors, about 1.43 half-widths. A zero-width
    interval (two arms alike on every example) has no spread to measure power by: ``--``."""
    if not interval or interval[1] == interval[0]:
        return "--"
    return f"{frontier.POWER_FACTOR * (interval[1] - interval[0]) / (2 * 1.959964):.3g}"


def power_cell(found: dict[str, Any] | None, interval: str) -> str:
    """A comparison's 80%-power effect: its own figure where it computed one from the bootstrap's
    standard error (the frontier), else read from its 95% interval."""
    found = found or {}
    if found.get("effect_80") is not None:
        return f"{found['effect_80']:.3g}"
    return effect_80(found.get(interval))


def _cell(value: float | None, interval: list[float] | None) -> str:
    """``72.6 [69.5, 75.7]``, three significant digits; ``--`` where there is no figure."""
    if value is None:
        return "--"
    text = f"{value:.3g}"
    return text + (f" [{interval[0]:.3g}, {interval[1]:.3g}]" if interval else "")


def main_table(rows: list[dict[str, Any]], formatted: bool = True):
    """A wide DataFrame: settings x (dataset, figure); ``formatted``: cells ``value [low, high]``,
    else numbers with ``_low``/``_high`` columns beside each figure that has an interval. A CPU
    job's tok/s says what share of its threads' CPU time it got: below ~100% another job shared the
    cores, and the figure is not the method's speed."""
    import pandas as pd

    figures = [
        "acceptance_rate",
        "mean_accepted_length",
        "quality",
        "seconds_per_example",
        "speedup",
        "tokens_per_second",
    ]
    names = {r["dataset"]: r["quality_name"] for r in rows}
    batch = max(r["batch_size"] for r in rows)
    timing = {
        "seconds_per_example": "s/example (B=1)",
        "speedup": "speed-up (B=1)",
        "tokens_per_second": f"tok/s (B={batch})",
    }
    shared = any(r.get("cpu_share") is not None for r in rows)
    long = []
    for r in rows:
        ended = r.get("ended_share")
        cells = {"n": r["n"], "ended %": "--" if ended is None else f"{100 * ended:.0f}"}
        if not formatted:
            cells["ended %"] = None if ended is None else 100 * ended
        for f in figures:
            label = names[r["dataset"]] if f == "quality" else timing.get(f, f)
            interval = r.get(f"{f}_ci")
            if formatted:
                cells[label] = _cell(r[f], interval)
                if f == "tokens_per_second" and r.get("cpu_share") is not None:
                    cells[label] += f" (CPU {100 * r['cpu_share']:.0f}%)"  # below ~100%: shared cores
            else:
                cells[label] = r[f]
                if f in CI_FIGURES:
                    cells[f"{label}_low"], cells[f"{label}_high"] = interval or (None, None)
        if shared and not formatted:
            cells["CPU share"] = r.get("cpu_share")
        long += [
            {"setting": r["setting"], "column": f"{r['dataset']} {k}", "value": v} for k, v in cells.items()
        ]
    frame = pd.DataFrame(long)
    columns = list(dict.fromkeys(frame["column"]))
    datasets = sorted(names)
    columns = [c for d in datasets for c in columns if c.startswith(d + " ")]
    wide = frame.pivot_table(index="setting", columns="column", values="value", aggfunc="first", dropna=False)
    wide = wide.reindex(columns=columns)
    wide.columns.name = None
    order = sorted(wide.index, key=lambda s: (METHOD_ORDER.get(s.split()[0], 9), s))
    return wide.loc[order].fillna("--") if formatted else wide.loc[order]


def paired_table(rows: list[dict[str, Any]]):
    """Each setting minus sd on the same examples (n, delta quality and delta acceptance), its quality
    above the static frontier at its acceptance with its family-wise interval, above the neighbour
    line, a DIVERSED setting minus the static cell at its own mean w, and each comparison's
    80%-power effect (the smallest true difference it detects). The quality metric is named in a
    column of its own, so datasets scored by different metrics (GSM8K's accuracy, MBPP's pass@1)
    share one set of columns."""
    import pandas as pd

    records = []
    for r in rows:
        diff = r.get("vs_sd")
        if not diff:
            continue
        records.append(
            {
                "dataset": r["dataset"],
                "setting": r["setting"],
                "n": diff["n"],
                "quality": r["quality_name"],
                "delta quality": _cell(diff["quality"], diff["quality_ci"]),
                "delta acceptance": _cell(diff.get("acceptance_rate"), diff.get("acceptance_rate_ci")),
                "quality above the static frontier, cross-fitted": frontier_cell(crossfit_of(r)),
                "family-wise 95% (m rules)": familywise_cell(crossfit_of(r)),
                "plain envelope": frontier_cell(r.get("vs_frontier")),
                "quality above the neighbour line": (
                    f"{_cell(r['vs_static']['gap'], r['vs_static']['gap_ci'])} ({r['vs_static']['between']})"
                    if r.get("vs_static")
                    else "--"
                ),
                "vs static at its own mean w": (
                    f"{_cell(matched['quality'], matched['quality_ci'])} at"
                    f" {_cell(matched['acceptance_rate'], matched['acceptance_rate_ci'])} acceptance"
                    f" (w={matched['w']:g})"
                    if (matched := r.get("vs_matched"))
                    else "--"
                ),
                "80%-power effect (sd / frontier / line / matched)": " / ".join(
                    power_cell(crossfit_of(r) if key == "crossfit" else r.get(key), name)
                    for key, name in (
                        ("vs_sd", "quality_ci"),
                        ("crossfit", "gap_ci"),
                        ("vs_static", "gap_ci"),
                        ("vs_matched", "quality_ci"),
                    )
                ),
            }
        )
    frame = pd.DataFrame(records)
    if frame.empty:
        return frame
    key = frame["setting"].map(lambda s: (METHOD_ORDER.get(s.split()[0], 9), s))
    return frame.assign(_key=key).sort_values(["dataset", "_key"]).drop(columns="_key")


def crossfit_of(row: dict[str, Any]) -> dict[str, Any] | None:
    """A setting's cross-fitted frontier comparison (``frontier.crossfit_above_frontier``)."""
    found = row.get("vs_frontier")
    if not found:
        return None
    return {"n": found["n"], **found["crossfit"]} if found.get("crossfit") else found


def frontier_cell(found: dict[str, Any] | None) -> str:
    """``+5.1 [+0.3, +9.8] (n 200)``, or why there is no number."""
    if not found:
        return "--"
    if found["gap"] is None:
        return found["outside"]
    return f"{_cell(found['gap'], found['gap_ci'])} (n {found['n']})"


def familywise_cell(found: dict[str, Any] | None) -> str:
    """``[-1.2, +12.6] (m 9)``: the frontier gap's interval when all m rules of its cell must hold
    together (:func:`diversed.evaluation.frontier.familywise`)."""
    if not found or "gap_ci_familywise" not in found:
        return "--"
    low, high = found["gap_ci_familywise"]
    return f"[{low:.3g}, {high:.3g}] (m {found['family']})"


def frontier_table(rows: list[dict[str, Any]]):
    """The study's answer, one line per rule judged against its cell's static frontier (every
    non-static setting with a number; :mod:`diversed.evaluation.frontier`): its quality and
    acceptance over the n examples every static setting decoded too (the main table's are over
    all its own), where its weight sat, the frontier's quality at that acceptance, the gap with its
    95% interval, the family-wise interval over the cell's m rules and the 80%-power effect;
    largest gap first within each dataset."""
    import pandas as pd

    lines = []
    for r in rows:
        found = r.get("vs_frontier")
        if not found or found["gap"] is None:
            continue
        crossfit = crossfit_of(r)
        w = r.get("w_test")
        lines.append(
            {
                "dataset": r["dataset"],
                "setting": r["setting"],
                "n": found["n"],
                "quality": r["quality_name"],
                "value": f"{found['quality']:.3g}",
                "acceptance": f"{found['acceptance']:.3f}",
                "w on test tokens, mean (std)": f"{w['w_mean']:.3f} ({w['w_std']:.3f})" if w else "--",
                "frontier there": f"{found['quality'] - crossfit['gap']:.3g}",
                "above the frontier, cross-fitted [95%]": _cell(crossfit["gap"], crossfit["gap_ci"]),
                "family-wise 95% (m rules)": familywise_cell(crossfit),
                "plain envelope [95%]": _cell(found["gap"], found["gap_ci"]),
                "its family-wise": familywise_cell(found),
                "call (both agree)": frontier.call(found),
                "80%-power effect": power_cell(crossfit, "gap_ci"),
                "_gap": crossfit["gap"],
            }
        )
    frame = pd.DataFrame(lines)
    if frame.empty:
        return frame
    return frame.sort_values(["dataset", "_gap"], ascending=[True, False]).drop(columns="_gap")


def weights_table(rows: list[dict[str, Any]]):
    """One line per setting whose records carry per-token weights (method diversed)."""
    import pandas as pd

    lines = []
    for r in rows:
        w = r.get("w_test")
        if not w:
            continue
        line = {"dataset": r["dataset"], "setting": r["setting"], "tokens": w["tokens"]}
        line |= {k: round(w[k], 3) for k in ("w_mean", "w_std", "w_below_0.1", "w_above_0.9")}
        for kind, figures in w["by_class"].items():
            mean = figures["w_mean"]
            line[f"w {kind} (n)"] = f"{mean:.3f} ({figures['n']})" if mean is not None else "-"
        for key in ("corr_tv", "corr_entropy"):
            line[key] = None if w[key] is None else round(w[key], 3)
        line["on-policy check vs static at its own w"] = (r.get("head_check") or {}).get("verdict") or "--"
        lines.append(line)
    return pd.DataFrame(lines)


def _captioned(path: Path, caption: str, table, empty: str) -> Path:
    """A markdown table under its caption, or the sentence that says why there is none."""
    path.write_text(f"{caption}\n\n{empty if table.empty else table.to_markdown(index=False)}\n")
    return path


def write_tables(rows: list[dict[str, Any]], out_prefix: str | Path) -> list[Path]:
    out = Path(out_prefix)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = main_table(rows)
    paths = [out.with_suffix(".csv"), out.with_suffix(".md"), out.with_suffix(".tex")]
    main_table(rows, formatted=False).to_csv(paths[0], float_format="%.4g")
    sizes = ", ".join(f"{d} n = {n}" for d, n in sorted(cell_sizes(rows).items()))
    heads = head_note(rows)
    note = f"Each cell: value [95% bootstrap interval] over the examples of its dataset ({sizes})."
    note += f" {heads}.\n\n" if heads else "\n\n"
    paths[1].write_text(note + table.to_markdown() + "\n")
    paths[2].write_text(table.to_latex(na_rep="--") + "\n")
    paths.append(
        _captioned(
            out.with_name("weights.md"),
            "Where each head put its weight, on the tokens it decoded (bonus tokens, drawn from the"
            " target alone, have none): mean, std, shares below 0.1 and above 0.9, mean by token class,"
            " correlation with TV(p, q) and with the target's entropy.",
            weights_table(rows),
            "No setting with per-token weights ran.",
        )
    )
    paths.append(
        _captioned(
            out.with_name("frontier.md"),
            "Each relaxed rule minus the static frontier (the upper concave envelope of the static"
            " points, sd and w = 0 included) at its own acceptance, paired over the examples every"
            " static setting of its cell decoded. Cross-fitted: the envelope's segment is chosen on"
            " nine tenths of the examples and the gap measured on the tenth left, against the chord"
            " through those two static settings (a mix one could run); the plain envelope is chosen"
            " and judged on the same examples and runs high. The envelope errs against a rule and"
            " the cross-fitted chord towards it, so a rule is called above or below only where both"
            " family-wise intervals agree (Bonferroni over the cell's m rules).",
            frontier_table(rows),
            "No rule has a number against a frontier.",
        )
    )
    paired = paired_table(rows)
    paired_path = out.with_name("paired_vs_sd")
    for suffix, text in ((".csv", paired.to_csv(index=False)), (".md", paired.to_markdown(index=False))):
        (path := paired_path.with_suffix(suffix)).write_text(text + "\n")
        paths.append(path)
    return paths


def cell_sizes(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Examples per cell per dataset: one number, or the range where cells differ."""
    sizes: dict[str, set[int]] = {}
    for r in rows:
        sizes.setdefault(r["dataset"], set()).add(r["n"])
    return {d: str(min(n)) if len(n) == 1 else f"{min(n)}-{max(n)}" for d, n in sizes.items()}
