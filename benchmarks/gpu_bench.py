"""GPU check of the engine at paper scale, with random weights (no download needed).

Builds a target and a draft with the shapes of Llama-3.1-8B and Llama-3.2-1B (``--shapes paper``)
or tiny ones (``--shapes tiny``, for CPUs and the test suite), in bf16 on a GPU, and prints:

* the target's step time at 1 and k + 1 tokens per row against the HBM floor (weight bytes over
  the spec bandwidth, ``--bandwidth``; 4.8 TB/s is an H200's);
* tokens/s of our ``sd`` and HF assisted generation at batch 1, and of ours at larger batches.

Random weights make draft and target disagree, so acceptance is low; the comparison is between
systems on the same work, not a speed-up claim. Run it through ``benchmarks/gpu.sh``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from diversed import DecodeConfig, Decoder, bench

SHAPES = {
    "paper": {
        "target": dict(
            hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32
        ),
        "draft": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32),
        "common": dict(
            vocab_size=128256, num_key_value_heads=8, rope_theta=500000.0, tie_word_embeddings=False
        ),
    },
    "tiny": {
        "target": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4),
        "draft": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4),
        "common": dict(vocab_size=512, num_key_value_heads=2, tie_word_embeddings=False),
    },
}


def build(shape: dict, common: dict, device: str, dtype: torch.dtype, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(**shape, **common, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval()


def tokens_per_second(run, prompts: list[list[int]], batch: int, device: str) -> tuple[float, list]:
    bench.sync(torch.device(device))
    start = time.perf_counter()
    outputs = []
    for i in range(0, len(prompts), batch):
        outputs += run(prompts[i : i + batch])
    bench.sync(torch.device(device))
    return sum(len(o) for o in outputs) / (time.perf_counter() - start), outputs


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="paper")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--k", type=int, default=4, help="draft length")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--bandwidth", type=float, default=4.8e12, help="spec memory bandwidth, bytes/s")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    spec = SHAPES[args.shapes]
    target = build(spec["target"], spec["common"], args.device, dtype, seed=0)
    draft = build(spec["draft"], spec["common"], args.device, dtype, seed=1)
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    floor = weight_bytes / args.bandwidth
    context = list(range(3, 3 + 256))
    one = bench.step_seconds(target, context, 1)
    verify = bench.step_seconds(target, context, args.k + 1)
    generator = torch.Generator().manual_seed(0)
    vocab = spec["common"]["vocab_size"]
    prompts = [
        torch.randint(3, vocab, (32 + 8 * (i % 4),), generator=generator).tolist()
        for i in range(args.prompts)
    ]
    config = DecodeConfig.from_dict(
        {"method": "sd", "num_assistant_tokens": args.k, "max_new_tokens": args.new_tokens}
    )
    ours = Decoder(target, draft, config)
    bench.configure_assistant(draft, args.k)

    def hf_assisted(batch):
        ids = torch.tensor(batch, device=args.device)
        out = target.generate(
            ids,
            assistant_model=draft,
            do_sample=False,
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            pad_token_id=0,
        )
        return [row[len(batch[0]) :].tolist() for row in out]

    def run_ours(batch):
        return [g.token_ids for g in ours.generate_batch(batch)]

    tokens_per_second(run_ours, prompts[:2], 1, args.device)  # warm-up
    rates = {"ours_sd@1": tokens_per_second(run_ours, prompts, 1, args.device)[0]}
    rates["hf_assisted@1"] = tokens_per_second(hf_assisted, prompts, 1, args.device)[0]
    for batch in args.batch_sizes:
        rates[f"ours_sd@{batch}"] = tokens_per_second(run_ours, prompts, batch, args.device)[0]
    acceptance = ours.generate(prompts[0]).stats.acceptance_rate
    result = {
        "shapes": args.shapes,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "dtype": args.dtype,
        "target_weight_bytes": weight_bytes,
        "hbm_floor_seconds": floor,
        "target_step_seconds_1": one,
        "target_step_seconds_k_plus_1": verify,
        "step_1_over_floor": one / floor,
        "verify_cost": verify / one,
        "tok_s": rates,
        "ours_vs_hf_assisted_b1": rates["ours_sd@1"] / rates["hf_assisted@1"],
        "acceptance_random_weights": acceptance,
        "k": args.k,
        "new_tokens": args.new_tokens,
        "prompts": args.prompts,
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
