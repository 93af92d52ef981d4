"""benchmarks/gpu.sh runs anywhere with tiny shapes, so it is known to work before a GPU is at hand."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_runs_on_cpu_with_tiny_shapes():
    args = [
        "--shapes",
        "tiny",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--new-tokens",
        "8",
        "--prompts",
        "4",
        "--bandwidth",
        "4e10",  # a CPU is in no card table
    ]
    out = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu.sh"), *args, "--batch-sizes", "2"],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,  # a hang guard, not a timing: 586 s measured on 2 AVX2 cores beside a study job
    )
    result = json.loads(out.stdout[out.stdout.index("{") :])
    ours = ("ours_auto", "ours_sd", "ours_auto[fixed]", "ours_sd[fixed]")  # off CUDA: eager and fixed
    assert set(result["tok_s"]) == {
        *("hf_generate@1", "hf_assisted@1", "hf_generate@2"),
        *(f"{name}@{b}" for name in ours for b in (1, 2)),
    }
    assert all(rate > 0 for rate in result["tok_s"].values())
    assert result["target_step_seconds"]["1 token"] > 0 and result["hbm_floor_seconds"] > 0
    assert "5 tokens x 2 rows" in result["step_over_floor"] and 0 <= result["acceptance_greedy"] <= 1
    checks = result["exact_fp32"]  # CPU fp32: every method exact, at both steps, and fixed = eager
    assert checks and all(checks.values())
    assert "fixed: batched = eager: method=cascade temperature=1.0" in checks


def test_the_floor_comes_from_the_card_table_and_an_unknown_card_gets_none():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_bench import card_bandwidth

    assert card_bandwidth("NVIDIA H200") == 4.8e12
    assert card_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert card_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert card_bandwidth("NVIDIA A100-SXM4-80GB") == 2.039e12
    assert card_bandwidth("NVIDIA L40S") == 0.864e12
    assert card_bandwidth("NVIDIA GeForce RTX 4090") == 1.008e12
    assert card_bandwidth("Tesla T4") is None
