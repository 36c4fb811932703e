"""Caches that keep exactly M slots after every chunk (``buffer=0``), the semantics most tests pin; the API's
default buffers :data:`~icml24.lococo.cache.DEFAULT_BUFFER` extra tokens between compressions."""

from typing import Any

from icml24.lococo import LoCoCoCache


def exact_cache(model: Any, **kwargs: Any) -> LoCoCoCache:
    """``LoCoCoCache.from_model(model, **kwargs)`` with ``buffer=0`` unless given."""
    kwargs.setdefault("buffer", 0)
    return LoCoCoCache.from_model(model, **kwargs)
