"""Light jobs stay light: the paper run's 552 score jobs, data status and the tables never import
torch (a second or more of start-up each, and a GB of address space), which the CLI used to pull in
through its flags. Each command runs in its own process with torch made unimportable."""

from __future__ import annotations

import os
import subprocess
import sys

BLOCK_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch imported by a light job")
sys.meta_path.insert(0, _NoTorch())
"""


def run_without_torch(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCK_TORCH)
    env = {**os.environ, "PYTHONPATH": str(site), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"}
    code = "import sys; from diversed.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True)


def test_score_data_status_and_report_run_without_torch(tmp_path, model_dirs):
    from diversed.cli import main

    decoded = tmp_path / "he.jsonl"
    target, draft = model_dirs
    pair = ("--target", str(target), "--draft", str(draft), "--max-new-tokens", "6", "--quiet")
    argv = ["decode", "--dataset", "humaneval", "--n-examples", "2", "--method", "sd"]
    assert main([*argv, *pair, "--out", str(decoded)]) == 0
    score = tmp_path / "score.json"
    done = run_without_torch(
        tmp_path,
        "--track",
        "score",
        "score",
        "--dataset",
        "humaneval",
        "--in",
        str(decoded),
        "--out",
        str(score),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    done = run_without_torch(tmp_path, "data", "status", "--datasets", "humaneval", "--sandbox", "rlimits")
    assert done.returncode == 0, done.stderr[-2000:]
    done = run_without_torch(
        tmp_path,
        "report",
        "--scores",
        str(score),
        "--tables",
        str(tmp_path / "main"),
        "--plots",
        str(tmp_path / "p"),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "main.md").is_file()


def test_the_blocker_itself_stops_a_command_that_needs_torch(tmp_path, model_dirs):
    """The test above can fail: a model command under the same blocker does."""
    target, draft = model_dirs
    pair = ("--target", str(target), "--draft", str(draft))
    done = run_without_torch(tmp_path, "generate", *pair, "--prompt", "x", "--max-new-tokens", "2")
    assert done.returncode != 0 and "torch imported by a light job" in done.stderr
