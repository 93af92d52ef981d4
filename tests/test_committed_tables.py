"""Every committed table of docs/results/ is what the current report makes of its committed score
files, byte for byte (the plots are left out: PNG bytes carry matplotlib's version)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diversed.evaluation.report import load_scores
from diversed.evaluation.tables import write_tables

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
TABLE_SETS = {  # table prefix -> the score files it is made from
    "control/tables/main": "control/cells/*.json",
    "control/natural-pair-tables/main": "control/natural-pair-cells/*-T1.json",  # not the 128-token sd
    "cpu-study/main": "cpu-study/scores/*/*.json",
    "embedded-default/avx2/main": "embedded-default/avx2/scores/*/*.json",
    "natural/tables/main": "natural/cells/*.json",
    "verdict/tables/main": "verdict/cells/*.json",
}


@pytest.mark.parametrize("prefix", sorted(TABLE_SETS))
def test_a_committed_table_set_regenerates_identically(prefix, tmp_path):
    scores = sorted({p for pattern in TABLE_SETS[prefix].split() for p in RESULTS.glob(pattern)})
    assert scores, TABLE_SETS[prefix]
    written = write_tables(load_scores(scores), tmp_path / "main")
    assert len(written) >= 5  # main and paired_vs_sd in their formats, at least
    for path in written:
        committed = RESULTS / prefix
        committed = committed.with_name(path.name)
        assert committed.exists(), f"{committed} is not committed"
        assert path.read_text() == committed.read_text(), f"{committed} does not regenerate"
