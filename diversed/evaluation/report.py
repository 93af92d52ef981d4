"""Score files read back as report rows: each setting's figures with their 95% bootstrap intervals
(:mod:`diversed.evaluation.bootstrap`) and its paired comparisons with the other settings of its
cell (:mod:`diversed.evaluation.comparisons`): against ``sd``, ``auto``'s latency, the static
frontier (with a family-wise interval over the cell's rules), the neighbour line and the static
cell at a head's own mean w. :mod:`diversed.evaluation.tables` lays the rows out;
:mod:`diversed.evaluation.plots` draws them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from diversed.data import get_task
from diversed.evaluation import bootstrap, frontier
from diversed.evaluation.comparisons import (
    cell_key,
    paired_vs_sd,
    speedup_over,
    versus_matched_static,
    versus_static_curve,
    versus_static_frontier,
)
from diversed.evaluation.metrics import QUALITY
from diversed.files import read_json, require

CI_FIGURES = ("acceptance_rate", "mean_accepted_length", "quality", "seconds_per_example", "speedup")
METHOD_ORDER = {"auto": 0, "sd": 1, "lossy": 2, "static": 3, "cascade": 4, "gate": 5, "diversed": 6}


def setting_label(s: dict[str, Any], untrained: bool = False) -> str:
    """A short human name of a method setting, e.g. 'static w=0.7 k=5 T=0'; a DIVERSED setting whose
    head training left untrained is named for what it is, the static ensemble at w = 0.5."""
    method = s["method"]
    if untrained:
        return f"untrained head = static w=0.5 k={s['num_assistant_tokens']} T={s['temperature']:g}"
    parts = [method]
    if str(s.get("head", "")).startswith("oracle:"):  # a hand-made head is another method, not a source
        parts.append(s["head"])
    else:  # heads trained from several seeds, or a selection's several finalists, are several rows
        parts += [part for part in (head_seed(s), head_finalist(s)) if part]
    if method == "static":
        parts.append(
            f"w={s['target_weight']:g}" + (" (logits)" if s.get("ensemble_space") == "logits" else "")
        )
    elif method == "lossy":
        parts.append(f"l={s['lenience']:g}")
    elif method == "cascade":
        parts.append(f"{s['cascade_rule']} a={s['cascade_alpha']:g}")
    elif method == "gate":
        parts.append(f"{s['gate']} t={s['gate_threshold']:g}")
    if method != "auto":
        parts.append(f"k={s['num_assistant_tokens']}")
        if s.get("schedule", "constant") != "constant":
            parts.append(s["schedule"])
    parts.append(f"T={s['temperature']:g}")
    return " ".join(parts)


def head_source(s: dict[str, Any]) -> str | None:
    """The task (and split) a DIVERSED head learned on, e.g. 'mbpp' or 'wmt/validation'; None without a
    head or with a hand-made one (``oracle:``, learned on nothing). Kept out of the setting's label so
    that one setting is one row across datasets."""
    if not s.get("head") or str(s["head"]).startswith("oracle:"):
        return None
    parts = list(Path(s["head"]).parts)  # results/heads/<train dataset>[/s<seed>][/r<round>][/lambda-<l>]
    while len(parts) > 1 and re.fullmatch(r"[rs]\d+|lambda-[\d.]+", parts[-1]):
        parts.pop()
    if parts[-1] in ("heads", "candidates"):  # a head kept elsewhere (docs/results/.../heads/lambda-1.5)
        card = Path(s["head"]) / "head.json"  # names its task in the card train-head wrote
        task = json.loads(card.read_text()).get("task") if card.is_file() else None
        return task or "unknown task"
    return parts[-1].replace(".", "/")


def head_finalist(s: dict[str, Any]) -> str | None:
    """'lambda=<l>' when the head is one of a selection's finalists (a ``lambda-<l>`` folder that
    ``train-head`` writes beside its choice, decoded by hand), else None."""
    found = re.fullmatch(r"lambda-([\d.]+)", Path(s.get("head") or "").name)
    return f"lambda={found[1]}" if found else None


def head_seed(s: dict[str, Any]) -> str | None:
    """'s<seed>' of a trained head's folder (results/heads/<task>/s<seed>/r<round>), else None."""
    found = [p for p in Path(s.get("head") or "").parts if re.fullmatch(r"s\d+", p)]
    return found[-1] if found else None


def head_note(rows: list[dict[str, Any]]) -> str:
    """'DIVERSED heads learned on: humaneval <- mbpp, ...', or '' when no row has a head."""
    sources = sorted({(r["dataset"], r["head"]) for r in rows if r.get("head")})
    return "DIVERSED heads learned on: " + ", ".join(f"{d} <- {h}" for d, h in sources) if sources else ""


SCORE_KEYS = ("dataset", "method", "settings", "per_example", "n_examples")  # what the tables read


def load_scores(paths: list[str | Path]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        score = require(read_json(path), SCORE_KEYS, path, "a score file (`diversed score` writes them)")
        task = get_task(score["dataset"])
        settings = score["settings"]
        untrained = bool((score.get("head_check") or {}).get("untrained"))
        gate = settings["method"] == "gate"  # every record's settings name a gate; only gate cells use it
        rows.append(
            {
                "dataset": score["dataset"],
                "setting": setting_label(settings, untrained),
                "untrained": untrained,
                "head": head_source(settings),
                "method": settings["method"],
                "temperature": settings["temperature"],
                "k": settings["num_assistant_tokens"],
                "target_weight": settings.get("target_weight"),
                "gate": settings.get("gate") if gate else None,
                "gate_threshold": settings.get("gate_threshold") if gate else None,
                "quality_name": QUALITY[task.metric],
                "quality": score[QUALITY[task.metric]],
                "acceptance_rate": score["acceptance_rate"],
                "mean_accepted_length": score["mean_accepted_length"],
                "seconds_per_example": score["seconds_per_example"],
                "latency_examples": score.get("latency_examples") or 0,
                "tokens_per_second": score["tokens_per_second"],
                "cpu_share": score.get("cpu_share"),
                "batch_size": score.get("batch_size", 1),
                "target_step_seconds": score.get("target_step_seconds"),
                "draft_step_seconds": score.get("draft_step_seconds"),
                "n": score["n_examples"],
                "ended_share": score.get("ended_share"),
                "quality_ci": score.get(f"{QUALITY[task.metric]}_ci"),
                "corpus_bleu": task.metric == "bleu",
                "per_example": score.get("per_example", []),
                "w_test": score.get("w_test"),
                "head_check": score.get("head_check"),
                **{f"{f}_ci": score.get(f"{f}_ci") for f in CI_FIGURES if f != "quality"},
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
        row["speedup"], row["speedup_ci"] = speedup_over(auto[0], row) if auto else (None, None)
    for row in rows:  # a few batch-1 examples are no measurement: print no latency from them
        if row["latency_examples"] < bootstrap.MIN_LATENCY:
            row["seconds_per_example"], row["seconds_per_example_ci"] = None, None
        row["vs_sd"] = paired_vs_sd(row, rows)
        row["vs_frontier"] = versus_static_frontier(row, rows)
        row["vs_static"] = versus_static_curve(row, rows)
        row["vs_matched"] = versus_matched_static(row, rows)
    judge_families(rows)
    return rows


def judge_families(rows: list[dict[str, Any]]) -> None:
    """Family-wise intervals for the rules judged against one frontier (a dataset, T and k), for
    both comparators: the plain envelope's and the cross-fitted one's."""
    families: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("vs_frontier"):
            families.setdefault(cell_key(row), []).append(row["vs_frontier"])
    for found in families.values():
        frontier.familywise(found)
        frontier.familywise([f["crossfit"] for f in found if f.get("crossfit")])
