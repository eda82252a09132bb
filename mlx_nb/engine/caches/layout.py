"""What the engine asks of a layer cache: can it join a batch, is it always trimmable.
(Describing caches for pictures and routes is models/cache_layout.py.)"""

from __future__ import annotations

from typing import Any


def is_batchable(cache: Any) -> bool:
    """Whether BatchGenerator can merge this layer cache with others'."""
    members = getattr(cache, "caches", None)
    if members is not None:
        return all(is_batchable(c) for c in members)
    return callable(getattr(cache, "merge", None)) and getattr(cache, "keep", 0) == 0


def always_trimmable(cache: Any) -> bool:
    """Trimmable whatever it holds: plain KV caches. A sliding window stops being trimmable once
    it wraps, SSM state never is."""
    from mlx_lm.models.cache import KVCache

    members = getattr(cache, "caches", None)
    if members is not None:
        return all(always_trimmable(c) for c in members)
    return isinstance(cache, KVCache)
