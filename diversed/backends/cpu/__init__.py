"""CPU inference speed: packed oneDNN linears (``onednn``), their on-disk store (``packed_store``),
fp16 weights (``quantize``) and the memory advice they share (``memory``). May import the core
modules only."""
