"""The on-policy check: a trained head is used only if rollouts under the head itself vouch for it.

Selection (:mod:`diversed.training.selection`) scores checkpoints off-policy, on traces another
policy sampled, and its first-order reward estimate is unreliable for large moves: a head with
w ~ 0.001 passed it with a positive lower bound and was 10 points worse on MBPP's test split, and
on the positive control's traces (w = 1 and 0.95) its bounds are too wide (-1 to -5 reward units on
4 validation prompts) to vouch for any move. So before a round's head is used, train-split prompts
that no trace of its training holds are rolled out G times under each candidate (the selection's
choice and each lambda's last epoch, the ``lambda-*`` folders ``train-head`` writes) and under the
head the round started from (the previous round's, or the untrained one: w = 0.5 everywhere), all
with the same seeds (common random numbers: the arms differ by the head alone).

The rule, with the prompt as the unit: a candidate is *eligible* when the one-sided ``confidence``
lower bound of its paired reward change against the start is at least ``-tolerance`` (reward
units) and its mean change of the on-policy objective J = reward + ``acceptance_value`` x
acceptance (accepted / drafted, per prompt) is positive; the eligible candidate with the highest
mean J is kept, and the starting head when none is eligible. So a head that loses reward, or holds
it while accepting less, is refused, and one that buys much reward with some acceptance (a head
that protects the tokens a bad draft gets wrong) is kept. Every rollout is appended to a JSON-lines
log, so an interrupted check resumes; a log written for other heads or settings is started afresh.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from diversed.config import DecodeConfig, check_range
from diversed.data import DataError, Example, get_task, load_examples
from diversed.files import read_json, read_resumable
from diversed.head import CARD, EnsembleHead, load_head, save_head
from diversed.traces import load_traces, task_reward
from diversed.training.selection import lower_bound
from diversed.training.trainer import FINALIST, weight_card

START = "start"
RECORD_START = b'{"id": '


@dataclass(frozen=True)
class CheckJob:
    """What determines an on-policy check (besides the two heads)."""

    dataset: str
    target: str
    draft: str
    split: str = "train"
    n_examples: int = 16  # held-out train prompts
    rollouts: int = 2  # samples of each prompt under each head
    max_new_tokens: int = 128
    temperature: float = 1.0
    draft_length: int = 4
    chat: bool = False
    dtype: str = "float32"
    quantize: str = "none"
    seed: int = 1042  # orders the split; the traces' prompts are excluded by id, whatever their seed
    draft_transform: str | None = None
    tolerance: float = 0.02
    confidence: float = 0.95
    partial_credit: bool = False  # the reward the head was trained on (traces.task_reward)
    acceptance_value: float = 1.0  # reward units one unit of acceptance is worth in J
    sandbox: str = "isolated"  # how code rewards run generated code (diversed.sandbox.MODES)

    def __post_init__(self) -> None:
        check_range("n_examples", self.n_examples, minimum=0)  # 0: not checked
        check_range("rollouts", self.rollouts, minimum=1)
        check_range("max_new_tokens", self.max_new_tokens, minimum=1)
        check_range("temperature", self.temperature, exclusive_minimum=0)
        check_range("draft_length", self.draft_length, minimum=1)
        check_range("tolerance", self.tolerance, minimum=0)
        check_range("confidence", self.confidence, exclusive_minimum=0.5, exclusive_maximum=1)
        check_range("acceptance_value", self.acceptance_value, minimum=0)


def trained_prompts(traces: Sequence[str | Path]) -> set[str]:
    """The example ids every trace folder of the head's training rolled out."""
    ids: set[str] = set()
    for folder in traces:
        for sequence in read_json(Path(folder) / "manifest.json")["sequences"]:
            ids.add(sequence.get("example_id") or sequence["id"].rsplit("@", 1)[0])
    return ids


def held_out(job: CheckJob, exclude: set[str], data_dir: str | Path | None, allow_hub: bool) -> list[Example]:
    """The first ``n_examples`` prompts of the split (in the job's seeded order) that no trace holds."""
    examples = load_examples(job.dataset, job.split, None, job.seed, data_dir, allow_hub)
    fresh = [e for e in examples if e.id not in exclude][: job.n_examples]
    if not fresh:
        raise DataError(f"{job.dataset}/{job.split}: every prompt is in the traces; none is left to check on")
    return fresh


def decide(
    rows: Sequence[dict[str, Any]], tolerance: float, confidence: float, acceptance_value: float = 1.0
) -> dict[str, Any]:
    """The rule of the module docstring over the rollouts of every arm (``start`` and the
    candidates), on the prompts every arm rolled out."""
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0.0, 0.0]))
    for row in rows:
        tally = per[row["example_id"]][row["arm"]]
        for i, key in enumerate(("reward", "accepted", "drafted")):
            tally[i] += row[key]
        tally[3] += 1
    arms = sorted({row["arm"] for row in rows}, key=lambda arm: (arm != START, arm))
    prompts = [p for p, got in per.items() if all(arm in got and got[arm][2] > 0 for arm in arms)]
    if START not in arms or len(arms) < 2 or not prompts:
        raise DataError("the on-policy check has no prompt rolled out under the start and a candidate")
    reward = {a: torch.tensor([per[p][a][0] / per[p][a][3] for p in prompts]) for a in arms}
    accept = {a: torch.tensor([per[p][a][1] / per[p][a][2] for p in prompts]) for a in arms}
    figures: dict[str, dict[str, Any]] = {}
    for arm in arms:
        objective = reward[arm] + acceptance_value * accept[arm]
        figures[arm] = {"reward": float(reward[arm].mean()), "acceptance": float(accept[arm].mean())}
        figures[arm]["objective"] = float(objective.mean())
        if arm == START:
            continue
        change, low = lower_bound(reward[arm] - reward[START], confidence)
        gain = figures[arm]["objective"] - figures[START]["objective"]
        figures[arm].update(
            reward_change=change,
            reward_change_low=low if low != float("-inf") else None,
            reward_change_half_width=change - low if low != float("-inf") else None,
            acceptance_change=figures[arm]["acceptance"] - figures[START]["acceptance"],
            objective_change=gain,
            eligible=low >= -tolerance and gain > 0,
        )
    eligible = [arm for arm in arms if figures[arm].get("eligible")]
    kept = max(eligible, key=lambda arm: figures[arm]["objective"]) if eligible else START
    return {
        "prompts": len(prompts),
        "rollouts": len(rows),
        "arms": figures,
        "kept": kept,
        "power": power_note(figures, tolerance, len(prompts)),
        "rule": (
            f"keep, among the candidates whose paired reward change against the starting head has a "
            f"one-sided {confidence:g} lower bound >= {-tolerance:g} and whose mean J = reward + "
            f"{acceptance_value:g} x acceptance exceeds the start's, the one with the highest J; else the "
            f"start ({len(prompts)} held-out train prompts rolled out under every arm)"
        ),
    }


def power_note(figures: dict[str, dict[str, Any]], tolerance: float, prompts: int) -> str:
    """What this check could have kept: a candidate with the start's mean reward passes the reward
    test only when its bound's half-width is within ``tolerance``, so a check whose half-widths are
    wider can keep only a head that *gains* reward; say so, and about how many prompts would do."""
    widths = [f["reward_change_half_width"] for f in figures.values() if f.get("reward_change_half_width")]
    if not widths or max(widths) <= tolerance:
        return f"every candidate's reward bound was within {tolerance:g} of its mean change"
    if tolerance == 0:
        return (
            "with tolerance 0 only a candidate whose reward never differs from the start's or rises can pass"
        )
    wide = min(widths)
    needed = math.ceil(prompts * (wide / tolerance) ** 2)
    return (
        f"the reward bounds' half-widths were {wide:.3g}..{max(widths):.3g} reward units on {prompts} "
        f"prompts, wider than the tolerance {tolerance:g}: a head that holds the start's reward could "
        f"not have been kept; ~{needed} prompts would bound the narrowest to the tolerance"
    )


def _heads_digest(heads: dict[str, EnsembleHead], job: CheckJob) -> str:
    """What the log's rollouts depend on: every arm's name and weights, and the job's settings."""
    fields = {k: v for k, v in asdict(job).items() if not (k == "sandbox" and v == "isolated")}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())  # logs from before it stay valid
    for arm, head in sorted(heads.items()):
        digest.update(arm.encode())
        for name, value in sorted(head.state_dict().items()):
            digest.update(name.encode() + value.float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def _read_log(path: Path, digest: str) -> list[dict[str, Any]]:
    """The log's rollouts for these heads; a torn last line is cut, another check's log replaced."""
    if not path.exists():
        return []
    rows, length = read_resumable(path, RECORD_START)
    if any(row.get("digest") != digest for row in rows):
        print(f"{path}: rollouts of another check (other heads or settings); starting afresh")
        path.write_text("")
        return []
    with path.open("r+b") as handle:
        handle.truncate(length)
    return rows


def rollout_arms(
    job: CheckJob,
    heads: dict[str, EnsembleHead],
    examples: Sequence[Example],
    log: Path,
    digest: str,
    done: set[str],
    device: str = "cpu",
    batch_size: int = 4,
) -> list[dict[str, Any]]:
    """Roll out every (prompt, rollout) under each arm's head that ``log`` lacks; append and return
    the new rows. Rollout g of prompt i is seeded alike in every arm."""
    from diversed.models import prompt_ids, shared_prefix
    from diversed.stack import load_stack

    order = [(i, e, g) for i, e in enumerate(examples) for g in range(job.rollouts)]
    todo = {arm: [item for item in order if f"{item[1].id}#{item[2]}@{arm}" not in done] for arm in heads}
    if not any(todo.values()):
        return []
    stack = load_stack(
        job.target, job.draft, job.dtype, device, job.quantize, draft_transform=job.draft_transform
    )
    task = get_task(job.dataset)
    prompts = {e.id: prompt_ids(stack.tokenizer, e.prompt, job.chat) for e in examples}
    prefix = shared_prefix(stack.tokenizer, examples[0].prefix, job.chat, prompts.values())
    config = DecodeConfig.from_dict(
        {
            "method": "diversed",
            "temperature": job.temperature,
            "num_assistant_tokens": job.draft_length,
            "max_new_tokens": job.max_new_tokens,
        }
    )
    rows = []
    with log.open("a", encoding="utf-8") as sink:
        for arm in heads:
            decoder = stack.decoder(config, task.stop_strings, head=heads[arm], prefix=prefix)
            for first in range(0, len(todo[arm]), batch_size):
                batch = todo[arm][first : first + batch_size]
                seeds = [job.seed * 100_003 + i * job.rollouts + g for i, _, g in batch]
                results = decoder.generate_batch([prompts[e.id] for _, e, _ in batch], seeds=seeds)
                for (_, example, g), result in zip(batch, results, strict=True):
                    prediction = task.extract(
                        stack.tokenizer.decode(result.token_ids, skip_special_tokens=True), example.record
                    )
                    row = {
                        "id": f"{example.id}#{g}@{arm}",
                        "example_id": example.id,
                        "arm": arm,
                        "reward": task_reward(
                            job.dataset, prediction, example, job.partial_credit, job.sandbox
                        ),
                        "accepted": result.stats.accepted,
                        "drafted": result.stats.drafted,
                        "tokens": len(result.token_ids),
                        "digest": digest,
                    }
                    sink.write(json.dumps(row, ensure_ascii=False) + "\n")
                    rows.append(row)
                sink.flush()
    return rows


def _same(a: EnsembleHead, b: EnsembleHead) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def candidate_folders(candidate: Path) -> dict[str, Path]:
    """The arms a ``train-head`` folder offers: its chosen head and each lambda's last epoch."""
    return {"chosen": candidate, **{d.name: d for d in sorted(candidate.glob(f"{FINALIST}*")) if d.is_dir()}}


def check_head(
    candidate: str | Path,
    out: str | Path,
    traces: Sequence[str | Path],
    job: CheckJob,
    start: str | Path | None = None,
    log: str | Path | None = None,
    data_dir: str | Path | None = None,
    allow_hub: bool = True,
    device: str = "cpu",
    batch_size: int = 4,
) -> dict[str, Any]:
    """Check the heads of ``candidate`` (a ``train-head`` folder) against ``start`` (the previous
    round's head, else the untrained one) on held-out prompts; write the kept head to ``out`` with
    the check in its card, and return the check's record."""
    check_range("batch_size", batch_size, minimum=1)
    candidate_dir, out_dir = Path(candidate), Path(out)
    card = read_json(candidate_dir / CARD)
    training = card.get("training", {})  # the untrained head the trainer started from, seeded alike
    fresh = EnsembleHead(
        card["d_draft"], card["d_target"], training.get("hidden", 0), training.get("seed", 0)
    )
    heads = {START: load_head(start) if start else fresh}
    folders: dict[str, Path] = {}
    for name, folder in candidate_folders(candidate_dir).items():
        head = load_head(folder)
        if not any(_same(head, other) for other in heads.values()):  # each distinct head once
            heads[name], folders[name] = head, folder
    if len(heads) == 1:
        record: dict[str, Any] = {
            "kept": START,
            "rule": "every candidate is the starting head: nothing to check",
        }
    elif job.n_examples == 0:
        record = {"kept": "chosen" if "chosen" in heads else START, "rule": "not checked (n_examples: 0)"}
    else:
        log_path = Path(log) if log else out_dir.with_name(out_dir.name + ".check.jsonl")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        digest = _heads_digest(heads, job)
        rows = _read_log(log_path, digest)
        examples = held_out(job, trained_prompts(traces), data_dir, allow_hub)
        wanted = {f"{e.id}#{g}@{arm}" for e in examples for g in range(job.rollouts) for arm in heads}
        rows += rollout_arms(
            job, heads, examples, log_path, digest, {r["id"] for r in rows}, device, batch_size
        )
        rows = [r for r in rows if r["id"] in wanted]
        record = {**decide(rows, job.tolerance, job.confidence, job.acceptance_value), "log": str(log_path)}
    record["job"] = asdict(job)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    kept = record["kept"]
    if kept != START:
        kept_card = read_json(folders[kept] / CARD)
        shutil.copytree(folders[kept], out_dir, ignore=shutil.ignore_patterns(f"{FINALIST}*"))
        (out_dir / CARD).write_text(json.dumps({**kept_card, "check": record}, indent=2) + "\n")
        return record
    trajectories = [t for folder in traces for t in load_traces(folder)[0]]
    save_head(
        heads[START],
        out_dir,
        {
            **card,
            "check": {
                **record,
                "refused": {"metrics": card.get("metrics"), "w_histogram": card.get("w_histogram")},
            },
            **weight_card(heads[START], trajectories),
        },
    )
    return record
