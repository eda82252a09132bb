"""The few tuples mlx_lm hands back that we must unpack, checked in one place.

A peer server crashed in chunked prefill when an upstream tuple grew a field and a bare
`a, b = ...` met three values. Each unpack of an mlx_lm return value goes through here: a shape
change fails with one line that names the call and what to do, and tests/engine/
test_engine_upstream_api.py runs every one of them on a real model so an upgrade fails there first.
"""

from __future__ import annotations

from typing import Any


class UpstreamAPIError(RuntimeError):
    """mlx_lm returned something of another shape than the version we test with."""


def _pair(value: Any, what: str) -> tuple:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        got = f"{len(value)} items" if isinstance(value, (tuple, list)) else type(value).__name__
        raise UpstreamAPIError(
            f"mlx_lm's {what} returned {got}, expected 2: install the tested mlx-lm (0.32.2) or adapt "
            "mlx_nb/engine/batch/upstream.py"
        )
    return tuple(value)


def responses(out: Any) -> tuple[list, list]:
    """`BatchGenerator.next()`: (prompt-processing responses, generation responses)."""
    prompt, generation = _pair(out, "BatchGenerator.next")
    return prompt, generation


def extracted(found: dict, uid: int) -> tuple[list, list[int]]:
    """`BatchGenerator.extract_cache(...)[uid]`: (per-layer cache, a COPY of its token list;
    upstream's list is live and keeps growing)."""
    cache, tokens = _pair(found[uid], "BatchGenerator.extract_cache")
    return cache, list(tokens)


def progress(response: Any) -> tuple[int, int]:
    """`PromptProcessingBatch.Response.progress`: (prompt tokens read, prompt tokens in all)."""
    done, total = _pair(response.progress, "PromptProcessingBatch.Response.progress")
    return int(done), int(total)


def nearest(result: Any) -> tuple[Any, list[int]]:
    """`LRUPromptCache.fetch_nearest_cache(...)`: (cache or None, the tokens it does not hold)."""
    cache, rest = _pair(result, "LRUPromptCache.fetch_nearest_cache")
    return cache, list(rest)
