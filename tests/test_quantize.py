"""fp16 weights (``--quantize fp16``): the fp16-rounded model up to summation order, a model that
stays continuous (the property int8 activations broke), greedy ``sd`` still the target's decoding."""

from __future__ import annotations

import copy
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from diversed import DecodeConfig, Decoder
from diversed.backends.cpu import quantize
from diversed.backends.cpu.quantize import choose_quantize, use_fp16_weights
from diversed.cli import main
from diversed.jobs.bench import weight_bytes
from diversed.loading.tiny import tiny_model, tiny_pair

pytestmark = pytest.mark.skipif(not quantize.available(), reason="this torch has no fbgemm fp16 kernels")
IDS = torch.tensor([[5, 17, 3, 42, 8, 23, 61, 9]])


def logits(model: nn.Module, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids).logits


def test_fp16_weights_compute_the_fp16_rounded_model_and_drop_dense_weights():
    model = tiny_model(vocab_size=64, hidden=64, layers=2)
    rounded = copy.deepcopy(model)
    for module in rounded.modules():
        if type(module) is nn.Linear:
            module.weight.data = module.weight.data.half().float()
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert use_fp16_weights(model) == linears
    torch.testing.assert_close(logits(model), logits(rounded), rtol=1e-4, atol=1e-4)
    assert model.model.layers[0].mlp.down_proj.weight.device.type == "meta"


def seven_bit_activations(model: nn.Module) -> None:
    """The rejected scheme, simulated: each linear's input rounded to 7 bits with one scale per row
    (what fbgemm's int8 path with per-row activation scales computes, up to its integer sums)."""

    def forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 63
        return F.linear(torch.round(x / scale) * scale, self.weight, self.bias)

    for module in model.modules():
        if type(module) is nn.Linear:
            module.forward = types.MethodType(forward, module)


def sensitivity(model: nn.Module, relative: float = 1e-5) -> float:
    """Largest logit change when the input embeddings move by ``relative`` of their size, over 8
    random perturbations. The tiny fp32 model moves its logits by ~20x ``relative`` (2e-4); with
    7-bit activations some roundings flip and the logits jump by ~0.3."""
    with torch.inference_mode():
        embeds = model.get_input_embeddings()(IDS)
        base = model(inputs_embeds=embeds).logits
        worst = 0.0
        for seed in range(8):
            noise = torch.randn(embeds.shape, generator=torch.Generator().manual_seed(seed))
            moved = model(inputs_embeds=embeds + noise * relative * embeds.abs().mean()).logits
            worst = max(worst, (moved - base).abs().max().item())
    return worst


def test_fp16_weights_keep_the_model_continuous_where_7_bit_activations_do_not():
    """A k-token verification and the 1-token steps differ by summation order (about 1e-7 relative);
    a model must not amplify that, or ``sd`` would verify against a different target than ``auto``
    (on the 1.5B, 7-bit activations turned a 1e-7 perturbation into logit changes of 3.8)."""
    fp16, seven_bit = tiny_model(hidden=64, layers=4), tiny_model(hidden=64, layers=4)
    use_fp16_weights(fp16)
    seven_bit_activations(seven_bit)
    assert sensitivity(fp16) < 1e-3
    assert sensitivity(seven_bit) > 1e-2


def test_greedy_sd_equals_auto_with_fp16_weights(tokenizer):
    target, draft = tiny_pair(vocab_size=len(tokenizer), seed=0)
    use_fp16_weights(target)
    use_fp16_weights(draft)
    prompts = [
        tokenizer(p).input_ids for p in ("def f(x):\n    return", "The quick brown fox", "import os\n")
    ]

    def run(method: str, batch: int) -> list[list[int]]:
        config = DecodeConfig.from_dict({"method": method, "num_assistant_tokens": 4, "max_new_tokens": 24})
        decoder = Decoder(target, draft if method != "auto" else None, config)
        out = []
        for first in range(0, len(prompts), batch):
            out += [g.token_ids for g in decoder.generate_batch(prompts[first : first + batch])]
        return out

    reference = run("auto", 1)
    assert run("sd", 1) == reference
    assert run("sd", 3) == reference


@pytest.mark.parametrize(
    ("name", "dtype", "device", "fbgemm", "expected"),
    [
        ("auto", "float32", "cpu", True, "fp16"),
        ("auto", "float32", "cpu", False, "none"),
        ("auto", "bfloat16", "cpu", True, "none"),
        ("auto", "float32", "cuda", True, "none"),
        ("fp16", "bfloat16", "cpu", True, "fp16"),
        ("none", "float32", "cpu", True, "none"),
    ],
)
def test_quantize_auto_stores_fp16_only_where_fp32_linears_would_run_on_a_cpu(
    monkeypatch, name, dtype, device, fbgemm, expected
):
    monkeypatch.setattr(quantize, "available", lambda: fbgemm)
    chosen, why = choose_quantize(name, dtype, device)
    assert chosen == expected and why


def test_weight_bytes_counts_what_the_kernels_read():
    model = tiny_model(vocab_size=64, hidden=64, layers=2)
    linear = sum(m.weight.numel() for m in model.modules() if type(m) is nn.Linear)
    other = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)  # embeddings: a gather
    assert weight_bytes(model) == 4 * (linear + other)
    use_fp16_weights(model)
    assert weight_bytes(model) == 2 * linear + 4 * other


def test_cli_names_a_quantize_that_cannot_run(capsys, monkeypatch):
    from test_devices import fake_cuda

    fake_cuda(monkeypatch, True)  # the device resolves; the fp16 CPU kernels are what cannot run there
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "generate",
                "--target",
                "x",
                "--prompt",
                "a",
                "--method",
                "auto",
                "--quantize",
                "fp16",
                "--device",
                "cuda",
            ]
        )
    assert exit_info.value.code == 2
    assert "--quantize fp16 runs on CPU only (fbgemm), not on cuda" in capsys.readouterr().err
