"""CUDA-only speed: the fixed-shape step captured once as a CUDA graph and replayed (:mod:`.graphs`)."""
