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
from diversed.engine.cache import RaggedCache
from diversed.engine.rules import total_variation
from diversed.engine.sampling import RowRandom, Sampling, draw, probabilities
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


# A head: behaviour weights w [B] from the last-layer hidden states [B, d_draft] and [B, d_target].
HeadFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@torch.inference_mode()
def rollout(
    target,
    draft,
    prompts: list[list[int]],
    behaviour: HeadFn | list[float],
    sampling: Sampling,
    max_new_tokens: int,
    eos_ids: set[int],
    seeds: list[int],
) -> list[tuple[list[int], dict[str, torch.Tensor]]]:
    """Sample a batch of completions token by token from mu = w p + (1 - w) q, recording traces.

    ``behaviour`` is a head, or one fixed weight per prompt. Rows share the two models' forwards
    (see :mod:`diversed.engine.cache`) and own their random streams, so each row equals its
    batch-1 rollout; a row that emits an end token leaves the batch.
    """
    device = target.device
    caches = [RaggedCache(model, len(prompts)) for model in (target, draft)]
    for cache in caches:
        cache.prefill([p[:-1] for p in prompts])
    rng = RowRandom(seeds, device)
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
    last = torch.tensor([p[-1] for p in prompts], device=device)
    fixed = None if callable(behaviour) else torch.tensor(behaviour, device=device)
    live = list(range(len(prompts)))  # caller's row index of each batch row
    tokens: list[list[int]] = [[] for _ in prompts]
    rows: list[dict[str, list[torch.Tensor]]] = [{name: [] for name in TENSORS} for _ in prompts]
    for _ in range(max_new_tokens):
        real = torch.ones(len(live), 1, dtype=torch.bool, device=device)
        (p_logits, h_target), (q_logits, h_draft) = (
            c.forward(last[:, None], real, hidden=True) for c in caches
        )
        p, q = probabilities(p_logits[:, -1], sampling), probabilities(q_logits[:, -1], sampling)
        h_draft, h_target = h_draft[:, -1].float(), h_target[:, -1].float()
        w = (behaviour(h_draft, h_target) if fixed is None else fixed).reshape(-1, 1).to(p.dtype)
        mu = w * p + (1 - w) * q
        y = draw(mu, sampling, None if sampling.greedy else rng.uniform(1, real[:, 0])[:, 0])
        at = y.unsqueeze(1)
        fields = {
            "h_draft": h_draft.half(),
            "h_target": h_target.half(),
            "p_y": p.gather(1, at)[:, 0],
            "q_y": q.gather(1, at)[:, 0],
            "tv": total_variation(p, q),
            "mu": mu.gather(1, at)[:, 0],
        }
        fields = {name: value.cpu() for name, value in fields.items()}
        for b, (row, token) in enumerate(zip(live, y.tolist(), strict=True)):
            tokens[row].append(token)
            for name, value in fields.items():
                rows[row][name].append(value[b])
        going = ~torch.isin(y, eos)
        if not bool(going.all()):
            keep = going.nonzero()[:, 0]
            live = [live[b] for b in keep.tolist()]
            if not live:
                break
            for cache in caches:
                cache.select(keep)
            rng.select(keep)
            y = y[keep]
            if fixed is not None:
                fixed = fixed[keep]
        last = y
    return [
        (tokens[i], {name: torch.stack(values) for name, values in rows[i].items()})
        for i in range(len(prompts))
    ]


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
    batch_size: int = 1,
) -> Path:
    """Roll out every (prompt, behaviour) pair not yet in ``out``, ``batch_size`` at a time.

    The manifest is rewritten after each batch, so a kill loses at most the batch in flight;
    sequence n is seeded with ``seed * 100_003 + n`` whatever the batch size.
    """
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
    bar = tqdm(total=len(todo), desc=f"traces {job.dataset}", unit="seq", disable=not progress)
    for first in range(0, len(todo), batch_size):
        batch = todo[first : first + batch_size]
        index = len(manifest["sequences"])
        seeds = [job.seed * 100_003 + index + i for i in range(len(batch))]
        results = rollout(
            target,
            draft,
            [prompt_ids(tokenizer, example.prompt, job.chat) for example, _, _ in batch],
            head if head is not None else [weight for _, _, weight in batch],
            sampling,
            job.max_new_tokens,
            stop_ids,
            seeds,
        )
        for offset, ((example, name, _), (tokens, tensors)) in enumerate(zip(batch, results, strict=True)):
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
                "file": f"seq-{index + offset:05d}",
            }
            save_file(tensors, str(out_dir / f"{meta['file']}.safetensors.tmp"))
            os.replace(out_dir / f"{meta['file']}.safetensors.tmp", out_dir / f"{meta['file']}.safetensors")
            _write_atomic(out_dir / f"{meta['file']}.json", json.dumps(meta, ensure_ascii=False))
            manifest["sequences"].append({k: meta[k] for k in ("id", "file", "reward", "tokens")})
        _write_atomic(out_dir / "manifest.json", json.dumps(manifest, indent=1))
        bar.update(len(batch))
    bar.close()
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
