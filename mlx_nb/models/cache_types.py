"""Names of cache objects, layer by layer: what a model's `make_cache()` holds.

Used wherever a model's cache layout is shown or recorded (loaded models, the batch's insert
events, the compatibility matrix), so every place spells a layout the same way.
"""

from __future__ import annotations

from typing import Any


def cache_type_name(cache: Any) -> Any:
    """'KVCache', or for a CacheList the list of its members' names."""
    members = getattr(cache, "caches", None)
    if members is not None:
        return [cache_type_name(c) for c in members]
    return type(cache).__name__


def cache_type_label(cache: Any) -> str:
    """One string per layer: 'KVCache', or 'CacheList(ArraysCache,KVCache)' for a CacheList."""
    members = getattr(cache, "caches", None)
    if members is not None:
        return "CacheList(" + ",".join(cache_type_label(c) for c in members) + ")"
    return type(cache).__name__
