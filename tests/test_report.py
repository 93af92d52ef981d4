"""The report's static sweep (sd stands for w = 1 only where no static w = 1 ran) and its plot panels."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest

from diversed.evaluation.comparisons import static_sweep
from diversed.evaluation.plots import _pareto_panel, _reference_band, write_plots
from diversed.evaluation.report import load_scores

VERDICT_CELLS = Path(__file__).resolve().parents[1] / "docs" / "results" / "verdict" / "cells"

matplotlib.use("Agg")


def row(method: str, k: int = 4, w: float | None = None) -> dict:
    return {"method": method, "k": k, "target_weight": w}


def test_sd_is_the_sweeps_w1_end_only_when_no_static_w1_ran():
    sd, other_k = row("sd"), row("sd", k=6)
    half, zero = row("static", w=0.5), row("static", w=0.0)
    assert static_sweep([sd, half, other_k, zero, row("diversed")]) == [(0.0, zero), (0.5, half), (1.0, sd)]
    one = row("static", w=1.0)
    assert static_sweep([sd, half, one]) == [(0.5, half), (1.0, one)]
    assert static_sweep([sd]) == []


def point(method: str, acceptance: float | None, quality: float, w: float | None = None) -> dict:
    return {
        "method": method,
        "setting": method if w is None else f"{method} w={w:g}",
        "k": 4,
        "target_weight": w,
        "acceptance_rate": acceptance,
        "acceptance_rate_ci": None if acceptance is None else [acceptance - 0.02, acceptance + 0.02],
        "quality": quality,
        "quality_ci": [quality - 9, quality + 9],
    }


def test_a_method_keeps_its_colour_in_every_panel_and_auto_is_a_reference_band():
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2)
    static = [point("static", 0.9, 30, w=0.5), point("static", 1.0, 25, w=0.0)]
    _pareto_panel(left, [point("sd", 0.7, 34), point("diversed", 0.91, 32), *static], "acceptance_rate")
    others = [point("lossy", 0.8, 31), point("cascade", 0.85, 28), point("diversed", 0.89, 23)]
    _pareto_panel(right, [*others, *static], "acceptance_rate")
    _reference_band(right, point("auto", None, 35))

    def colours(ax) -> dict[str, str]:
        return {c.get_label(): c.lines[0].get_color() for c in ax.containers}

    assert colours(left)["diversed"] == colours(right)["diversed"]  # the cycle would have moved it
    assert len(set(colours(right).values())) == len(colours(right))  # lossy, cascade, diversed, the sweep
    band = [line for line in right.get_lines() if line.get_label() == "auto"]
    assert len(band) == 1 and band[0].get_ydata()[0] == 35 and len(right.patches) == 1  # its 95% band
    plt.close(fig)


def test_settings_that_share_a_marker_are_each_named_above_their_point():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    heads = [point("diversed", 0.57, 13), point("diversed", 0.54, 12)]
    heads[0]["setting"], heads[1]["setting"] = "diversed lambda=1.5 k=4 T=1", "diversed oracle:digits k=4 T=1"
    _pareto_panel(ax, [*heads, point("sd", 0.42, 32)], "acceptance_rate")
    names = {text.get_text() for text in ax.texts}
    assert names == {"lambda=1.5 k=4", "oracle:digits k=4"}  # sd, alone under its marker, is in the legend
    plt.close(fig)


def test_a_diversed_setting_is_compared_with_the_static_cell_at_its_own_mean_w():
    from diversed.evaluation.comparisons import versus_matched_static

    def cell(method: str, w: float | None, passed: int, w_test: float | None = None) -> dict:
        examples = [
            {
                "id": str(i),
                "quality": float(i < passed),
                "accepted": 3,
                "drafted": 4,
                "blocks": 1,
                "seconds": 1.0,
            }
            for i in range(40)
        ]
        return {
            "method": method,
            "dataset": "gsm8k",
            "temperature": 1.0,
            "k": 4,
            "target_weight": w,
            "per_example": [{**e, "batch_size": 8} for e in examples],
            "w_test": None if w_test is None else {"w_mean": w_test},
            "corpus_bleu": False,
        }

    head = cell("diversed", None, 12, w_test=0.41173)
    line = [cell("static", 0.5, 9), cell("static", 0.4117, 10), cell("static", 0.25, 4)]
    found = versus_matched_static(head, [head, *line])
    assert found["w"] == 0.4117 and found["n"] == 40
    assert abs(found["quality"] - 0.05) < 1e-9 and found["quality_ci"][0] <= 0.05 <= found["quality_ci"][1]
    assert found["acceptance_rate"] == 0.0
    assert versus_matched_static(head, [head, line[0], line[2]]) is None  # no static cell at w = 0.4117
    assert versus_matched_static(line[1], [head, *line]) is None  # only a DIVERSED setting has one


def test_the_paired_table_shares_its_quality_columns_across_metrics():
    """GSM8K (accuracy) and MBPP (pass@1) in one table: one set of quality columns, the metric named
    in its own column, no empty cells where the other dataset's metric would have been."""
    from diversed.evaluation.tables import paired_table

    def compared(dataset: str, name: str) -> dict:
        diff = {"n": 200, "quality": -2.0, "quality_ci": [-5.0, 1.0], "acceptance_rate": 0.1}
        diff["acceptance_rate_ci"] = [0.08, 0.12]
        return {"dataset": dataset, "setting": "static w=0.5 k=4 T=1", "quality_name": name, "vs_sd": diff}

    table = paired_table([compared("gsm8k", "accuracy"), compared("mbpp", "pass@1")])
    assert list(table["quality"]) == ["accuracy", "pass@1"]
    assert [c for c in table.columns if "quality" in c] == [
        "quality",
        "delta quality",
        "quality above the static frontier, cross-fitted",
        "quality above the neighbour line",
    ]
    assert list(table["delta quality"]) == ["-2 [-5, 1]"] * 2 and not table.isna().any().any()


def cell(method: str, w: float | None, acceptance: float, quality: float) -> dict:
    """A report row of 200 GSM8K examples with exactly this acceptance and accuracy."""
    examples = [
        {"id": str(i), "quality": 100.0 * (i < quality * 2), "accepted": acceptance * 10, "drafted": 10}
        for i in range(200)
    ]
    return {
        "method": method,
        "dataset": "gsm8k",
        "setting": f"{method} {w}",
        "quality_name": "accuracy",
        "temperature": 1.0,
        "k": 4,
        "target_weight": w,
        "acceptance_rate": acceptance,
        "per_example": [{**e, "blocks": 3, "seconds": 1.0, "batch_size": 8} for e in examples],
        "corpus_bleu": False,
    }


def test_a_rule_is_judged_against_the_static_frontier_not_the_neighbour_line():
    """A convex static curve (sd 36 at acceptance 0.6, w = 0.75 20 at 0.7, w = 0.5 20 at 0.8, w = 0
    15 at 0.9): a rule at acceptance 0.78 scoring 30 lies +10 above the neighbour line but only
    +5.33 above the envelope, the chord from sd to w = 0; one at 0.95 gets no number."""
    from diversed.evaluation.comparisons import versus_static_curve, versus_static_frontier

    statics = [cell("sd", None, 0.6, 36), cell("static", 0.75, 0.7, 20), cell("static", 0.5, 0.8, 20)]
    statics.append(cell("static", 0.0, 0.9, 15))
    rule = cell("gate", None, 0.78, 30)
    found = versus_static_frontier(rule, [rule, *statics])
    assert found["gap"] == pytest.approx(30 - (36 - 0.6 * 21)) and found["n"] == 200
    assert found["static_w"] == "0, 0.5, 0.75, 1"
    assert versus_static_curve(rule, [rule, *statics])["gap"] == pytest.approx(10.0)
    far = cell("gate", None, 0.95, 30)
    assert versus_static_frontier(far, [far, *statics])["outside"].startswith("acceptance 0.950 outside")


def test_the_frontier_table_lists_the_judged_rules_best_first_with_their_family():
    """Three rules inside the convex curve's range (one of them on the w = 0 point) and one outside:
    the table has the three, best first, each with the frontier's quality at its acceptance and a
    family of m = 3."""
    from diversed.evaluation.comparisons import versus_static_frontier
    from diversed.evaluation.report import judge_families
    from diversed.evaluation.tables import frontier_table

    rows = [cell("sd", None, 0.6, 36), cell("static", 0.5, 0.8, 20), cell("static", 0.0, 0.9, 15)]
    rows += [cell("gate", 1.0, 0.78, 20), cell("gate", 2.0, 0.7, 30), cell("gate", 3.0, 0.95, 30)]
    rows.append(cell("gate", 4.0, 0.9, 15))  # on the w = 0 point, example by example: no power figure
    for r in rows:
        r["vs_frontier"] = versus_static_frontier(r, rows) if r["method"] == "gate" else None
    judge_families(rows)
    table = frontier_table(rows)
    assert list(table["setting"]) == ["gate 2.0", "gate 4.0", "gate 1.0"]
    assert list(table["frontier there"]) == ["29", "15", "23.4"]  # the chord 36 - 70 (a - 0.6)
    assert list(table["family-wise 95% (m rules)"].str.endswith("(m 3)")) == [True] * 3
    assert table["80%-power effect"].iloc[1] == "--"


def test_gate_cells_read_from_score_files_are_drawn_as_their_signals_family(tmp_path):
    """The study's committed cells, as the report reads them: a gate row names its signal and
    threshold, and the plot draws it as that gate's family line beside the static frontier."""
    import matplotlib.pyplot as plt

    rows = load_scores(sorted(VERDICT_CELLS.glob("*.json")))
    gates = [r for r in rows if r["method"] == "gate"]
    assert gates and all(r["gate"] in ("tv", "entropy") and r["gate_threshold"] > 0 for r in gates)
    assert all(r["gate"] is None for r in rows if r["method"] != "gate")
    fig, ax = plt.subplots()
    _pareto_panel(ax, rows, "acceptance_rate")
    labels = {c.get_label() for c in ax.containers} | {line.get_label() for line in ax.get_lines()}
    assert {f"gate {r['gate']}" for r in gates} <= {label.split(",")[0] for label in labels}
    assert "static frontier (concave envelope)" in labels
    plt.close(fig)
    assert any(p.name == "quality_vs_acceptance.png" for p in write_plots(rows, tmp_path))


def test_a_cpu_jobs_throughput_says_what_share_of_its_cores_it_got():
    from diversed.evaluation.tables import main_table

    cells = load_scores(sorted(VERDICT_CELLS.glob("*.json")))
    rows = [r for r in cells if r["cpu_share"] is None]  # cells recorded before the share was
    assert rows and len(rows) < len(cells)  # and the later ones carry it
    assert not main_table(rows, formatted=False).filter(like="CPU share").columns.size
    rows[0]["cpu_share"] = 0.46
    table = main_table(rows)
    assert table.loc[rows[0]["setting"]].filter(like="tok/s").iloc[0].endswith("(CPU 46%)")
    assert main_table(rows, formatted=False).loc[rows[0]["setting"], "gsm8k CPU share"] == 0.46
