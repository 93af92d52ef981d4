"""The report's static sweep: sd stands for w = 1 only where no static w = 1 ran."""

from __future__ import annotations

from diversed.report import static_sweep


def row(method: str, k: int = 4, w: float | None = None) -> dict:
    return {"method": method, "k": k, "target_weight": w}


def test_sd_is_the_sweeps_w1_end_only_when_no_static_w1_ran():
    sd, other_k = row("sd"), row("sd", k=6)
    half, zero = row("static", w=0.5), row("static", w=0.0)
    assert static_sweep([sd, half, other_k, zero, row("diversed")]) == [(0.0, zero), (0.5, half), (1.0, sd)]
    one = row("static", w=1.0)
    assert static_sweep([sd, half, one]) == [(0.5, half), (1.0, one)]
    assert static_sweep([sd]) == []
