"""Trace collection for ensemble-head training: the expensive part, run once.

On a task's train split, complete each prompt by *sampling* from a behaviour policy
mu = w p + (1 - w) q (a fixed weight, or a previous head's weights). Sampling runs as speculative
decoding against v = mu (exact, like ``static``), batched, in the engine's trace mode, so a
sequence costs a target forward per block rather than per token. For every generated token y the
trace keeps what training needs, so training never runs an LM: both last-layer hidden states
(fp16), p(y), q(y), mu(y) and the verifier's signals (TV(p, q), both models' entropies). For every
sequence it keeps the completion, the extracted answer and the task reward. A rollout ends where a
decode of the task ends (EOS, the task's stop strings, the budget): tokens past the answer would
cost time and carry a reward they did not earn.

Layout: ``<out>/seq-NNNNN.safetensors`` + ``seq-NNNNN.json`` per sequence, and ``manifest.json``
(settings, their hash, finished sequences), each written atomically, so a killed collection
resumes where it stopped and refuses to mix settings.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from diversed.config import DecodeConfig, check_range, differing_keys
from diversed.data import DataError, get_task, load_examples
from diversed.evaluation.metrics import task_reward
from diversed.files import read_json
from diversed.jobs.runner import RunOptions, batched, open_run
from diversed.provenance import head_sha256, settings_hash
from diversed.sandbox import require_isolation


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
    draft_length: int = 4  # tokens drafted per block of the speculative sampler
    chat: bool = False
    dtype: str = "float32"
    quantize: str = "none"
    seed: int = 42
    rollouts: int = 1  # samples of each (prompt, behaviour): a group whose rewards can be compared
    draft_transform: str | None = None  # a positive control's damaged draft (diversed.loading.control)
    partial_credit: bool = False  # code rewards: the share of asserts passed (task_reward)
    sandbox: str = "isolated"  # how code rewards run generated code (diversed.sandbox.MODES)
    stop: str = "paper"  # where rollouts stop (diversed.data.tasks.STOPS): no reward for text after it

    def __post_init__(self) -> None:
        check_range("n_examples", self.n_examples, minimum=1)
        check_range("max_new_tokens", self.max_new_tokens, minimum=1)
        check_range("temperature", self.temperature, minimum=0)
        check_range("draft_length", self.draft_length, minimum=1)
        check_range("rollouts", self.rollouts, minimum=1)
        for weight in self.behaviour_weights:
            check_range("behaviour_weights", weight, minimum=0, maximum=1)

    def settings(self) -> dict[str, Any]:
        """The job's fields, and a previous head's content hash: a head is named by its folder, but
        a head retrained into the same folder makes traces sampled from the old one stale."""
        values = asdict(self)
        named_when_used = (
            ("quantize", "none"),
            ("rollouts", 1),
            ("draft_transform", None),
            ("partial_credit", False),
            ("sandbox", "isolated"),
            ("stop", "paper"),
        )
        for name, default in named_when_used:
            if values[name] == default:  # named only when used: traces collected before stay valid
                del values[name]
        values["behaviour_weights"] = list(self.behaviour_weights)
        if digest := head_sha256(self.head):
            values["head_sha256"] = digest[:16]
        return values


def sequence_id(example_id: str, behaviour: str, rollout: int, rollouts: int) -> str:
    """``<example>@<behaviour>``, and ``#<rollout>`` when each prompt is rolled out several times."""
    return f"{example_id}@{behaviour}" + (f"#{rollout}" if rollouts > 1 else "")


def behaviour_config(job: TraceJob, weight: float | None) -> DecodeConfig:
    """Speculative decoding against v = mu, the behaviour mixture, run in trace mode.

    ``static`` with weight w verifies against mu = w p + (1 - w) q exactly (a fixed behaviour
    weight); ``diversed`` with a previous head against its per-token mixture (the next round).
    Trace mode emits no bonus token from p, so every token is a sample of mu.
    """
    values = {
        "method": "diversed" if weight is None else "static",
        "temperature": job.temperature,
        "num_assistant_tokens": job.draft_length,
        "max_new_tokens": job.max_new_tokens,
    }
    if weight is not None:
        values["target_weight"] = weight
    return DecodeConfig.from_dict(values)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_manifest(out: Path, job: TraceJob, replace_stale: bool = False) -> dict[str, Any]:
    """The folder's manifest, to resume from; traces made with other settings are an error, or,
    with ``replace_stale`` (the workflow, which owns its folders), deleted."""
    path = out / "manifest.json"
    settings = job.settings()
    fresh = {"settings": settings, "settings_hash": settings_hash(settings), "sequences": []}
    if not path.exists():
        return fresh
    manifest = read_json(path)
    if manifest["settings_hash"] != fresh["settings_hash"]:
        diff = ", ".join(differing_keys(manifest["settings"], settings))
        if not replace_stale:
            raise DataError(
                f"{out} holds traces made with different settings (differing: {diff});"
                " delete them or pass --replace-stale"
            )
        print(f"{out}: deleting traces made with different settings (differing: {diff})")
        for stale in [*out.glob("seq-*.json"), *out.glob("seq-*.safetensors"), path]:
            stale.unlink()
        return fresh
    return manifest


def check_sequences(out: Path, manifest: dict[str, Any]) -> None:
    """Every sequence the manifest lists is on disk and readable: a collection that resumes over a
    damaged trace file names it instead of calling the folder done."""
    for sequence in manifest["sequences"]:
        path = out / f"{sequence['file']}.safetensors"
        try:
            safe_open(str(path), "pt")  # reads the header: a cut or garbled file fails here
        except (OSError, SafetensorError) as err:
            raise DataError(
                f"{path}: trace listed in {out / 'manifest.json'} is unreadable ({err}); delete the folder"
                " and collect again"
            ) from None


def collect_traces(
    job: TraceJob,
    out: str | Path,
    options: RunOptions | None = None,
    data_dir: str | Path | None = None,
    allow_hub: bool = True,
    replace_stale: bool = False,
) -> Path:
    """Roll out every (prompt, behaviour, rollout) not yet in ``out``, ``options.batch_size`` at a time.

    The manifest is rewritten after each batch, so a kill loses at most the batch in flight;
    sequence n is seeded with ``seed * 100_003 + n`` whatever the batch size. A group's rollouts
    are consecutive, so a batch holds few distinct prompts: the engine prefills each once, and
    the task's shared prompt start once per model for the whole collection (``options.prefix_cache``).
    """
    if get_task(job.dataset).metric == "pass@1":  # its rewards run the rollouts' code
        require_isolation(job.sandbox, f"collect-traces {job.dataset}")
    options = options or RunOptions()
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(out_dir, job, replace_stale)
    check_sequences(out_dir, manifest)
    done = {s["id"] for s in manifest["sequences"]}
    examples = load_examples(job.dataset, job.split, job.n_examples, job.seed, data_dir, allow_hub)
    behaviours: list[tuple[str, float | None]] = (
        [("head", None)] if job.head else [(f"w{w:g}", w) for w in job.behaviour_weights]
    )
    todo = [
        (e, name, sequence_id(e.id, name, g, job.rollouts))
        for name, _ in behaviours
        for e in examples
        for g in range(job.rollouts)
        if sequence_id(e.id, name, g, job.rollouts) not in done
    ]
    if not todo:
        return out_dir
    run = open_run(job, examples, options, job.draft, job.head)
    bar = tqdm(total=len(todo), desc=f"traces {job.dataset}", unit="seq", disable=not options.progress)
    for name, weight in behaviours:
        decoder = run.decoder(behaviour_config(job, weight), traces=True)
        for batch in batched((item for item in todo if item[1] == name), options.batch_size):
            index = len(manifest["sequences"])
            seeds = [job.seed * 100_003 + index + i for i in range(len(batch))]
            results = decoder.generate_batch([run.prompts[e.id] for e, _, _ in batch], seeds=seeds)
            for offset, ((example, _, seq_id), result) in enumerate(zip(batch, results, strict=True)):
                completion = run.decode_text(result.token_ids)
                prediction = run.task.extract(completion, example.record)
                meta = {
                    "id": seq_id,
                    "example_id": example.id,
                    "behaviour": name,
                    "completion": completion,
                    "prediction": prediction,
                    "reference": example.reference,
                    "reward": task_reward(job.dataset, prediction, example, job.partial_credit, job.sandbox),
                    "tokens": len(result.token_ids),
                    "file": f"seq-{index + offset:05d}",
                    "stats": result.stats.to_dict(),
                }
                path = out_dir / f"{meta['file']}.safetensors"
                save_file(result.trace, str(path) + ".tmp")
                os.replace(str(path) + ".tmp", path)
                _write_atomic(out_dir / f"{meta['file']}.json", json.dumps(meta, ensure_ascii=False))
                manifest["sequences"].append(
                    {k: meta[k] for k in ("id", "example_id", "file", "reward", "tokens")}
                )
            _write_atomic(out_dir / "manifest.json", json.dumps(manifest, indent=1))
            bar.update(len(batch))
    bar.close()
    return out_dir
