"""What a model load is doing right now: phase, fraction, elapsed time.

A load runs on one thread (the engine's) through several functions (resolve, GGUF conversion,
mlx_lm's load, the dtype policy). Rather than thread a callback through each of them, the loader
installs a `LoadProgress` for its thread (`reporting`) and each step calls `report(...)`, which
does nothing when nobody listens. Readers on other threads (the status route, a waiting client)
call `to_dict()`: plain values, replaced whole, so no lock is needed.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional

_local = threading.local()


class LoadProgress:
    """The phase of one load (`starting`, `resolving`, `converting GGUF`, `loading weights`, ...)."""

    def __init__(self, phase: str = "starting"):
        self.started = time.monotonic()
        self.finished: Optional[float] = None
        self._state = (phase, None, None, self.started)

    def set(self, phase: str, done: Optional[int] = None, total: Optional[int] = None) -> None:
        since = self._state[3] if phase == self._state[0] else time.monotonic()
        self._state = (phase, done, total, since)

    def finish(self, phase: str = "ready") -> None:
        self.set(phase)
        self.finished = time.monotonic()

    @property
    def phase(self) -> str:
        return self._state[0]

    def to_dict(self) -> dict:
        phase, done, total, since = self._state
        end = self.finished or time.monotonic()
        fraction = min(1.0, done / total) if done is not None and total else None
        return {"phase": phase, "done": done, "total": total, "fraction": fraction,
                "elapsed_s": round(end - self.started, 3), "phase_elapsed_s": round(end - since, 3)}


@contextmanager
def reporting(progress: LoadProgress) -> Iterator[LoadProgress]:
    """`report()` calls on this thread go to `progress` while the block runs."""
    previous = getattr(_local, "progress", None)
    _local.progress = progress
    try:
        yield progress
    finally:
        _local.progress = previous


def report(phase: str, done: Optional[int] = None, total: Optional[int] = None) -> None:
    """Tell whoever listens on this thread what the load is doing (a no-op otherwise)."""
    progress = getattr(_local, "progress", None)
    if progress is not None:
        progress.set(phase, done, total)


def describe(status: dict) -> str:
    """A status dict (`Engine.status()` or the status route) -> one line about its load."""
    model = status.get("model") or "the model"
    if status.get("error"):
        return f"{model} failed to load: {status['error']}"
    load = status.get("load") or {}
    phase = load.get("phase") or "loading"
    fraction = load.get("fraction")
    done = f" {fraction:.0%}" if fraction is not None else ""
    elapsed = load.get("elapsed_s")
    took = f", {elapsed:.0f} s" if elapsed is not None else ""
    return f"loading {model}: {phase}{done}{took}"
