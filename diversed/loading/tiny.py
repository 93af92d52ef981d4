"""Tiny random-weight target/draft pairs built in code, for tests, benchmarks and the CI workflow.

No hub, no download: a character-level tokenizer and two small Llama models. The draft is the
target cut to its first layer(s). The decoder layers' output projections are scaled down so each
layer only nudges the residual stream: the shallow draft then agrees with the target on about
two tokens in three (greedy), like a real draft, rather than being unrelated to it.
"""

from __future__ import annotations

import copy
import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
CHARACTERS = list(string.printable[:95]) + ["\n"]  # digits, letters, punctuation, space, newline
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: 4 special tokens plus 96 printable characters."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + list(dict.fromkeys(CHARACTERS)))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_model(
    vocab_size: int = 100, hidden: int = 64, layers: int = 2, seed: int = 0, layer_scale: float = 0.01
) -> LlamaForCausalLM:
    """A random Llama whose next-token distributions are peaked (max p about 0.5), like an LM's."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(2.5)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(layer_scale)
            layer.mlp.down_proj.weight.mul_(layer_scale)
    return model


def tiny_pair(
    vocab_size: int = 100,
    hidden: int = 64,
    target_layers: int = 4,
    draft_layers: int = 1,
    seed: int = 0,
    layer_scale: float = 0.01,
) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """A target and a shallower draft cut from it (same vocabulary)."""
    target = tiny_model(vocab_size, hidden, target_layers, seed, layer_scale)
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:draft_layers]
    draft.config.num_hidden_layers = draft_layers
    if hasattr(draft.config, "layer_types") and draft.config.layer_types:
        draft.config.layer_types = draft.config.layer_types[:draft_layers]
    return target, draft.eval()


def write_tiny_pair(out_dir: str | Path, seed: int = 0, **kwargs: int | float) -> tuple[Path, Path]:
    """Save a tiny pair with its tokenizer as two ``from_pretrained`` folders; return their paths."""
    out = Path(out_dir)
    tokenizer = tiny_tokenizer()
    target, draft = tiny_pair(vocab_size=len(tokenizer), seed=seed, **kwargs)
    paths = out / "target", out / "draft"
    for model, path in zip((target, draft), paths, strict=True):
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return paths
