"""CUDA-only speed: the fixed-shape step captured once as a CUDA graph and replayed (:mod:`.graphs`).

Importing this package registers that runner as the engine's ``graphs`` step
(:data:`diversed.engine.cache.RUNNERS`); ``diversed.Decoder`` and the loaders import it.
"""

from diversed.backends.cuda import graphs
from diversed.engine.cache import RUNNERS

RUNNERS["graphs"] = lambda model, store: graphs.GraphRunner(model, store)  # looked up per call
