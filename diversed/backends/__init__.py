"""Device-specific speed, kept apart from the algorithm in :mod:`diversed.engine`.

``cpu/``: oneDNN-packed linear layers (``onednn``), their packed weights stored once per machine
(``packed_store``), fp16 weight storage (``quantize``) and the memory advice they share
(``memory``), applied on CPU by :func:`diversed.loading.models.load_model`. ``cuda/``: the
engine's fixed-shape step replayed from CUDA graphs (``graphs``), registered as the engine's
``graphs`` step when imported. The engine runs unchanged on any device; a backend only changes how
a model's layers or forwards compute. May import: the core modules and :mod:`diversed.engine`
(whose interfaces it implements); never the loaders, jobs or anything above.
"""
