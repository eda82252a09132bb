"""Waiting for a model that is still loading, with a progress line, instead of failing.

While its model loads, a server answers the model routes with 503 + `Retry-After` (error code
`model_loading`) and its status route says what the load is doing; an embedded Engine says the
same through `status()`. A `LoadWait` turns those into calls of `progress(status)` until the
model is ready, the load fails, or the wait's deadline passes.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional

from mlx_nb.client.streams import ClientError
from mlx_nb.models.progress import describe

DEFAULT_LOAD_TIMEOUT_S = 900.0  # a first GGUF conversion of a large model takes minutes
EMBEDDED_POLL_S = 0.25

Progress = Callable[[dict], None]


class ModelLoadingError(ClientError):
    """The server's model is still loading (HTTP 503 `model_loading`); retry after `retry_after` s."""

    def __init__(self, message: str, retry_after: float = 2.0):
        super().__init__(message)
        self.retry_after = retry_after


def print_progress(file=None, quiet_s: float = 1.0) -> Progress:
    """The default progress: one `mlx: loading ...` line (on stderr) each time the phase changes,
    once the load has taken `quiet_s`: a quick load prints nothing."""
    last: list[str] = []

    def show(status: dict) -> None:
        load = status.get("load") or {}
        if (load.get("elapsed_s") or 0) >= quiet_s and [load.get("phase")] != last:
            last[:] = [load.get("phase")]
            print(f"mlx: {describe(status)}", file=file or sys.stderr, flush=True)

    return show


class LoadWait:
    """One wait for a loading model: each `round(status)` reports progress or raises why to stop."""

    def __init__(self, progress: Optional[Progress], timeout: float):
        self.progress = progress or print_progress()
        self.timeout = timeout
        self.started: Optional[float] = None  # the first round: the model was found loading
        self.rounds = 0

    @property
    def waited_s(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def round(self, status: dict) -> None:
        self.started = self.started or time.monotonic()
        self.rounds += 1
        if status.get("error"):
            raise ClientError(describe(status))
        if self.waited_s > self.timeout:
            raise ClientError(f"{describe(status)}: not ready after waiting {self.timeout:.0f} s; "
                              "try again later (or give the Client a longer load_timeout)")
        try:
            self.progress(status)
        except Exception:  # a broken progress display must not fail the request
            pass


def wait_embedded(engine, wait: LoadWait) -> None:
    """Until `engine` has loaded its model (its load error, if any, is raised as is)."""
    while not engine.ready and engine.load_error is None:
        wait.round(engine.status())
        try:
            engine.wait_ready(EMBEDDED_POLL_S)
        except TimeoutError:
            continue
    engine.wait_ready()
