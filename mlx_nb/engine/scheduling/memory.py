"""MemoryPolicy: what an engine may hold, and when MLX's buffer cache is given back.

A serving process holds four things: the weights and the live batch (its caches and a step's
temporaries) are the work; the prefix cache and MLX's buffer cache (freed buffers MLX keeps for
reuse) are history. History is bounded here so resident memory follows the work:

- the buffer cache is capped (`buffer_cache_bytes`, process-wide: MLX has one allocator) and
  emptied whenever the engine goes idle;
- the prefix cache gets a byte budget, and with a `memory_limit` it is also evicted whenever
  active memory passes that limit (the batch, which is the work, wins);
- `memory_limit` is also MLX's own limit (`mx.set_memory_limit`).

Runs on the engine thread only.
"""

from __future__ import annotations

import os
from typing import Optional

DEFAULT_BUFFER_CACHE_BYTES = 512 << 20  # ample for a step's temporaries at batch 32 on the default model


def physical_memory() -> int:
    """The machine's memory in bytes (8 GiB where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def default_prefix_budget() -> int:
    """A tenth of physical memory, capped at 4 GiB."""
    return min(physical_memory() // 10, 4 << 30)


def rss_bytes() -> Optional[int]:
    """This process's resident set size (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def weights_bytes(loaded) -> int:
    from mlx.utils import tree_flatten

    module = loaded.whole_model
    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


class MemoryPolicy:
    def __init__(self, loaded, memory_limit: Optional[int] = None, buffer_cache_bytes: Optional[int] = None):
        import mlx.core as mx

        self.weights = weights_bytes(loaded)
        self.draft_weights = 0  # a draft model's weights, held beside these (engine/speculation/draft.py)
        self.memory_limit = int(memory_limit) if memory_limit else None
        self.buffer_cache = DEFAULT_BUFFER_CACHE_BYTES if buffer_cache_bytes is None else int(buffer_cache_bytes)
        if self.memory_limit:
            mx.set_memory_limit(self.memory_limit)
            self.buffer_cache = min(self.buffer_cache, self.memory_limit // 8)
        mx.set_cache_limit(self.buffer_cache)
        self._busy = False  # steps ran since the buffer cache was last emptied
        self.evicted_bytes = 0  # prefix-cache bytes evicted to stay under memory_limit

    def prefix_budget(self, requested: Optional[int]) -> int:
        """The prefix cache's byte budget: as asked (default a tenth of RAM, at most 4 GiB), and with a
        memory limit at most half of what the weights (a draft model's included) leave."""
        budget = default_prefix_budget() if requested is None else int(requested)
        if self.memory_limit:
            budget = min(budget, max(0, self.memory_limit - self.weights - self.draft_weights) // 2)
        return budget

    def after_step(self, runner) -> None:
        import mlx.core as mx

        self._busy = True
        if self.memory_limit and runner.prefix is not None:
            over = mx.get_active_memory() - self.memory_limit
            if over > 0:
                self.evicted_bytes += runner.prefix.shrink(over)

    def settle(self) -> None:
        """Idle: hand the buffer cache back to the system (once per busy period)."""
        import mlx.core as mx

        if self._busy:
            mx.clear_cache()
            self._busy = False

    def status(self, prefix=None) -> dict:
        import mlx.core as mx

        return {
            "active_bytes": mx.get_active_memory(),
            "cache_bytes": mx.get_cache_memory(),
            "peak_bytes": mx.get_peak_memory(),
            "rss_bytes": rss_bytes(),
            "weights_bytes": self.weights,
            "draft_weights_bytes": self.draft_weights,
            "prefix_cache_bytes": prefix.nbytes if prefix is not None else 0,
            "buffer_cache_limit_bytes": self.buffer_cache,
            "memory_limit_bytes": self.memory_limit,
            "evicted_for_limit_bytes": self.evicted_bytes,
        }
