"""Decoding a dataset into a resumable JSONL file, one line per example.

Examples are decoded in batches of ``batch_size`` prompts; each batch's lines are written,
flushed and fsync'ed as the batch finishes. Rerunning with the same arguments skips the examples
already there (a line cut short by a kill is dropped and redone), so a killed job loses at most
the batch in flight and never duplicates an example. Every line carries the settings that made
it; a file made with other settings is refused, not mixed. The batch size is not a setting: row b
of a batch equals its batch-1 decoding (fp32), so a job may resume at another batch size. Batches
take the examples in order of prompt length (the least left padding to prefill); a finished file
is rewritten in the examples' order.

Latency keeps the paper's meaning (one prompt at a time): the first ``latency_examples`` examples
of the job are decoded at batch 1, and their timings are the job's seconds per example; the
batched remainder gives its throughput. Each record says which batch it was in
(``batch: {size, id, seconds}``), so tables can label every timing with its batch size.
"""

from __future__ import annotations

import copy
import json
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from diversed.config import ConfigError, DecodeConfig, check_range, differing_keys
from diversed.data import DataError, Example, get_task, load_examples
from diversed.devices import device_name
from diversed.engine.stats import GenerationStats
from diversed.evaluation.weights import token_class
from diversed.files import read_resumable
from diversed.jobs.runner import RunOptions, batched, open_run
from diversed.jobs.turns import answer_turns
from diversed.methods import Method, Schedule
from diversed.provenance import commit, head_sha256, settings_hash

# How every decode record's line begins (``id`` is its first key): a torn last line that begins
# otherwise is not ours, and the file is refused rather than cut.
RECORD_START = b'{"id": '


@dataclass(frozen=True)
class DecodeJob:
    """Everything that determines the records of one decode run."""

    dataset: str
    split: str
    n_examples: int | None
    target: str
    draft: str | None
    config: DecodeConfig
    chat: bool = False
    dtype: str = "float32"
    head: str | None = None
    quantize: str = "none"
    draft_transform: str | None = None  # a positive control's damaged draft (diversed.loading.control)
    stop: str = "paper"  # where completions stop (diversed.data.tasks.STOPS)
    # examples before this one in the seeded order are not this cell's (a confirmatory cell decodes
    # fresh ones); each example keeps its position's seed, so a cell split at it joins up again
    first_example: int = 0
    # a benchmark with categories (Spec-Bench): these only, the first per_category of each by id
    categories: tuple[str, ...] = ()
    per_category: int | None = None

    def __post_init__(self) -> None:
        check_range("n_examples", self.n_examples, minimum=1)
        check_range("first_example", self.first_example, minimum=0)
        check_range("per_category", self.per_category, minimum=1)
        if get_task(self.dataset).chat and not self.chat:  # a chat benchmark is asked in the template
            object.__setattr__(self, "chat", True)
        object.__setattr__(self, "categories", tuple(self.categories))
        if self.n_examples is not None and self.first_example >= self.n_examples:
            raise ConfigError(
                f"first_example {self.first_example} leaves no example of n_examples {self.n_examples}"
            )

    def examples(self, data_dir: str | Path | None = None, allow_hub: bool = True) -> list[Example]:
        """This cell's examples, in the order whose position seeds each one."""
        return load_examples(
            self.dataset,
            self.split,
            self.n_examples,
            directory=data_dir,
            allow_hub=allow_hub,
            start=self.first_example,
            categories=self.categories,
            per_category=self.per_category,
        )

    def settings(self) -> dict[str, Any]:
        # named only when used: records decoded before these existed stay resumable
        quantized = {"quantize": self.quantize} if self.quantize != "none" else {}
        if self.draft_transform is not None and self.config.method.speculative:
            quantized["draft_transform"] = self.draft_transform
        config = self.config.to_dict()
        if self.config.method is not Method.GATE:
            del config["gate"], config["gate_threshold"]
        if (digest := head_sha256(self.head)) is not None:  # the head's bytes, not only its folder
            quantized["head_sha256"] = digest
        if self.stop != "paper":
            quantized["stop"] = self.stop
        if self.first_example:
            quantized["first_example"] = self.first_example
        if self.categories:
            quantized["categories"] = list(self.categories)
        if self.per_category is not None:
            quantized["per_category"] = self.per_category
        return {
            "dataset": self.dataset,
            "split": self.split,
            "n_examples": self.n_examples,
            "target": self.target,
            "draft": self.draft if self.config.method.speculative else None,
            "chat": self.chat,
            "dtype": self.dtype,
            **quantized,
            "head": self.head,
            **config,
        }

    def settings_hash(self) -> str:
        return settings_hash(self.settings())


def read_finished(path: Path, job: DecodeJob, replace_stale: bool = False) -> dict[str, dict[str, Any]]:
    """Records already in ``path``; drop a torn last record; adopt the records of a smaller cell of the
    same settings (:func:`grows`); refuse records of other settings and files that are not decode
    JSONL (naming the file and line, and changing nothing), or with ``replace_stale`` (the workflow,
    which owns its row files) start the file over when its records are another setting's."""
    if not path.exists():
        return {}
    records, keep_bytes = read_resumable(path, RECORD_START)
    finished: dict[str, dict[str, Any]] = {}
    for number, record in enumerate(records, 1):
        if "settings_hash" not in record or "id" not in record:
            raise DataError(
                f"{path}:{number} is not a record written by `diversed decode`; give another --out"
            )
        if record["settings_hash"] != job.settings_hash():
            diff = differing_keys(record.get("settings", {}), job.settings())
            if diff == ["n_examples"] and grows(record["settings"]["n_examples"], job.n_examples):
                record = {**record, "settings": job.settings(), "settings_hash": job.settings_hash()}
                finished[record["id"]] = record
                continue
            if replace_stale:
                path.unlink()
                return {}
            raise DataError(
                f"{path} holds records made with different arguments (differing: {', '.join(diff)});"
                " use another --out or delete the file"
            )
        finished[record["id"]] = record
    if keep_bytes != path.stat().st_size:
        with path.open("r+b") as handle:
            handle.truncate(keep_bytes)
    return finished


def grows(before: int | None, after: int | None) -> bool:
    """Whether a cell of ``before`` examples is a part of one of ``after``: the subset is a prefix of
    one seeded shuffle and each example's sampling seed is its position in it, so a record decoded
    for the smaller cell is the record the larger one would decode (a cell is extended, not redone)."""
    return after is None or (before is not None and before <= after)


def shard_path(out: str | Path, rank: int, world: int) -> Path:
    out = Path(out)
    return out.with_name(f"{out.name}.shard{rank}of{world}")


def merge_shards(job: DecodeJob, out: str | Path, world: int, data_dir=None, allow_hub: bool = True) -> Path:
    """Join the shards of a multi-process decode into ``out``, in the examples' order; drop the shards."""
    examples = job.examples(data_dir, allow_hub)
    records: dict[str, dict[str, Any]] = {}
    for rank in range(world):
        records.update(read_finished(shard_path(out, rank, world), job))
    missing = [e.id for e in examples if e.id not in records]
    if missing:
        raise DataError(f"cannot merge {out}: examples {missing[:5]} are in no shard")
    path = Path(out)
    write_records(path, records, [e.id for e in examples])
    for rank in range(world):
        shard_path(out, rank, world).unlink()
    return path


def run_decode(
    job: DecodeJob,
    out: str | Path,
    options: RunOptions | None = None,
    data_dir: str | Path | None = None,
    allow_hub: bool = True,
    shard: tuple[int, int] = (0, 1),
    latency_examples: int = 0,
    replace_stale: bool = False,
) -> Path:
    """Decode every example of ``job`` not yet in ``out``; return the file written.

    With ``shard=(rank, world)`` this process takes every world-th example, starting at ``rank``,
    and writes them to its own shard file (see :func:`merge_shards`). How it runs (``options``:
    device, batch size, prefix cache, step) changes no output in fp32, only the time, and each
    record says how it ran. ``latency_examples``: the first examples decoded alone, their seconds a
    latency figure.
    """
    check_range("latency_examples", latency_examples, minimum=0)
    options = options or RunOptions()
    rank, world = shard
    path = Path(out) if world == 1 else shard_path(out, rank, world)
    path.parent.mkdir(parents=True, exist_ok=True)
    examples = job.examples(data_dir, allow_hub)
    finished = read_finished(path, job, replace_stale)
    todo = [(i, ex) for i, ex in enumerate(examples) if ex.id not in finished and i % world == rank]
    if not todo:
        return path
    speculative = job.config.method.speculative
    run = open_run(job, [ex for _, ex in todo], options, job.draft if speculative else None, job.head)
    # one line even under --quiet: workflow logs record how long loading took and what it cost
    print(f"{job.dataset} {job.config.method.value}: {_readiness()}", file=sys.stderr)
    if run.prefix:
        shared = f"{len(run.prefix)} shared prompt tokens, prefilled once per model"
        print(f"{job.dataset}: {shared}", file=sys.stderr)
    decoder = run.decoder(job.config)
    prompts = {index: run.prompts[example.id] for index, example in todo}
    settings, digest, code = job.settings(), job.settings_hash(), commit()
    where = device_name(options.device)
    status = head_check(job.head)
    profile = None  # k auto: the digest of the costs that chose every block's k
    if job.config.schedule is Schedule.COST:
        profile = run.stack.cost_profile(job.config.num_assistant_tokens).digest()
    done_stats = [GenerationStats()]
    batch_seconds = 0.0
    name = f"{job.dataset} {job.config.method.value}"
    bar = tqdm(total=len(todo), desc=name, unit="ex", disable=not options.progress)
    lengths = {index: len(ids) for index, ids in prompts.items()}
    batches = plan_batches(todo, options.batch_size, latency_examples, lengths)
    if latency_examples and len(batches[0]) == 1:  # its seconds are a latency figure: pay start-up first
        index, _ = batches[0][0]
        warm_up(decoder, prompts[index], job.config.seed + job.first_example + index)
    with path.open("a", encoding="utf-8") as sink:
        for batch in batches:
            ids = [prompts[index] for index, _ in batch]
            seeds = [job.config.seed + job.first_example + index for index, _ in batch]
            start, cpu_start = time.perf_counter(), time.process_time()
            results = decoder.generate_batch(ids, seeds=seeds)
            seconds = time.perf_counter() - start
            turns = answer_turns(run, decoder, batch, results, seeds, seconds)
            seconds = time.perf_counter() - start
            batch_info = {
                "size": len(batch),
                "id": f"{batch[0][1].id}+{len(batch)}",
                "seconds": seconds,
                # the CPU time the process got in that wall time, and the threads it could use: a
                # batch that shared its cores with another job says so (evaluation.score.cpu_share)
                "cpu_seconds": time.process_time() - cpu_start,
                "threads": torch.get_num_threads(),
            }
            for (index, example), result in zip(batch, results, strict=True):
                completion = run.decode_text(result.token_ids)
                asked = turns.get(index)
                record = {
                    "id": example.id,
                    "dataset": job.dataset,
                    "split": job.split,
                    "method": job.config.method.value,
                    "prompt": example.prompt,
                    "completion": run.task.cut(completion),  # the text scored
                    "raw_completion": completion,  # all the model wrote, past the stop too
                    "prediction": run.task.extract(completion, example.record),
                    "reference": example.reference,
                    "token_ids": result.token_ids,
                    **token_weights(result, run.stack.tokenizer),
                    "finish_reason": result.finish_reason,
                    # every turn's counters together, so acceptance covers the whole conversation
                    "stats": (
                        GenerationStats.total(t["stats"] for t in asked) if asked else result.stats
                    ).to_dict(),
                    **({"category": example.category} if example.category is not None else {}),
                    **({"turns": [{**t, "stats": t["stats"].to_dict()} for t in asked]} if asked else {}),
                    "batch": batch_info,
                    "prefix_cache": options.prefix_cache,
                    "step": options.step,
                    "device": where,
                    "stop": job.stop,
                    "settings": settings,
                    "settings_hash": digest,
                    "commit": code,
                    **({"head_check": status} if status else {}),
                    **({"cost_profile": profile} if profile else {}),
                }
                sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                done_stats.extend([t["stats"] for t in asked] if asked else [result.stats])
            sink.flush()
            os.fsync(sink.fileno())
            batch_seconds += seconds
            total = GenerationStats.total(done_stats)
            postfix = {"tok/s": f"{total.new_tokens / batch_seconds:.2f}", "B": len(batch)}
            if total.acceptance_rate is not None:
                postfix["accept"] = f"{total.acceptance_rate:.1%}"
            bar.set_postfix(postfix)
            bar.update(len(batch))
    bar.close()
    mine = [example.id for i, example in enumerate(examples) if i % world == rank]
    write_in_order(path, job, mine)
    return path


def head_check(head: str | None) -> dict[str, Any] | None:
    """What the workflow's check said of a trained head (its card): whether it is untrained (then it
    is static w = 0.5) and its verdict against the static rule at its own mean w."""
    card = Path(head) / "head.json" if head else None
    if card is None or not card.is_file():
        return None
    found = json.loads(card.read_text())
    return {"untrained": bool(found.get("untrained")), "verdict": found.get("check", {}).get("verdict")}


def warm_up(decoder: Any, prompt: list[int], seed: int) -> None:
    """One short decode before the batch-1 latency examples, not recorded: the first call pays
    one-time costs (CUDA's context and kernel loading, oneDNN's JIT, graph capture) that are no
    property of the method. The decoder's schedule state is restored, so no output changes."""
    schedule = copy.deepcopy(decoder.schedule)
    decoder.generate_batch([prompt], max_new_tokens=8, seeds=[seed])
    decoder.schedule = schedule


def token_weights(result: Any, tokenizer: Any) -> dict[str, Any]:
    """A record's per-token w, TV and entropy with each token's class (:mod:`diversed.evaluation.weights`)."""
    if result.token_stats is None:
        return {}
    classes = [token_class(tokenizer.decode([t])) for t in result.token_ids]
    return {"token_weights": {"stats": result.token_stats, "class": classes}}


def write_in_order(path: Path, job: DecodeJob, ids: list[str]) -> None:
    """Rewrite a finished file with its records in the examples' order (batches run in order of
    prompt length), so a file's content never depends on how it was batched."""
    finished = read_finished(path, job)
    if set(finished) == set(ids):
        write_records(path, finished, ids)


def write_records(path: Path, records: dict[str, dict[str, Any]], ids: list[str]) -> None:
    """``records[id]`` for each of ``ids``, one JSON line each, replacing ``path`` atomically."""
    staging = path.with_name(path.name + ".staging")
    staging.write_text(
        "".join(json.dumps(records[i], ensure_ascii=False) + "\n" for i in ids), encoding="utf-8"
    )
    os.replace(staging, path)


def _readiness() -> str:
    """Seconds since this process started and its peak resident memory so far (Linux), so a job's
    log says how long it took to be ready to decode and what loading cost in memory."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        since_start = f"ready to decode {uptime - start_ticks / os.sysconf('SC_CLK_TCK'):.1f} s after start"
    except (OSError, ValueError, IndexError):
        since_start = "ready to decode"
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return f"{since_start}, peak resident memory {peak_kib / 2**20:.1f} GiB"


def plan_batches(
    todo: list[tuple[int, Example]], batch_size: int, latency_examples: int, lengths: dict[int, int]
) -> list[list[tuple[int, Example]]]:
    """The job's first ``latency_examples`` examples one at a time, then the rest ``batch_size`` at
    a time in order of prompt length (``lengths`` by example index): a left-padded batch prefills
    every row to its longest prompt, and in example order HumanEval's batches of 4 carried 60% more
    prompt tokens than their rows have, MBPP's 73% (10% and 7% sorted). Rows are seeded by example
    index and equal their batch-1 decoding, so the order changes no output, only the time."""
    single = [item for item in todo if item[0] < latency_examples]
    rest = sorted(
        (item for item in todo if item[0] >= latency_examples), key=lambda item: (lengths[item[0]], item[0])
    )
    return [[item] for item in single] + batched(rest, batch_size)
