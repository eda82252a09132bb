"""Long-lived threads for engine loops.

Measured with mlx 0.32.4 (CPU): once a thread that ran `mx.compile`d kernels (the SSM and
gated-delta layers of hybrid models) has exited, the process aborts at exit with "terminate
called without an active exception". So an engine's thread is never allowed to end: when an
engine closes, its worker goes idle and the next engine reuses it.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

log = logging.getLogger("mlx_nb.engine")
_idle: "queue.SimpleQueue[_Worker]" = queue.SimpleQueue()
_lock = threading.Lock()
_count = 0


class _Worker:
    def __init__(self, name: str):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            fn, done = self.jobs.get()
            try:
                fn()
            except BaseException:  # the thread must outlive any job (see the module docstring)
                log.exception("mlx_nb: an engine loop ended with an error")
            finally:
                fn = None  # an idle worker must not keep the finished job (its engine, its model) alive
                _idle.put(self)  # idle before the job is seen done: an engine started after join() reuses it
                done.set()


class Job:
    """What `start()` returns: the thread running the job, and a way to wait for its end."""

    def __init__(self, thread: threading.Thread, done: threading.Event):
        self.thread = thread
        self._done = done

    def join(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)


def start(fn: Callable[[], None], name: str = "mlx-nb-engine") -> Job:
    """Run `fn` on an idle worker thread (a new one if none is idle)."""
    global _count
    try:
        worker = _idle.get_nowait()
    except queue.Empty:
        with _lock:
            _count += 1
            worker = _Worker(f"{name}-{_count}")
    done = threading.Event()
    worker.jobs.put((fn, done))
    return Job(worker.thread, done)
