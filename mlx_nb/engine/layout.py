"""Describe cache objects layer by layer, for `cache_layout()`, the inspector widget and the route.

Only metadata is read (class, shapes, dtypes, byte counts): no lazy array is evaluated, except
a batch cache's per-row offset, which is read only when a layout is asked for.
"""

from __future__ import annotations

from typing import Any

from mlx_nb.models.cache_types import cache_type_name  # noqa: F401  (the scheduler names insert caches with it)


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


def is_trimmable(cache: Any) -> bool:
    fn = getattr(cache, "is_trimmable", None)
    return bool(fn()) if callable(fn) else False


def _arrays(cache: Any) -> list:
    if hasattr(cache, "keys") and hasattr(cache, "values") and not callable(getattr(cache, "keys")):
        return [a for a in (cache.keys, cache.values) if a is not None]
    inner = getattr(cache, "cache", None)
    if isinstance(inner, list):
        return [a for a in inner if a is not None]
    try:  # any other cache (e.g. the vision rope-delta cache): whatever arrays its state holds
        state = cache.state
    except Exception:
        return []
    return [a for a in (state if isinstance(state, (list, tuple)) else [state]) if hasattr(a, "nbytes")]


def _offset(cache: Any) -> Any:
    off = getattr(cache, "offset", None)
    if off is None:
        off = getattr(cache, "_offset", None)
    if off is None:
        return None
    if isinstance(off, int):
        return off
    try:
        value = off.tolist()
    except AttributeError:
        return None
    return value


def describe(cache: Any) -> dict:
    members = getattr(cache, "caches", None)
    if members is not None:
        parts = [describe(c) for c in members]
        return {
            "type": "CacheList",
            "members": parts,
            "nbytes": sum(p["nbytes"] for p in parts),
            "trimmable": is_trimmable(cache),
        }
    arrays = _arrays(cache)
    info = {
        "type": type(cache).__name__,
        "offset": _offset(cache),
        "shapes": [list(a.shape) for a in arrays],
        "dtype": str(arrays[0].dtype).replace("mlx.core.", "") if arrays else None,
        "nbytes": sum(a.nbytes for a in arrays),
        "trimmable": is_trimmable(cache),
    }
    if hasattr(cache, "max_size"):
        info["window"] = cache.max_size
    return info


def describe_layers(caches: list) -> list[dict]:
    return [{"layer": i, **describe(c)} for i, c in enumerate(caches)]


def human_bytes(n) -> str:
    """1536 -> '1.5 KiB': how the magics and widgets print cache sizes."""
    n = n or 0
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"
