"""InPlaceKV (the KV store on accelerators) holds what DynamicCache holds and decodes alike in the engine."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from diversed import DecodeConfig, Decoder
from diversed.engine import cache as cache_module
from diversed.engine.kv import FixedKV, InPlaceKV
from diversed.engine.prefix import SharedPrefix


def _chunk(rows: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, width, 4, generator=generator), torch.randn(
        rows, 2, width, 4, generator=generator
    )


@pytest.mark.parametrize("store", [InPlaceKV, FixedKV])
def test_a_store_holds_what_dynamic_cache_holds_through_growth_crops_and_row_selection(store):
    """InPlaceKV returns the columns written; FixedKV its whole capacity (the caller's mask hides the
    rest), compacting rows in place so that its addresses stay: in both, the written columns must be
    DynamicCache's. Capacity 2 must grow repeatedly (FixedKV counts it in ``generation``)."""
    layers = 3
    ours, theirs = store(layers, capacity=2), DynamicCache()
    steps = [
        ("write", 5),
        ("write", 1),
        ("crop", -2),
        ("write", 4),
        ("select", [2, 0]),
        ("write", 3),
        ("crop", -6),
    ]
    rows = 3
    for number, (kind, arg) in enumerate(steps):
        if kind == "write":
            for layer in range(layers):
                keys, values = _chunk(rows, arg, 10 * number + layer)
                got = ours.update(keys, values, layer)
                want = theirs.update(keys, values, layer)
                written = want[0].shape[2]
                assert got[0].shape[2] == (ours.capacity if store is FixedKV else written)
                assert torch.equal(got[0][:, :, :written], want[0])
                assert torch.equal(got[1][:, :, :written], want[1])
        elif kind == "crop":
            ours.crop(arg)
            theirs.crop(arg)
        else:
            before = [k.data_ptr() for k in ours.keys]
            ours.batch_select_indices(torch.tensor(arg))
            theirs.batch_select_indices(torch.tensor(arg))
            if store is FixedKV:
                assert [k.data_ptr() for k in ours.keys] == before
            rows = len(arg)
        assert ours.get_seq_length() == theirs.get_seq_length()
    if store is FixedKV:
        assert ours.generation > 0
    for layer in range(layers):  # what a next forward would attend to
        keys, values = _chunk(rows, 1, 99)
        written = theirs.update(keys, values, layer)[0]
        assert torch.equal(ours.update(keys, values, layer)[0][:, :, : written.shape[2]], written)
    with pytest.raises(ValueError, match="negative"):
        ours.crop(1)


@pytest.mark.parametrize(
    "values",
    [
        {"method": "sd", "temperature": 0.0},
        {"method": "static", "target_weight": 0.5, "temperature": 1.0},
        {"method": "lossy", "lenience": 0.5, "temperature": 1.0},
    ],
)
def test_decoding_through_the_in_place_store_equals_the_cpu_store_batched_and_batch_one(
    pair, tokenizer, values, monkeypatch
):
    target, draft = pair
    prompts = [tokenizer(p).input_ids for p in ["def f(x):", "a", "The quick brown fox jumps"]]
    config = DecodeConfig.from_dict({**values, "max_new_tokens": 24, "num_assistant_tokens": 3})
    seeds = [5, 6, 7]
    reference = [g.token_ids for g in Decoder(target, draft, config).generate_batch(prompts, seeds=seeds)]
    monkeypatch.setattr(
        cache_module, "key_value_store", lambda model, capacity: InPlaceKV(model.config.num_hidden_layers, 2)
    )  # capacity 2: the buffers grow as the batch runs
    batched = [g.token_ids for g in Decoder(target, draft, config).generate_batch(prompts, seeds=seeds)]
    single = [
        Decoder(target, draft, config).generate_batch([p], seeds=[s])[0].token_ids
        for p, s in zip(prompts, seeds, strict=True)
    ]
    assert batched == reference and single == reference
    if values["temperature"] == 0.0:
        auto = Decoder(target, None, DecodeConfig.from_dict({"method": "auto", "max_new_tokens": 24}))
        assert [auto.generate(p).token_ids for p in prompts] == reference


@pytest.mark.parametrize(
    "values",
    [
        {"method": "sd", "temperature": 0.0},
        {"method": "static", "target_weight": 0.5, "temperature": 1.0},
        {"method": "cascade", "cascade_rule": "token", "cascade_alpha": 0.35, "temperature": 1.0},
    ],
)
def test_the_fixed_shape_step_decodes_what_the_eager_step_decodes_batched_and_batch_one(
    pair, tokenizer, values
):
    """The step that CUDA graphs replay, run eagerly on the CPU: attention over the whole capacity
    with unwritten columns masked must change no token, batched or not (fp32)."""
    target, draft = pair
    prompts = [tokenizer(p).input_ids for p in ["def f(x):", "a", "The quick brown fox jumps"]]
    config = DecodeConfig.from_dict({**values, "max_new_tokens": 24, "num_assistant_tokens": 3})
    seeds = [5, 6, 7]
    reference = Decoder(target, draft, config).generate_batch(prompts, seeds=seeds)
    fixed = Decoder(target, draft, config, step="fixed")
    batched = fixed.generate_batch(prompts, seeds=seeds)
    single = [fixed.generate_batch([p], seeds=[s])[0] for p, s in zip(prompts, seeds, strict=True)]
    assert [g.token_ids for g in batched] == [g.token_ids for g in reference]
    assert [g.token_ids for g in single] == [g.token_ids for g in reference]
    assert [g.stats.accepted for g in batched] == [g.stats.accepted for g in reference]
    if values["temperature"] == 0.0:
        auto = Decoder(
            target, None, DecodeConfig.from_dict({"method": "auto", "max_new_tokens": 24}), step="fixed"
        )
        assert [auto.generate(p).token_ids for p in prompts] == [g.token_ids for g in reference]


def test_the_fixed_store_grows_mid_batch_without_changing_a_token(pair, tokenizer, monkeypatch):
    """A capacity too small for the batch: the store doubles between forwards (what makes a graph
    runner capture again) and the tokens stay those of the eager step."""
    target, draft = pair
    prompts = [tokenizer(p).input_ids for p in ["def f(x):", "The quick brown fox jumps"]]
    config = DecodeConfig.from_dict({"method": "sd", "temperature": 1.0, "max_new_tokens": 20})
    reference = [g.token_ids for g in Decoder(target, draft, config).generate_batch(prompts, seeds=[1, 2])]
    grown = []
    original = cache_module.RaggedCache.__init__

    def small(self, model, batch, capacity=256, step="eager"):
        original(self, model, batch, 4, step)  # 4 columns: smaller than any prompt
        grown.append(self.cache)

    monkeypatch.setattr(cache_module.RaggedCache, "__init__", small)
    fixed = [
        g.token_ids
        for g in Decoder(target, draft, config, step="fixed").generate_batch(prompts, seeds=[1, 2])
    ]
    assert fixed == reference
    assert all(store.generation > 1 for store in grown)


def test_an_unknown_step_or_graphs_without_cuda_is_refused_by_name(pair):
    target, draft = pair
    config = DecodeConfig.from_dict({"method": "sd"})
    with pytest.raises(ValueError, match="step must be one of eager, fixed, graphs"):
        Decoder(target, draft, config, step="compiled")
    with pytest.raises(ValueError, match="needs a model on CUDA"):
        Decoder(target, draft, config, step="graphs").generate([1, 2, 3])


def test_the_fixed_shape_step_with_a_shared_prefix_and_a_head_decodes_what_the_eager_step_decodes(
    pair, tokenizer, varied_head
):
    """The prefix's KV is copied into the fixed store like any prefill, and DIVERSED's head reads
    hidden states from the fixed-shape forward: neither may change a token (fp32, sampling)."""
    target, draft = pair
    prefix_text = "Question: 2+2?\nAnswer: 4\n\nQuestion: "
    prompts = [tokenizer(prefix_text + s).input_ids for s in ["7-5?\nAnswer:", "", "a longer one, 12*12?"]]
    config = DecodeConfig.from_dict({"method": "diversed", "temperature": 1.0, "max_new_tokens": 16})

    def tokens(step: str) -> list[list[int]]:
        prefix = SharedPrefix(tokenizer(prefix_text).input_ids)
        decoder = Decoder(target, draft, config, head=varied_head, prefix=prefix, step=step)
        return [g.token_ids for g in decoder.generate_batch(prompts, seeds=[1, 2, 3])]

    assert tokens("fixed") == tokens("eager")


@pytest.mark.parametrize(
    "values",
    [
        {"method": "sd", "temperature": 0.0},
        {"method": "static", "target_weight": 0.5, "temperature": 1.0},
        {"method": "diversed", "temperature": 1.0},
    ],
)
def test_the_graph_runner_replays_what_the_eager_step_decodes(
    pair, tokenizer, varied_head, monkeypatch, values
):
    """The runner's bookkeeping, checked without a GPU: a replay runs the captured forward again with
    every host-side value frozen at capture and only the static tensors changed, as a graph's kernels
    are, and refuses to run once the store's buffers moved (a graph would read freed memory). Rows
    padded to a captured size as they leave (budgets 6 to 30), the columns a replay writes, hidden
    states for the head, graphs dropped when the store grows (capacity 4): every token must equal
    the eager step's, with graphs reused (fewer captures than replays)."""
    from diversed.backends.cuda import graphs

    captures, replays = [], []

    class Replaying(graphs.GraphRunner):
        def __init__(self, model, store):
            super().__init__(model, store, capture=self.rerun)

        def rerun(self, forward):
            captures.append(1)
            generation, outputs = self.store.generation, forward()

            def replay() -> None:
                assert self.store.generation == generation, "a graph replayed after its buffers moved"
                replays.append(1)
                for static, fresh in zip(outputs, forward(), strict=True):
                    if static is not None:
                        static.copy_(fresh)

            return replay, outputs

    target, draft = pair
    prompts = [tokenizer(p).input_ids for p in ["def f(x):", "a", "The quick brown fox jumps", "1 2 3"]]
    config = DecodeConfig.from_dict({**values, "max_new_tokens": 30, "num_assistant_tokens": 3})
    head = varied_head if values["method"] == "diversed" else None
    budgets, seeds = [6, 30, 17, 11], [5, 6, 7, 8]
    reference = Decoder(target, draft, config, head=head).generate_batch(prompts, budgets, seeds)
    monkeypatch.setattr(graphs, "GraphRunner", Replaying)
    original = cache_module.RaggedCache.__init__
    stores = []

    def small(self, model, batch, capacity=256, step="eager"):
        original(self, model, batch, 4, step)
        stores.append(self.cache)

    monkeypatch.setattr(cache_module.RaggedCache, "__init__", small)
    replayed = Decoder(target, draft, config, head=head, step="graphs").generate_batch(
        prompts, budgets, seeds
    )
    assert [g.token_ids for g in replayed] == [g.token_ids for g in reference]
    assert [g.stats.accepted for g in replayed] == [g.stats.accepted for g in reference]
    assert all(store.generation > 0 for store in stores)
    assert 0 < len(captures) < len(replays) / 2
