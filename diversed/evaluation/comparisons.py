"""How one setting compares with others of its cell, on the examples both decoded (paired):
against ``sd``, against ``auto``'s latency, against the static frontier (:mod:`diversed.evaluation.frontier`)
and the neighbour line of the static sweep, and a DIVERSED head against the static cell at its own
mean w. Each returns plain figures with their 95% intervals; :mod:`diversed.evaluation.report` lays them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from diversed.evaluation import bootstrap, frontier
from diversed.evaluation.weights import MATCH_TOLERANCE


def aligned_columns(
    row: dict[str, Any], others: Sequence[dict[str, Any]]
) -> tuple[int, list[dict[str, Any]]] | None:
    """The examples ``row`` and every one of ``others`` decoded: their number and each setting's
    bootstrap columns over them in the same order (None when they share none), for paired figures."""
    by_id = [{e["id"]: e for e in r["per_example"]} for r in others]
    shared = [e for e in row["per_example"] if all(e["id"] in ids for ids in by_id)]
    if not shared:
        return None
    return len(shared), [bootstrap.columns(shared)] + [
        bootstrap.columns([ids[e["id"]] for e in shared]) for ids in by_id
    ]


def static_sweep(rows: list[dict[str, Any]]) -> list[tuple[float, dict[str, Any]]]:
    """(w, row) of the static ensemble's sweep among ``rows``, by w; ``sd`` (v = p exactly) is its
    w = 1 end at the same draft lengths when no static w = 1 ran, so w = 1 is never decoded twice."""
    sweep = [(r["target_weight"], r) for r in rows if r["method"] == "static"]
    lengths = {r["k"] for _, r in sweep}
    if sweep and 1.0 not in {w for w, _ in sweep}:
        sweep += [(1.0, r) for r in rows if r["method"] == "sd" and r["k"] in lengths]
    return sorted(sweep, key=lambda pair: pair[0])


def cell_key(row: dict[str, Any]) -> tuple:
    """The cell a setting belongs to: its dataset, temperature and draft length."""
    return row["dataset"], row["temperature"], row["k"]


def same_cell(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two settings whose rows are comparable: the same cell."""
    return cell_key(a) == cell_key(b)


def versus_static_frontier(row: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A relaxed setting's quality minus the static frontier at its acceptance (the upper concave
    envelope of every static point of its cell, sd and w = 0 included; :mod:`diversed.evaluation.frontier`),
    paired over the examples all of them decoded, with the 80%-power effect."""
    if row.get("untrained"):  # static w = 0.5 under another name: nothing to compare
        return None
    if row["method"] in ("static", "auto", "sd") or not row["per_example"] or row["acceptance_rate"] is None:
        return None
    statics = [r for _, r in static_sweep([r for r in rows if same_cell(r, row) and r["per_example"]])]
    aligned = aligned_columns(row, statics) if len(statics) >= 2 else None
    if not aligned:
        return None
    n, (mine, *theirs) = aligned
    corpus = bootstrap.corpus_bleu_quality if row["corpus_bleu"] else None
    weights = ", ".join(f"{r['target_weight'] if r['method'] == 'static' else 1:g}" for r in statics)
    envelope = frontier.above_frontier(mine, theirs, corpus)
    crossfit = frontier.crossfit_above_frontier(mine, theirs, corpus) if envelope["gap"] is not None else None
    return {"n": n, "static_w": weights, **envelope, "crossfit": crossfit}


def versus_static_curve(row: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The paper's second claim for a non-static setting: its quality minus the static sweep's
    quality at the same acceptance (the line between the two weights of :func:`static_sweep` whose
    acceptances bracket it; same dataset, temperature, k), on the examples all three decoded."""
    if row.get("untrained"):  # static w = 0.5 under another name: nothing to compare
        return None
    if row["method"] in ("static", "auto", "sd") or not row["per_example"] or row["acceptance_rate"] is None:
        return None
    measured = [r for r in rows if r["per_example"] and r["acceptance_rate"] is not None]
    comparable = [r for r in measured if same_cell(r, row)]
    points = sorted(static_sweep(comparable), key=lambda pair: pair[1]["acceptance_rate"])
    bracket = next(
        (
            (a, b)
            for a, b in zip(points, points[1:], strict=False)
            if a[1]["acceptance_rate"] <= row["acceptance_rate"] <= b[1]["acceptance_rate"]
        ),
        None,
    )
    aligned = aligned_columns(row, [r for _, r in bracket]) if bracket else None
    if not aligned:
        return None
    corpus = bootstrap.corpus_bleu_quality if row["corpus_bleu"] else None
    gap, interval = bootstrap.above_curve(*aligned[1], corpus_quality=corpus)
    (low, _), (high, _) = bracket
    return {
        "between": f"static w={low:g}..{high:g}",
        "gap": gap,
        "gap_ci": interval,
    }


def versus_matched_static(row: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The direct comparator of a DIVERSED setting: it minus the static cell at the head's own mean w
    on the test tokens it decoded (same dataset, temperature, k), paired over the examples both
    decoded. At equal mean w the two differ only in where the weight goes, so this is the per-token
    question itself; None when no such static cell ran."""
    w = (row.get("w_test") or {}).get("w_mean")
    if row["method"] != "diversed" or row.get("untrained") or w is None or not row["per_example"]:
        return None
    matched = [
        r
        for r in rows
        if r["method"] == "static"
        and same_cell(r, row)
        and r["per_example"]
        and abs(r["target_weight"] - w) <= MATCH_TOLERANCE
    ]
    aligned = aligned_columns(row, matched[:1]) if matched else None
    if not aligned:
        return None
    n, (mine, theirs) = aligned
    corpus = bootstrap.corpus_bleu_quality if row["corpus_bleu"] else None
    differences = bootstrap.paired_differences(mine, theirs, ("quality", "acceptance_rate"), corpus)
    return {"w": matched[0]["target_weight"], "n": n, **differences}


def speedup_over(auto: dict[str, Any], row: dict[str, Any]) -> tuple[float | None, list[float] | None]:
    """Latency speed-up of ``row`` over ``auto``, paired over the examples both decoded at batch 1,
    with its bootstrap interval; (None, None) below ``bootstrap.MIN_LATENCY`` such examples."""
    aligned = aligned_columns(row, [auto]) if row["per_example"] and auto["per_example"] else None
    if not aligned:
        return None, None
    _, (mine, theirs) = aligned
    point, interval, _ = bootstrap.paired_speedup(theirs, mine)
    return point, interval


def paired_vs_sd(row: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """This setting minus ``sd`` (same dataset, temperature, draft length; for ``auto`` the
    smallest k) on the examples both decoded, with paired bootstrap intervals."""
    if row["method"] == "sd" or not row["per_example"]:
        return None
    candidates = sorted(
        (
            r
            for r in rows
            if r["method"] == "sd"
            and r["dataset"] == row["dataset"]
            and r["temperature"] == row["temperature"]
            and (r["k"] == row["k"] or row["method"] == "auto")
            and r["per_example"]
        ),
        key=lambda r: r["k"],
    )
    if not candidates:
        return None
    aligned = aligned_columns(row, candidates[:1])
    if not aligned:
        return None
    n, (mine, theirs) = aligned
    corpus = bootstrap.corpus_bleu_quality if row["corpus_bleu"] else None
    names = ("quality", "acceptance_rate") if row["method"] != "auto" else ("quality",)
    return {"n": n, **bootstrap.paired_differences(mine, theirs, names, corpus)}
