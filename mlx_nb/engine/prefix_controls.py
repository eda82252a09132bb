"""What a caller can do to an Engine's prefix cache: empty it, write it to its folder, read the
folder back. A mixin of Engine: each runs on the engine thread (`_call`), which owns the cache."""

from __future__ import annotations

from typing import Callable

from mlx_nb.engine.types import RequestError


class PrefixCacheControls:
    def clear_prefix_cache(self, disk: bool = False) -> dict:
        """Drop every stored prefix (with `disk`, the files on disk too). Returns the entries and
        bytes the cache said it held, and MLX's active memory just before and after, read together
        on the engine thread."""
        self.wait_ready()

        def clear():
            import gc

            import mlx.core as mx

            prefix = self._loop.runner.prefix
            gc.collect()  # unrelated garbage freed meanwhile would blur the before/after reading
            before, entries = mx.get_active_memory(), (len(prefix) if prefix is not None else 0)
            held = prefix.clear() if prefix is not None else 0
            gc.collect()
            out = {"entries": entries, "bytes": held, "active_bytes_before": before,
                   "active_bytes_after": mx.get_active_memory()}
            if disk and prefix is not None and prefix.disk is not None:
                out["disk_entries"], out["disk_bytes"] = len(prefix.disk.entries), prefix.disk.clear()
            return out

        return self._call(clear)

    def save_prefix_cache(self) -> dict:
        """Write what the prefix cache holds in memory and not yet on disk now (it is also written
        while idle and at close); the prefix cache's status after."""
        return self._on_disk(lambda prefix: prefix.spill_all())

    def load_prefix_cache(self) -> dict:
        """Read the prefix cache's files on disk into memory (as many as its budget keeps), e.g.
        ones another server of the same weights wrote since this one started."""
        def load(prefix):
            prefix.disk.scan()
            prefix.load_all()
        return self._on_disk(load)

    def _on_disk(self, fn: Callable) -> dict:
        self.wait_ready()

        def run():
            prefix = self._loop.runner.prefix
            if prefix is None or prefix.disk is None:
                raise RequestError("this engine keeps no prefix cache on disk: start it with prefix_cache_dir")
            fn(prefix)
            return prefix.status()

        return self._call(run)
