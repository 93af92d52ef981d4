"""The on-policy check: the trained head against the static rule at its own mean w.

Selection (:mod:`diversed.training.selection`) scores checkpoints off-policy, on traces another
policy sampled. The question a head exists for is whether putting its weight per token beats
spending the same mean weight on every token, so before its test cells the chosen head is rolled
out on train-split prompts that no trace of its training holds, G times each, and so is the
constant head at that head's own on-policy mean w (the static ensemble at that w), with the same
seeds (common random numbers: the two arms differ only in where the weight goes).

The verdict, with the prompt as the unit: the paired change of reward (head minus static), its
two-sided ``confidence`` interval, and the smallest change the check could have detected with 80%
power; the same for acceptance and for J = reward + ``acceptance_value`` x acceptance. The head is
kept whatever the verdict (a trained head is never swapped for the untrained start, which is
static w = 0.5): the verdict travels with it, in its card and in every record decoded with it, and
the report prints it beside the head. A head that training left untrained (no reward information
in its traces) is not rolled out: its card says it is static w = 0.5. Every rollout is appended
to a JSON-lines log, so an interrupted check resumes; a log of another head or settings is
started afresh.
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
from statistics import NormalDist
from typing import Any

import torch

from diversed.config import DecodeConfig, check_range
from diversed.data import DataError, Example, get_task, load_examples
from diversed.evaluation.frontier import POWER_FACTOR
from diversed.evaluation.metrics import task_reward
from diversed.files import read_json, read_resumable
from diversed.head import CARD, EnsembleHead, load_head
from diversed.jobs.runner import ModelRun, RunOptions, batched, open_run
from diversed.sandbox import require_isolation
from diversed.training.selection import constant_head
from diversed.training.trainer import FINALIST

HEAD, STATIC = "head", "static"
ARMS = (HEAD, STATIC)
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
    confidence: float = 0.95
    partial_credit: bool = False  # the reward the head was trained on (evaluation.metrics.task_reward)
    acceptance_value: float = 1.0  # reward units one unit of acceptance is worth in J
    sandbox: str = "isolated"  # how code rewards run generated code (diversed.sandbox.MODES)
    stop: str = "paper"  # where rollouts stop (diversed.data.tasks.STOPS)

    def __post_init__(self) -> None:
        check_range("n_examples", self.n_examples, minimum=0)  # 0: not checked
        check_range("rollouts", self.rollouts, minimum=1)
        check_range("max_new_tokens", self.max_new_tokens, minimum=1)
        check_range("temperature", self.temperature, exclusive_minimum=0)
        check_range("draft_length", self.draft_length, minimum=1)
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


def paired_change(differences: torch.Tensor, confidence: float) -> dict[str, Any]:
    """Mean of per-prompt differences, its two-sided interval and the 80%-power effect. Differences
    alike on every prompt have no spread: their interval has zero width and says nothing about the
    effect the check could detect, so there is no power figure (None)."""
    n = differences.numel()
    mean = float(differences.mean())
    if n < 2:
        return {"change": mean, "ci": None, "effect_80": None}
    error = float(differences.std()) / math.sqrt(n)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    power = POWER_FACTOR * error if error > 0 else None
    return {"change": mean, "ci": [mean - z * error, mean + z * error], "effect_80": power}


def verdict(
    rows: Sequence[dict[str, Any]], confidence: float, acceptance_value: float = 1.0
) -> dict[str, Any]:
    """The head arm against the static arm on the prompts both rolled out (module docstring)."""
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0.0, 0.0]))
    for row in rows:
        tally = per[row["example_id"]][row["arm"]]
        for i, key in enumerate(("reward", "accepted", "drafted")):
            tally[i] += row[key]
        tally[3] += 1
    prompts = [p for p, got in per.items() if all(arm in got and got[arm][2] > 0 for arm in ARMS)]
    if not prompts:
        raise DataError(
            "the on-policy check has no prompt rolled out under both the head and the static rule"
        )
    reward = {a: torch.tensor([per[p][a][0] / per[p][a][3] for p in prompts]) for a in ARMS}
    accept = {a: torch.tensor([per[p][a][1] / per[p][a][2] for p in prompts]) for a in ARMS}
    objective = {a: reward[a] + acceptance_value * accept[a] for a in ARMS}
    figures = {
        "reward": paired_change(reward[HEAD] - reward[STATIC], confidence),
        "acceptance": paired_change(accept[HEAD] - accept[STATIC], confidence),
        "objective": paired_change(objective[HEAD] - objective[STATIC], confidence),
    }
    change = figures["reward"]
    if torch.equal(reward[HEAD], reward[STATIC]) and torch.equal(accept[HEAD], accept[STATIC]):
        summary = (
            f"the head and static at its own w rolled out alike on all {len(prompts)} prompts (same reward"
            " and acceptance per prompt): its weight is constant in effect, and no per-token effect can show"
        )
    elif change["ci"] is None:
        summary = f"reward {change['change']:+.3g} vs static, one prompt: no interval"
    elif torch.equal(reward[HEAD], reward[STATIC]):
        low, high = figures["acceptance"]["ci"]
        summary = (
            f"the same reward as static at its own w on all {len(prompts)} prompts (no spread: no interval"
            f" or power figure for reward); acceptance {figures['acceptance']['change']:+.3g}"
            f" [{low:+.3g}, {high:+.3g}]"
        )
    else:
        low, high = change["ci"]
        side = "above" if low > 0 else "below" if high < 0 else "not distinguishable from"
        summary = (
            f"reward {change['change']:+.3g} [{low:+.3g}, {high:+.3g}] vs static at its own w: {side} it"
            f" (80%-power effect {change['effect_80']:.3g}, {len(prompts)} prompts)"
        )
    return {
        "prompts": len(prompts),
        "rollouts": len(rows),
        "arms": {a: {"reward": float(reward[a].mean()), "acceptance": float(accept[a].mean())} for a in ARMS},
        **figures,
        "verdict": summary,
    }


def _heads_digest(heads: dict[str, EnsembleHead], job: CheckJob) -> str:
    """What the log's rollouts depend on: every arm's name and weights, and the job's settings."""
    defaults = {"sandbox": "isolated", "stop": "paper"}  # named when used: logs from before stay valid
    fields = {k: v for k, v in asdict(job).items() if defaults.get(k, object()) != v}
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


class Rollouts:
    """The check's rollouts of one arm at a time over the held-out prompts, with the models loaded
    once (on first use: a check resumed from a complete log loads nothing) and every rollout
    appended to the log as it ends. Rollout g of prompt i is seeded alike in every arm."""

    def __init__(
        self, job: CheckJob, examples: Sequence[Example], log: Path, digest: str, options: RunOptions
    ):
        self.job, self.examples, self.log, self.digest, self.options = job, examples, log, digest, options
        self._run: ModelRun | None = None

    def order(self) -> list[tuple[int, Example, int]]:
        """(prompt index, prompt, rollout) of every rollout an arm makes."""
        return [(i, e, g) for i, e in enumerate(self.examples) for g in range(self.job.rollouts)]

    def run(self, arm: str, head: EnsembleHead, done: set[str], **extra: Any) -> list[dict[str, Any]]:
        """Roll out what ``done`` lacks of ``arm`` under ``head``; append and return the new rows
        (each with ``extra`` fields and the sum and count of the head's per-token w)."""
        job = self.job
        todo = [item for item in self.order() if f"{item[1].id}#{item[2]}@{arm}" not in done]
        if not todo:
            return []
        if self._run is None:
            self._run = open_run(job, self.examples, self.options, job.draft)
        run = self._run
        config = DecodeConfig.from_dict(
            {
                "method": "diversed",
                "temperature": job.temperature,
                "num_assistant_tokens": job.draft_length,
                "max_new_tokens": job.max_new_tokens,
            }
        )
        decoder = run.decoder(config, head=head.to(run.stack.target.device))
        rows = []
        with self.log.open("a", encoding="utf-8") as sink:
            for batch in batched(todo, self.options.batch_size):
                seeds = [job.seed * 100_003 + i * job.rollouts + g for i, _, g in batch]
                results = decoder.generate_batch([run.prompts[e.id] for _, e, _ in batch], seeds=seeds)
                for (_, example, g), result in zip(batch, results, strict=True):
                    prediction = run.task.extract(run.decode_text(result.token_ids), example.record)
                    weights = [s[0] for s in result.token_stats or [] if s is not None]
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
                        "w_sum": sum(weights),
                        "w_count": len(weights),
                        "digest": self.digest,
                        **extra,
                    }
                    sink.write(json.dumps(row, ensure_ascii=False) + "\n")
                    rows.append(row)
                sink.flush()
        return rows


def check_head(
    candidate: str | Path,
    out: str | Path,
    traces: Sequence[str | Path],
    job: CheckJob,
    log: str | Path | None = None,
    options: RunOptions | None = None,
    data_dir: str | Path | None = None,
    allow_hub: bool = True,
) -> dict[str, Any]:
    """Check the head ``train-head`` chose (``candidate``) against the static rule at its own
    on-policy mean w on held-out prompts; write it to ``out`` with the verdict in its card, and
    return the check's record."""
    if job.n_examples and get_task(job.dataset).metric == "pass@1":  # its rewards run the rollouts' code
        require_isolation(job.sandbox, f"check-head {job.dataset}")
    candidate_dir, out_dir = Path(candidate), Path(out)
    card = read_json(candidate_dir / CARD)
    head = load_head(candidate_dir)
    if card.get("untrained"):
        record: dict[str, Any] = {
            "verdict": "untrained (its traces held no reward information): the head is static w = 0.5",
            "rollouts": 0,
        }
    elif job.n_examples == 0:
        record = {"verdict": "not checked (n_examples: 0)", "rollouts": 0}
    else:
        log_path = Path(log) if log else out_dir.with_name(out_dir.name + ".check.jsonl")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        digest = _heads_digest({HEAD: head}, job)
        rows = _read_log(log_path, digest)
        examples = held_out(job, trained_prompts(traces), data_dir, allow_hub)
        rollouts = Rollouts(job, examples, log_path, digest, options or RunOptions(batch_size=4))
        wanted = {f"{e.id}#{g}@{arm}" for arm in ARMS for _, e, g in rollouts.order()}
        rows = [r for r in rows if r["id"] in wanted]
        rows += rollouts.run(HEAD, head, {r["id"] for r in rows})
        own = [r for r in rows if r["arm"] == HEAD]
        w = sum(r["w_sum"] for r in own) / max(1, sum(r["w_count"] for r in own))
        rows = [r for r in rows if r["arm"] == HEAD or r.get("static_w") == w]  # a static arm at this w
        rows += rollouts.run(STATIC, constant_head(head, w), {r["id"] for r in rows}, static_w=w)
        record = {
            **verdict(rows, job.confidence, job.acceptance_value),
            "static_w": w,
            "log": str(log_path),
        }
    record["job"] = asdict(job)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    shutil.copytree(candidate_dir, out_dir, ignore=shutil.ignore_patterns(f"{FINALIST}*"))
    (out_dir / CARD).write_text(json.dumps({**card, "check": record}, indent=2) + "\n")
    return record
