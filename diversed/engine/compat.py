"""The one place the engine meets transformers' cache API, which moved within the 5.x range we allow.

transformers 5.24 and later name a forward's KV cache ``cache`` (``past_key_values`` is a deprecated
alias until 5.40); earlier 5.x releases know only ``past_key_values`` and silently drop an unknown
``cache=`` into ``**kwargs``, so the model builds a cache of its own and ours stays empty. Asking
the forward's signature which name it takes works on both sides.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedModel


@functools.cache
def _cache_keyword(forward_type: type) -> str:
    parameters = inspect.signature(forward_type.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """An empty dynamic KV cache for ``model``."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def forward_with_cache(model: PreTrainedModel, cache: DynamicCache, **kwargs: Any) -> Any:
    """``model(**kwargs)`` appending to ``cache``, whatever this transformers calls the argument."""
    return model(**kwargs, use_cache=True, **{_cache_keyword(type(model)): cache})
