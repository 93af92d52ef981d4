"""A decode job that owns several devices: one process per device decodes a shard; shards are merged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diversed.config import DecodeConfig
from diversed.jobs.decode import DecodeJob, merge_shards, run_decode, shard_path
from diversed.jobs.runner import RunOptions
from diversed.loading.tiny import write_tiny_pair

QUIET = RunOptions(progress=False)


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> DecodeJob:
    target, draft = write_tiny_pair(tmp_path_factory.mktemp("tiny"))
    config = DecodeConfig.from_dict({"method": "sd", "max_new_tokens": 10, "temperature": 1.0})
    return DecodeJob("humaneval", "test", 5, str(target), str(draft), config)


def records(path: Path) -> list[tuple[str, list[int]]]:
    return [(r["id"], r["token_ids"]) for r in map(json.loads, path.read_text().splitlines())]


def test_shards_merge_into_the_single_process_result(job, tmp_path):
    single = run_decode(job, tmp_path / "single.jsonl", QUIET)
    out = tmp_path / "sharded.jsonl"
    for rank in range(2):
        run_decode(job, out, QUIET, shard=(rank, 2))
    assert len(records(shard_path(out, 0, 2))) == 3 and len(records(shard_path(out, 1, 2))) == 2
    merge_shards(job, out, 2)
    assert records(out) == records(single)  # same order, same tokens (each example has its own seed)
    assert not shard_path(out, 0, 2).exists()


def test_merge_refuses_incomplete_shards(job, tmp_path):
    out = tmp_path / "part.jsonl"
    run_decode(job, out, QUIET, shard=(0, 2))
    with pytest.raises(ValueError, match="in no shard"):
        merge_shards(job, out, 2)


@pytest.mark.skipif(
    shutil.which("accelerate", path=str(Path(sys.executable).parent)) is None, reason="no accelerate"
)
def test_accelerate_launch_with_two_cpu_processes(job, tmp_path):
    out = tmp_path / "accelerate.jsonl"
    launcher = str(Path(sys.executable).parent / "accelerate")
    command = [
        *(launcher, "launch", "--cpu", "--num_processes", "2", "--num_machines", "1"),
        *("--mixed_precision", "no", "--dynamo_backend", "no", "-m", "diversed.cli"),
        *("decode", "--dataset", "humaneval", "--n-examples", "5", "--method", "sd", "--temperature", "1.0"),
        *(
            "--target",
            job.target,
            "--draft",
            job.draft,
            "--max-new-tokens",
            "10",
            "--dtype",
            "float32",  # as the single-process job: auto is bf16 on CPUs with native bf16
            "--out",
            str(out),
            "--quiet",
        ),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    single = run_decode(job, tmp_path / "single.jsonl", QUIET)
    assert records(out) == records(single)
