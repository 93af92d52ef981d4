"""The fixed-shape step replayed from CUDA graphs: one capture per shape, then one launch per forward.

On a GPU a small model's forward is bound by kernel launches and Python, not by the GPU (the 8B
target's one-token step took 19.9 ms eager against a 3.35 ms HBM floor, ``../shared/reference/gpu.md``).
gpt-fast, SGLang and vLLM reach the floor by capturing the decode step once as a CUDA graph and
replaying it. Here a :class:`GraphRunner` does that for one model's forwards over a
:class:`~diversed.engine.kv.FixedKV`: the tensors a forward reads (token ids, the 4D mask over the
store's capacity, position ids, the columns it writes) live in static buffers that each call fills
before ``replay()``; the outputs are copied out, since the next replay overwrites them.

Shapes: one graph per (rows padded to a power of two, width, capacity, hidden states?, logits
kept), captured the first time it is met, so a batch whose rows leave meets a handful of row counts
and a block at most three widths (the draft's two-column first step, its one-column steps, the
verify step). Padded rows write keys and values only into rows of the store that no live row uses
(:meth:`FixedKV.batch_select_indices` keeps the live rows at the front). When the store grows
(``FixedKV.generation``), its buffers moved and every graph is dropped and captured again.

Capture runs the forward twice on a side stream (lazy initialisations must not be captured), then
records it; those runs write the same columns the replay writes, with the same values, so nothing
is lost or doubled. Everything the forward computes on the host (the store's length, shapes) is
frozen at capture, as a graph's kernels are; only the static tensors change between replays. How a
forward is captured is :func:`capture_cuda_graph`'s job; a runner takes another ``capture`` so that
a CPU test can replay by running the frozen forward again, which checks all the bookkeeping here
(padding, static inputs, the columns written, outputs, dropping graphs when the store moves).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch

from diversed.engine.compat import forward_with_cache

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from diversed.engine.kv import FixedKV

Outputs = tuple[torch.Tensor, "torch.Tensor | None"]
Capture = Callable[[Callable[[], Outputs]], tuple[Callable[[], None], Outputs]]
"""Captures a forward: returns what replays it and the outputs each replay overwrites."""


def capture_cuda_graph(
    forward: Callable[[], Outputs], pool: tuple[int, int]
) -> tuple[Callable[[], None], Outputs]:
    """Warm ``forward`` up twice on a side stream, then record it as one CUDA graph in ``pool``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = forward()
    return graph.replay, outputs


@dataclass
class _Graph:
    """One captured shape: its static inputs, its graph and its static outputs."""

    ids: torch.Tensor  # [rows, width]
    mask: torch.Tensor  # [rows, 1, width, capacity]
    positions: torch.Tensor  # [rows, width]
    columns: torch.Tensor  # [width]
    replay: Callable[[], None] | None = None
    outputs: Outputs = field(default_factory=tuple)


class GraphRunner:
    """Runs one model's forwards over a :class:`FixedKV` as CUDA-graph replays (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, store: FixedKV, capture: Capture | None = None) -> None:
        """``capture``: how a forward is recorded (default: a CUDA graph; the model must be on CUDA)."""
        if capture is None:
            if model.device.type != "cuda" or not torch.cuda.is_available():
                where = model.device
                raise ValueError(f"step 'graphs' replays CUDA graphs: it needs a model on CUDA, not {where}")
            capture = partial(capture_cuda_graph, pool=torch.cuda.graph_pool_handle())  # one shared pool
        self.model, self.store, self.capture = model, store, capture
        self.graphs: dict[tuple[int, int, int, bool, int], _Graph] = {}
        self.generation = store.generation

    def __call__(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        hidden: bool,
        logits_to_keep: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The forward of ``ids`` [rows, width] at the store's pointer: logits and, if asked, the last
        layer's hidden states, as an eager forward would return them."""
        store = self.store
        if store.generation != self.generation:  # the buffers moved: the graphs read freed memory
            self.graphs.clear()
            self.generation = store.generation
        rows, width = ids.shape
        padded = min(1 << (rows - 1).bit_length(), store.keys[0].shape[0])
        key = (padded, width, mask.shape[-1], hidden, logits_to_keep)
        graph = self.graphs.get(key)
        if graph is None:
            graph = _Graph(
                ids=ids.new_zeros((padded, width)),
                mask=mask.new_zeros((padded, *mask.shape[1:])),
                positions=positions.new_zeros((padded, width)),
                columns=torch.zeros(width, dtype=torch.long, device=ids.device),
            )
        past = store.length
        graph.ids[:rows].copy_(ids)
        graph.mask[:rows].copy_(mask)
        graph.positions[:rows].copy_(positions)
        graph.columns.copy_(torch.arange(past, past + width, device=ids.device))
        if graph.replay is None:
            self._capture(graph, hidden, logits_to_keep)
            self.graphs[key] = graph
        graph.replay()
        store.length = past + width
        logits, states = graph.outputs
        return logits[:rows].clone(), None if states is None else states[:rows].clone()

    def _capture(self, graph: _Graph, hidden: bool, logits_to_keep: int) -> None:
        store, past = self.store, self.store.length

        def forward() -> Outputs:
            store.length, store.columns = past, graph.columns  # writes go where the replay says
            try:
                out = forward_with_cache(
                    self.model,
                    store,
                    input_ids=graph.ids,
                    attention_mask=graph.mask,
                    position_ids=graph.positions,
                    output_hidden_states=hidden,
                    logits_to_keep=logits_to_keep,
                )
            finally:
                store.columns = None
            return out.logits, out.hidden_states[-1] if hidden else None

        graph.replay, graph.outputs = self.capture(forward)
