"""Describe cache objects layer by layer, for `cache_layout()`, the inspector widget, cache
pictures and the route.

Only metadata is read (class, shapes, dtypes, byte counts): no lazy array is evaluated, except
a batch cache's per-row offset, which is read only when a layout is asked for.
"""

from __future__ import annotations

from typing import Any, Optional


def is_trimmable(cache: Any) -> bool:
    fn = getattr(cache, "is_trimmable", None)
    return bool(fn()) if callable(fn) else False


def _arrays(cache: Any) -> list:
    if hasattr(cache, "keys") and hasattr(cache, "values") and not callable(getattr(cache, "keys")):
        out = []
        for a in (cache.keys, cache.values):  # a quantized cache's are (words, scales, biases) triples
            out.extend(a if isinstance(a, tuple) else [] if a is None else [a])
        return out
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


def _ints(value: Any) -> Optional[list]:
    """An int, a list, an mx.array or None -> a list of ints (one per batch row), or None."""
    if value is None or isinstance(value, list):
        return value
    if isinstance(value, int):
        return [value]
    try:
        out = value.tolist()
    except AttributeError:
        return None
    return out if isinstance(out, list) else [out]


def rows(cache: Any) -> Optional[dict]:
    """The cache as rows x positions, for drawing: per batch row its left padding and the tokens it
    holds, and how many positions the cache uses (`None` for state that has no positions).

    Read from the cache's own attributes (mlx_lm's KVCache / BatchKVCache / RotatingKVCache /
    BatchRotatingKVCache keep `offset`, `left_padding` and the used width `_idx`; ArraysCache keeps
    `left_padding` while a prompt is read), so it shows what merge, extend and filter really left."""
    arrays = _arrays(cache)
    batch = arrays[0].shape[0] if arrays and arrays[0].ndim else 1
    padding = _ints(getattr(cache, "left_padding", None))
    if not hasattr(cache, "offset"):  # SSM-style state: one fixed block per row (none before the first token)
        if not isinstance(getattr(cache, "cache", None), list):
            return None  # a cache of another shape (e.g. a vision model's rope offsets): not drawn as rows
        n = batch if arrays else len(padding or [1])
        return {"rows": [{"padding": 0, "tokens": None} for _ in range(n)], "positions": None, "state": bool(arrays)}
    offsets = _ints(_offset(cache)) or [0]
    if len(offsets) == 1 and batch > 1:
        offsets = offsets * batch
    padding = padding or [0] * len(offsets)
    window = getattr(cache, "max_size", None)
    used = getattr(cache, "_idx", None)
    if not isinstance(used, int):
        used = max(offsets) if offsets else 0
    stored = arrays[0].shape[2] if arrays and arrays[0].ndim == 4 else 0
    positions = min(used, stored) if stored else used
    if window:
        positions = min(positions, window)
    out = {"rows": [{"padding": max(0, min(p, positions)), "tokens": o} for p, o in zip(padding, offsets)],
           "positions": positions, "state": False}
    if window:
        out["window"], out["rotated"] = window, bool(getattr(cache, "rotated", False)) or max(offsets) > window
    return out


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
    if isinstance(getattr(cache, "bits", None), int):  # a quantized KV cache: its words, scales and biases
        info["bits"], info["group_size"] = cache.bits, cache.group_size
    try:
        info["batch"] = rows(cache)
    except Exception:  # a cache class this drawing does not know: the other fields still stand
        info["batch"] = None
    return info


def describe_layers(caches: list) -> list[dict]:
    return [{"layer": i, **describe(c)} for i, c in enumerate(caches)]
