"""Device-specific speed, kept apart from the algorithm in :mod:`diversed.engine`.

``cpu/``: oneDNN-packed linear layers (``onednn``), their packed weights stored once per machine
(``packed_store``) and fp16 weight storage (``quantize``), applied by :func:`diversed.models.load_model`
on CPU. The engine runs unchanged on any device; a backend only swaps how a model's layers compute.
"""
