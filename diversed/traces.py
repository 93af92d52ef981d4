"""Trace collection for ensemble-head training: the expensive part, run once.

On a task's train split, complete each prompt by *sampling* from a behaviour policy
mu = w p + (1 - w) q (a fixed weight, or a previous head's weights), running both models step by
step. For every generated token y the trace keeps what training needs, so training never runs an
LM: both last-layer hidden states (fp16), p(y), q(y), TV(p, q) and mu(y). For every sequence it
keeps the completion, the extracted answer and the task reward.

Layout: ``<out>/seq-NNNNN.safetensors`` + ``seq-NNNNN.json`` per sequence, and ``manifest.json``
(settings, their hash, finished sequences), each written atomically, so a killed collection
resumes where it stopped and refuses to mix settings.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from diversed.config import differing_keys
from diversed.data import DataError, Example, get_task, load_examples
from diversed.engine.loop import _forward, _prefill
from diversed.engine.rules import total_variation
from diversed.engine.sampling import Sampling, probabilities
from diversed.metrics import rouge2_per_example

TENSORS = ("h_draft", "h_target", "p_y", "q_y", "tv", "mu")


@dataclass(frozen=True)
class TraceJob:
    """What determines a trace collection."""

    dataset: str
    split: str = "train"
    n_examples: int = 32
    target: str = ""
    draft: str = ""
    max_new_tokens: int = 128
    temperature: float = 1.0
    behaviour_weights: tuple[float, ...] = (0.5, 1.0)
    head: str | None = None  # a previous head as behaviour policy (replaces the weights)
    chat: bool = False
    dtype: str = "float32"
    seed: int = 42

    def settings(self) -> dict[str, Any]:
        values = asdict(self)
        values["behaviour_weights"] = list(self.behaviour_weights)
        return values

    def settings_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.settings(), sort_keys=True).encode()).hexdigest()[:16]


def task_reward(dataset: str, prediction: str, example: Example) -> float:
    """The paper's sequence reward: exact match, ROUGE-2, sentence BLEU / 100, or tests passed."""
    task = get_task(dataset)
    if task.metric == "accuracy":
        return float(prediction == example.reference)
    if task.metric == "rouge":
        return rouge2_per_example(prediction, example.reference)
    if task.metric == "bleu":
        import sacrebleu

        return (
            sacrebleu.sentence_bleu(prediction, [example.reference], tokenize="13a", lowercase=True).score
            / 100
        )
    from diversed.sandbox import run_program

    return float(run_program(task.program(prediction, example.record)).passed)


WeightFn = Callable[[torch.Tensor, torch.Tensor], float]


@torch.inference_mode()
def rollout(
    target,
    draft,
    prompt: list[int],
    weight_fn: WeightFn,
    sampling: Sampling,
    max_new_tokens: int,
    eos_ids: set[int],
    generator: torch.Generator,
) -> tuple[list[int], dict[str, torch.Tensor]]:
    """Sample a completion token by token from mu = w p + (1 - w) q, recording the trace."""
    target_cache, draft_cache = _prefill(target, prompt), _prefill(draft, prompt)
    last = prompt[-1]
    tokens: list[int] = []
    rows: dict[str, list[torch.Tensor]] = {name: [] for name in TENSORS}
    for _ in range(max_new_tokens):
        p_logits, h_target = _forward(target, [last], target_cache, hidden=True)
        q_logits, h_draft = _forward(draft, [last], draft_cache, hidden=True)
        p, q = probabilities(p_logits[-1], sampling), probabilities(q_logits[-1], sampling)
        w = weight_fn(h_draft[-1:], h_target[-1:])
        mu = w * p + (1 - w) * q
        y = int(torch.multinomial(mu, 1, generator=generator))
        rows["h_draft"].append(h_draft[-1].half())
        rows["h_target"].append(h_target[-1].half())
        rows["p_y"].append(p[y])
        rows["q_y"].append(q[y])
        rows["tv"].append(total_variation(p, q))
        rows["mu"].append(mu[y])
        tokens.append(y)
        last = y
        if y in eos_ids:
            break
    return tokens, {name: torch.stack(values) for name, values in rows.items()}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_manifest(out: Path, job: TraceJob) -> dict[str, Any]:
    path = out / "manifest.json"
    if not path.exists():
        return {"settings": job.settings(), "settings_hash": job.settings_hash(), "sequences": []}
    manifest = json.loads(path.read_text())
    if manifest["settings_hash"] != job.settings_hash():
        diff = differing_keys(manifest["settings"], job.settings())
        raise DataError(f"{out} holds traces made with different settings (differing: {', '.join(diff)})")
    return manifest


def collect_traces(
    job: TraceJob,
    out: str | Path,
    data_dir: str | Path | None = None,
    allow_hub: bool = True,
    device: str = "cpu",
    progress: bool = True,
) -> Path:
    """Roll out every (prompt, behaviour) pair not yet in ``out``."""
    from diversed.head import load_head_for
    from diversed.models import eos_ids, load_pair, load_tokenizer, prompt_ids

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(out_dir, job)
    done = {s["id"] for s in manifest["sequences"]}
    examples = load_examples(job.dataset, job.split, job.n_examples, job.seed, data_dir, allow_hub)
    behaviours: list[tuple[str, float | None]] = (
        [("head", None)] if job.head else [(f"w{w:g}", w) for w in job.behaviour_weights]
    )
    todo = [(e, name, w) for e in examples for name, w in behaviours if f"{e.id}@{name}" not in done]
    if not todo:
        return out_dir
    tokenizer = load_tokenizer(job.target)
    target, draft = load_pair(job.target, job.draft, job.dtype, device)
    head = load_head_for(job.head, target, draft) if job.head else None
    sampling = Sampling(job.temperature)
    stop_ids = eos_ids(tokenizer, target)
    task = get_task(job.dataset)
    for example, name, weight in tqdm(todo, desc=f"traces {job.dataset}", unit="seq", disable=not progress):

        def weight_fn(h_d: torch.Tensor, h_t: torch.Tensor, weight: float | None = weight) -> float:
            return float(head(h_d, h_t)) if head is not None else float(weight)

        index = len(manifest["sequences"])
        generator = torch.Generator().manual_seed(job.seed * 100_003 + index)
        tokens, tensors = rollout(
            target,
            draft,
            prompt_ids(tokenizer, example.prompt, job.chat),
            weight_fn,
            sampling,
            job.max_new_tokens,
            stop_ids,
            generator,
        )
        completion = tokenizer.decode(tokens, skip_special_tokens=True)
        prediction = task.extract(completion, example.record)
        meta = {
            "id": f"{example.id}@{name}",
            "example_id": example.id,
            "behaviour": name,
            "completion": completion,
            "prediction": prediction,
            "reference": example.reference,
            "reward": task_reward(job.dataset, prediction, example),
            "tokens": len(tokens),
            "file": f"seq-{index:05d}",
        }
        save_file(tensors, str(out_dir / f"{meta['file']}.safetensors.tmp"))
        os.replace(out_dir / f"{meta['file']}.safetensors.tmp", out_dir / f"{meta['file']}.safetensors")
        _write_atomic(out_dir / f"{meta['file']}.json", json.dumps(meta, ensure_ascii=False))
        manifest["sequences"].append({k: meta[k] for k in ("id", "file", "reward", "tokens")})
        _write_atomic(out_dir / "manifest.json", json.dumps(manifest, indent=1))
    return out_dir


@dataclass
class Trajectory:
    """One stored sequence, as training reads it."""

    id: str
    reward: float
    tensors: dict[str, torch.Tensor]


def load_traces(directory: str | Path) -> tuple[list[Trajectory], dict[str, Any]]:
    """Every finished sequence of a trace folder, and its manifest."""
    path = Path(directory)
    if not (path / "manifest.json").exists():
        raise DataError(f"no traces at {path} (expected manifest.json; run `diversed collect-traces`)")
    manifest = json.loads((path / "manifest.json").read_text())
    trajectories = [
        Trajectory(s["id"], float(s["reward"]), load_file(str(path / f"{s['file']}.safetensors")))
        for s in manifest["sequences"]
        if s["tokens"] > 0
    ]
    if not trajectories:
        raise DataError(f"{path} holds no non-empty traces")
    return trajectories, manifest
