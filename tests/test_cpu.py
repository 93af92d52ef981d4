"""oneDNN pre-packed linears: same logits as ``F.linear``, dense weights released, nothing corrupted."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from diversed.backends.cpu import onednn as cpu
from diversed.backends.cpu import quantize
from diversed.backends.cpu.onednn import _file_mappings, available, use_onednn_linear
from diversed.backends.cpu.quantize import use_fp16_weights
from diversed.loading.tiny import tiny_model, write_tiny_pair

pytestmark = pytest.mark.skipif(not available(), reason="this torch has no oneDNN linear kernels")
IDS = torch.tensor([[5, 17, 3, 42, 8, 23]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def test_packed_model_gives_the_same_logits_and_drops_dense_weights():
    model = tiny_model(vocab_size=64, hidden=64, layers=2)
    reference = logits(model)
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert use_onednn_linear(model) == linears
    torch.testing.assert_close(logits(model), reference, rtol=1e-4, atol=1e-5)
    down = model.model.layers[0].mlp.down_proj
    assert down.weight.device.type == "meta" and down.packed_weight is not None


@pytest.mark.parametrize("packs_bf16", [True, False])
def test_bf16_linears_are_packed_only_where_onednn_can(monkeypatch, packs_bf16):
    """On AVX2-only CPUs oneDNN refuses to pack bf16 ("bf16 path needs ... avx512bw"): such
    linears stay on F.linear instead of raising, and the model computes the same either way."""
    if packs_bf16 and not cpu.onednn_bf16():
        pytest.skip("oneDNN cannot pack bf16 on this CPU")
    monkeypatch.setattr(cpu, "onednn_bf16", lambda: packs_bf16)
    model = tiny_model(vocab_size=64, hidden=64, layers=2).to(torch.bfloat16)
    reference = logits(model)
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert use_onednn_linear(model) == (linears if packs_bf16 else 0)
    torch.testing.assert_close(logits(model), reference, rtol=2e-2, atol=2e-2)


def test_packing_one_model_leaves_a_model_that_shares_its_memory_intact():
    """Anonymous memory is never dropped: a model reading the same storage still computes right."""
    target = tiny_model(vocab_size=64, hidden=64, layers=2)
    twin = tiny_model(vocab_size=64, hidden=64, layers=2)
    for mine, theirs in zip(target.parameters(), twin.parameters(), strict=True):
        theirs.data = mine.data  # same storage, as a draft cut from its target can have
    reference = logits(target)
    use_onednn_linear(twin)
    torch.testing.assert_close(logits(target), reference)


def mapping_rss_kib(address: int) -> int:
    """Resident KiB of the mapping of this process that holds ``address`` (``/proc/self/smaps``)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise LookupError(f"no mapping holds {address:#x}")


def test_memory_mapped_weights_leave_the_resident_set_and_stay_correct(tmp_path):
    """A model loaded from safetensors reads its weights from a file mapping; once packed, those
    pages are dropped from the process, and another model mapping the same file still reads them."""
    path, _ = write_tiny_pair(tmp_path, hidden=512, target_layers=2)
    first = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    second = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    reference = logits(second)
    start = first.model.layers[0].mlp.down_proj.weight.data_ptr()
    assert any(lo <= start < hi for lo, hi in _file_mappings()), "from_pretrained no longer memory-maps"
    logits(first)  # every weight page is now resident
    resident = mapping_rss_kib(start)
    use_onednn_linear(first)
    assert mapping_rss_kib(start) < resident / 2  # the linears are most of the file
    torch.testing.assert_close(logits(first), reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits(second), reference)


class Siblings(torch.nn.Module):
    """Three projections reading one input, as in an attention block (Qwen2's carry a bias)."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(32, 16)
        self.k_proj = torch.nn.Linear(32, 8)
        self.v_proj = torch.nn.Linear(32, 8)


ROUTES = {  # how each packing route rounds a weight: oneDNN keeps fp32, fbgemm stores fp16
    "onednn": (use_onednn_linear, lambda w: w),
    "fp16": (use_fp16_weights, lambda w: w.half().float()),
}


@pytest.mark.parametrize("route", ROUTES)
def test_sibling_linears_share_one_product_and_stay_exact_called_alone_or_after_in_place_changes(
    route, monkeypatch
):
    """Every route stacks siblings; three blocks share a packing thread's stacking buffer, so a
    packed weight that kept pointing into it would hold the last block's weights."""
    if route == "fp16" and not quantize.available():
        pytest.skip("this torch has no fbgemm fp16 kernels")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # one packing thread, so one buffer for all
    torch.manual_seed(0)
    use, rounded = ROUTES[route]
    blocks = torch.nn.ModuleList(Siblings() for _ in range(3))
    dense = {
        (i, name): (rounded(m.weight.detach().clone()), m.bias.detach().clone())
        for i, block in enumerate(blocks)
        for name, m in block.named_children()
    }

    def expected(i: int, name: str, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, *dense[i, name])

    assert use(blocks) == 9
    block = blocks[0]
    assert hasattr(block.fused_q_proj_k_proj_v_proj, "packed_weight" if route == "onednn" else "fp16_weight")
    assert all(m.weight.device.type == "meta" for m in (block.q_proj, block.k_proj, block.v_proj))
    first, second = torch.randn(2, 32), torch.randn(3, 32)
    with torch.no_grad():
        for i, other in enumerate(blocks):
            torch.testing.assert_close(other.k_proj(first), expected(i, "k_proj", first))
        torch.testing.assert_close(block.q_proj(first), expected(0, "q_proj", first))
        torch.testing.assert_close(block.k_proj(second), expected(0, "k_proj", second))  # another input
        torch.testing.assert_close(block.v_proj(second), expected(0, "v_proj", second))
        second.mul_(-2)  # same tensor object, new values: the product must be recomputed
        torch.testing.assert_close(block.v_proj(second), expected(0, "v_proj", second))
        torch.testing.assert_close(block.q_proj(second), expected(0, "q_proj", second))
