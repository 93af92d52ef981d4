"""Device-specific speed, kept apart from the algorithm in :mod:`diversed.engine`.

``cpu/``: oneDNN-packed linear layers (``onednn``), their packed weights stored once per machine
(``packed_store``) and fp16 weight storage (``quantize``), applied by :func:`diversed.models.load_model`
on CPU. ``cuda/``: the engine's fixed-shape step replayed from CUDA graphs (``graphs``), which
``Decoder(step="graphs")`` asks for. The engine runs unchanged on any device; a backend only
changes how a model's layers or forwards compute.
"""
