"""Prefix reuse across requests and turns, on mlx_lm's LRUPromptCache (trie + LRU + byte budget).

Entries own their memory. What BatchGenerator hands back (a finished request's `prompt_cache`, an
`extract_cache` snapshot) is a lazy slice of the batch's buffers: stored as is, each entry would
keep a whole batch buffer alive while the LRU counted only the slice, and the byte budget would
bound nothing (measured: 10 GB held for a 538 MB model after 400 requests). So `store` copies
every array into a buffer of its own and evaluates it, on the engine thread, before the LRU counts
it: the budget counts what is really held.

Hybrid-safe by construction: a stored cache is only cut back to a shorter prefix when EVERY layer
is trimmable (mlx_lm's `can_trim_prompt_cache`); SSM state (ArraysCache) and a wrapped sliding
window are reused only as exact or shorter prefixes. That is why snapshots are also stored at
segment boundaries (end of the system prompt, end of the conversation before the reply), so the
next turn of a hybrid model finds an exact shorter prefix.

Rows decoded with a LoRA adapter are filed apart (`space`: the adapter load's own key): their keys
and values are not the base model's, so an adapter row never meets a base row's entry, nor one of
another adapter or of an earlier load under the same name. Those entries stay in memory (the disk
is checked against the base model's fingerprint only); an unloaded adapter's entries are no longer
reachable and leave as the LRU evicts them, counted in the budget until then.

With a folder (`engine/caches/prefix_disk.py`) the cache also lives on disk: what is stored is remembered
by its tokens only (no arrays held twice), and written while the engine is idle or closing, read
back from the in-memory LRU at that time (an entry already evicted is not written). A lookup that
disk can serve better than memory loads the file into the LRU first, then looks up as usual.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from mlx_nb.engine.batch.upstream import nearest
from mlx_nb.engine.scheduling.memory import default_prefix_budget

KINDS = ("exact", "shorter", "trimmed", "disk", "miss")
MAX_LABEL_KEYS = 100_000


def owned(cache: list) -> list:
    """Detach every array of a per-request cache list from the buffers it was sliced from
    (copy + evaluate), in place; returns the list. A KVCache is also cut to its offset."""
    import mlx.core as mx

    arrays: list = []
    for layer in cache:
        _own_layer(layer, arrays)
    mx.eval(arrays)
    return cache


def _own_layer(cache: Any, out: list) -> None:
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    def own(a):
        if a is None or not isinstance(a, mx.array):
            return a
        a = mx.contiguous(a)
        out.append(a)
        return a

    members = getattr(cache, "caches", None)
    if members is not None:  # CacheList
        for member in members:
            _own_layer(member, out)
    elif isinstance(getattr(cache, "cache", None), list):  # ArraysCache: SSM / conv state
        cache.cache = [own(a) for a in cache.cache]
    elif hasattr(cache, "keys") and not callable(cache.keys):  # KV-style caches (a quantized one's are triples)
        if isinstance(cache, (KVCache, QuantizedKVCache)) and cache.keys is not None:
            n = cache.offset
            cache.keys, cache.values = tree_map(lambda a: a[..., :n, :] if a.shape[2] > n else a,
                                                (cache.keys, cache.values))
        cache.keys, cache.values = tree_map(own, (cache.keys, cache.values))
    else:  # anything else that keeps its arrays in `state` (e.g. the vision rope-delta cache)
        cache.state = [own(a) for a in cache.state]


@dataclass
class PrefixStats:
    hits: dict = field(default_factory=lambda: {k: 0 for k in KINDS})
    tokens_saved: int = 0
    stored: int = 0


class PrefixCache:
    """Lookups hand back a private copy; stores take ownership of the cache given."""

    def __init__(self, model_key: str, max_bytes: Optional[int] = None, max_entries: int = 256, disk=None):
        from mlx_lm.models.cache import LRUPromptCache

        self.model_key = model_key
        self.disk = disk  # a DiskPrefixStore, or None: memory only
        # Token lists stored since they were last written to disk, oldest first (tokens only: the
        # arrays are read back from the LRU when written, so nothing is held twice).
        self._unsaved: dict[tuple, None] = {}
        self.max_bytes = default_prefix_budget() if max_bytes is None else int(max_bytes)
        self._lru = LRUPromptCache(max_size=max_entries, max_bytes=self.max_bytes)
        self.stats = PrefixStats()
        # Hashes of the token lists ever stored: only to label a hit "shorter" (a whole entry) or
        # "trimmed" (a longer one cut back) from the public fetch result, without reading the trie.
        self._stored_keys: set[int] = set()

    def _key(self, space: Optional[str]) -> str:
        return self.model_key if space is None else f"{self.model_key}@{space}"

    def lookup(self, tokens: list[int], space: Optional[str] = None) -> tuple[Optional[list], int, str]:
        """(cache, number of leading tokens it holds, hit kind) for the longest usable prefix, among
        the entries filed under `space` (None: the base model's)."""
        cache, cached = self._fetch(tokens, space)
        from_disk = space is None and self.disk is not None and self._load_better(tokens, cached)
        if from_disk:
            cache, cached = self._fetch(tokens)
        if cache is None or cached == 0:
            kind, cache, cached = "miss", None, 0
        elif from_disk:
            kind = "disk"
        elif cached == len(tokens):
            kind = "exact"
        elif hash((space, tuple(tokens[:cached]))) in self._stored_keys:
            kind = "shorter"  # a stored entry, whole
        else:
            kind = "trimmed"  # a longer entry cut back to the common prefix
        self.stats.hits[kind] += 1
        self.stats.tokens_saved += cached
        return cache, cached, kind

    def _fetch(self, tokens: list[int], space: Optional[str] = None) -> tuple[Optional[list], int]:
        cache, rest = nearest(self._lru.fetch_nearest_cache(self._key(space), tokens))
        return cache, (0 if cache is None else len(tokens) - len(rest))

    def _load_better(self, tokens: list[int], cached: int) -> bool:
        """Load the disk entry that gives more of `tokens` than memory does into the LRU, if any."""
        entry, usable = self.disk.best(tokens)
        if entry is None or usable <= cached or usable < self.disk.min_tokens:
            return False
        cache = self.disk.read(entry)
        if cache is None:
            return False
        self._insert(entry.token_list(), cache, "assistant")
        return True

    def _insert(self, tokens: list[int], cache: list, kind: str, space: Optional[str] = None) -> None:
        self._lru.insert_cache(self._key(space), list(tokens), cache, cache_type=kind)
        if len(self._stored_keys) > MAX_LABEL_KEYS:  # bounded: at worst a hit is labelled "trimmed"
            self._stored_keys.clear()
        self._stored_keys.add(hash((space, tuple(tokens))))

    def store(self, tokens: list[int], cache: list, kind: str = "assistant", space: Optional[str] = None) -> None:
        """Keep `cache` (holding `tokens`) for later requests, filed under `space` (None: the base
        model's); engine thread only (it evaluates)."""
        if not tokens or cache is None or self.max_bytes <= 0:
            return
        self._insert(tokens, owned(cache), kind, space)
        self.stats.stored += 1
        if space is None and self.disk is not None and len(tokens) >= self.disk.min_tokens:
            self._unsaved[tuple(tokens)] = None
            while len(self._unsaved) > self._lru.max_size:  # older than anything the LRU can still hold
                del self._unsaved[next(iter(self._unsaved))]

    # -- disk --------------------------------------------------------------------------------
    def spill_one(self) -> bool:
        """Write the oldest stored entry not yet on disk (engine thread; call it while idle).
        Returns whether there was one to look at: more may follow."""
        if self.disk is None or not self._unsaved:
            return False
        tokens = next(iter(self._unsaved))
        del self._unsaved[tokens]
        cache, cached = self._fetch(list(tokens))
        if cache is not None and cached == len(tokens):  # else evicted from memory meanwhile
            self.disk.write(list(tokens), cache)
        return True

    def spill_all(self) -> dict:
        """Write every stored entry not yet on disk; the disk's status after."""
        while self.spill_one():
            pass
        return self.disk.status() if self.disk is not None else {}

    def load_all(self) -> int:
        """Read the disk's entries into memory, least recently used first (the LRU keeps what fits);
        returns how many were read."""
        if self.disk is None:
            return 0
        read = 0
        for entry in sorted(self.disk.entries.values(), key=lambda e: e.path.stat().st_mtime):
            cache = self.disk.read(entry)
            if cache is not None:
                self._insert(entry.token_list(), cache, "assistant")
                read += 1
        return read

    @property
    def nbytes(self) -> int:
        return self._lru.nbytes

    def __len__(self) -> int:
        return len(self._lru)

    def shrink(self, n_bytes: int) -> int:
        """Evict least-recently-used entries until at least `n_bytes` are freed; returns bytes freed."""
        before = self._lru.nbytes
        self._lru.trim_to(n_bytes=before - n_bytes)
        return before - self._lru.nbytes

    def clear(self) -> int:
        """Drop every entry in memory (the disk's stay); returns the bytes they held."""
        self._unsaved.clear()
        return self.shrink(self._lru.nbytes)

    def status(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "entries": len(self._lru),
            "bytes": self._lru.nbytes,
            "budget_bytes": self.max_bytes,
            "hits": dict(self.stats.hits),
            "tokens_saved": self.stats.tokens_saved,
            "stored": self.stats.stored,
            "disk": ({"enabled": True, "unsaved": len(self._unsaved), **self.disk.status()}
                     if self.disk is not None else {"enabled": False}),
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
