"""Packed weights kept on disk: a later load maps them instead of packing, and computes the same."""

from __future__ import annotations

import os

import pytest
import torch

from diversed.backends.cpu import onednn as cpu
from diversed.backends.cpu import packed_store
from diversed.backends.cpu.packed_store import PackedStore
from diversed.loading.models import load_model
from diversed.loading.tiny import write_tiny_pair

pytestmark = pytest.mark.skipif(
    not (cpu.available() and packed_store.supported()), reason="this torch cannot read packed weights"
)
IDS = torch.tensor([[5, 17, 3, 42, 8, 23]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def packed_modules(model) -> dict[str, torch.nn.Module]:
    return {name: m for name, m in model.named_modules() if hasattr(m, "packed_weight")}


def mapped_from(path: str) -> list[tuple[int, int]]:
    """Address ranges at which this process maps the file ``path``."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == path:
                ranges.append(tuple(int(x, 16) for x in fields[0].split("-")))
    return ranges


@pytest.fixture
def folder(tmp_path):
    target, _ = write_tiny_pair(tmp_path, hidden=64, target_layers=2)
    return target


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_second_load_maps_the_stored_packing_and_computes_exactly_the_same(folder, dtype):
    if dtype == "bfloat16" and not cpu.onednn_bf16():
        pytest.skip("oneDNN cannot pack bf16 on this CPU")
    first = load_model(str(folder), dtype)
    store = PackedStore.for_model(str(folder), getattr(torch, dtype))
    assert (store.dir / "index.json").exists(), "the first load did not store its packing"
    second = load_model(str(folder), dtype)
    torch.testing.assert_close(logits(second), logits(first), rtol=0, atol=0)
    stored = mapped_from(str(store.dir / "weights.bin"))
    assert stored, "the second load does not map the store"
    modules = packed_modules(second)
    assert any("fused_q_proj_k_proj_v_proj" in name for name in modules)
    for name, module in modules.items():  # every linear's bytes are the file's, none packed anew
        address = torch.ops.mkldnn.data_ptr(module.packed_weight)
        assert any(lo <= address < hi for lo, hi in stored), f"{name} was packed again"
        assert module.packed_weight.dtype == getattr(torch, dtype)


def test_a_changed_model_folder_gets_its_own_store(folder):
    before = PackedStore.for_model(str(folder), torch.float32).dir
    config = folder / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 1))
    assert PackedStore.for_model(str(folder), torch.float32).dir != before
    assert PackedStore.for_model(str(folder), torch.bfloat16).dir != before


@pytest.mark.parametrize("damage", ["truncated", "garbled index", "foreign descriptor"])
def test_a_damaged_store_is_packed_again(folder, damage):
    reference = logits(load_model(str(folder), "float32"))
    store = PackedStore.for_model(str(folder), torch.float32)
    index = store.dir / "index.json"
    if damage == "truncated":
        os.truncate(store.dir / "weights.bin", 100)
    elif damage == "garbled index":
        index.write_text("[{]")
    else:
        index.write_text(index.read_text().replace('"descriptor": [', '"descriptor": [7, '))
    assert store.load() is None
    model = load_model(str(folder), "float32")
    torch.testing.assert_close(logits(model), reference, rtol=0, atol=0)
    assert not mapped_from(str(store.dir / "weights.bin"))


def test_no_store_for_hub_ids_or_when_turned_off(folder, monkeypatch):
    assert PackedStore.for_model("Qwen/Qwen2.5-Coder-1.5B", torch.float32) is None
    monkeypatch.setenv("DIVERSED_PACKED_CACHE", "off")
    assert PackedStore.for_model(str(folder), torch.float32) is None


def test_a_store_that_cannot_be_written_only_warns(folder, tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("DIVERSED_PACKED_CACHE", str(blocked))
    with pytest.warns(UserWarning, match="could not store packed weights"):
        model = load_model(str(folder), "float32")
    monkeypatch.setenv("DIVERSED_PACKED_CACHE", "off")
    torch.testing.assert_close(logits(model), logits(load_model(str(folder), "float32")), rtol=0, atol=0)
