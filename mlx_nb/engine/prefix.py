"""Prefix reuse across requests and turns, on mlx_lm's LRUPromptCache (trie + LRU + byte budget).

Hybrid-safe by construction: a stored cache is only cut back to a shorter prefix when EVERY layer
is trimmable (mlx_lm's `can_trim_prompt_cache`); SSM state (ArraysCache) and a wrapped sliding
window are reused only as exact or shorter prefixes. That is why snapshots are also stored at
segment boundaries (end of the system prompt, end of the conversation before the reply), so the
next turn of a hybrid model finds an exact shorter prefix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from mlx_nb.engine.upstream import nearest

KINDS = ("exact", "shorter", "trimmed", "miss")
MAX_LABEL_KEYS = 100_000


def default_budget_bytes() -> int:
    """A tenth of physical memory, capped at 4 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    return min(total // 10, 4 << 30)


@dataclass
class PrefixStats:
    hits: dict = field(default_factory=lambda: {k: 0 for k in KINDS})
    tokens_saved: int = 0
    stored: int = 0


class PrefixCache:
    """Lookups hand back a private copy; stores take ownership of the cache given."""

    def __init__(self, model_key: str, max_bytes: Optional[int] = None, max_entries: int = 256):
        from mlx_lm.models.cache import LRUPromptCache

        self.model_key = model_key
        self.max_bytes = default_budget_bytes() if max_bytes is None else int(max_bytes)
        self._lru = LRUPromptCache(max_size=max_entries, max_bytes=self.max_bytes)
        self.stats = PrefixStats()
        # Hashes of the token lists ever stored: only to label a hit "shorter" (a whole entry) or
        # "trimmed" (a longer one cut back) from the public fetch result, without reading the trie.
        self._stored_keys: set[int] = set()

    def lookup(self, tokens: list[int]) -> tuple[Optional[list], int, str]:
        """(cache, number of leading tokens it holds, hit kind) for the longest usable prefix."""
        cache, rest = nearest(self._lru.fetch_nearest_cache(self.model_key, tokens))
        cached = 0 if cache is None else len(tokens) - len(rest)
        if cache is None or cached == 0:
            kind, cache, cached = "miss", None, 0
        elif not rest:
            kind = "exact"
        elif hash(tuple(tokens[:cached])) in self._stored_keys:
            kind = "shorter"  # a stored entry, whole
        else:
            kind = "trimmed"  # a longer entry cut back to the common prefix
        self.stats.hits[kind] += 1
        self.stats.tokens_saved += cached
        return cache, cached, kind

    def store(self, tokens: list[int], cache: list, kind: str = "assistant") -> None:
        if not tokens or cache is None:
            return
        self._lru.insert_cache(self.model_key, list(tokens), cache, cache_type=kind)
        if len(self._stored_keys) > MAX_LABEL_KEYS:  # bounded: at worst a hit is labelled "trimmed"
            self._stored_keys.clear()
        self._stored_keys.add(hash(tuple(tokens)))
        self.stats.stored += 1

    def status(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "entries": len(self._lru),
            "bytes": self._lru.nbytes,
            "budget_bytes": self.max_bytes,
            "hits": dict(self.stats.hits),
            "tokens_saved": self.stats.tokens_saved,
            "stored": self.stats.stored,
        }


def segment_boundaries(render, messages: list[dict], prompt: list[int]) -> list[int]:
    """Token positions where the system prompt and the conversation-before-the-reply end.

    `render(messages, add_generation_prompt)` returns token ids; only boundaries that are true
    prefixes of `prompt` are kept (a template that is not prefix-stable simply yields none).
    """
    candidates = []
    if messages and messages[0]["role"] == "system" and len(messages) > 1:
        candidates.append(messages[:1])
    candidates.append(messages)
    out = []
    for prefix in candidates:
        try:
            ids = render(prefix, False)
        except Exception:  # a template that rejects a partial conversation: no boundary there
            continue
        n = len(ids)
        if 0 < n < len(prompt) - 1 and prompt[:n] == ids and n not in out:
            out.append(n)
    return sorted(out)
