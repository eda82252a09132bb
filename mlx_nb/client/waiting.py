"""Waiting for a model that is still loading, with a progress line, instead of failing.

While its model loads, a server answers the model routes with 503 + `Retry-After` (error code
`model_loading`) and its status route says what the load is doing; an embedded Engine says the
same through `status()`. A `LoadWait` turns those into calls of `progress(status)` until the
model is ready, the load fails, or the wait's deadline passes.

Without a `progress` of the caller's, the load is shown once per model however many requests
wait on it: in a Jupyter kernel as one output line updated in place (nothing when
MLX_NB_NO_STREAM is set, as under nbval), elsewhere as a line on stderr per phase.
"""

from __future__ import annotations

import os
import sys
import threading
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
        super().__init__(message, status=503)
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


_lines: dict[str, dict] = {}  # model -> the default progress line being shown for its load
_lines_lock = threading.Lock()


def _in_kernel() -> bool:
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def default_progress(status: dict) -> None:
    """The load's line, shared by every request waiting on the same model (see the module doc)."""
    model, load = status.get("model") or "the model", status.get("load") or {}
    quiet = os.environ.get("MLX_NB_NO_STREAM", "").lower() in ("1", "true", "yes")
    with _lines_lock:
        line = _lines.setdefault(model, {"phase": None, "handle": None})
        if not _in_kernel():
            if load.get("phase") != line["phase"] and (load.get("elapsed_s") or 0) >= 1.0:
                line["phase"] = load.get("phase")
                print(f"mlx: {describe(status)}", file=sys.stderr, flush=True)
            return
        if quiet:
            return
        from IPython.display import display

        bundle = {"text/plain": f"⏳ {describe(status)}"}
        if line["handle"] is None:
            line["handle"] = display(bundle, raw=True, display_id=True)
        else:
            line["handle"].update(bundle, raw=True)


def _default_finished(status: dict, waited_s: float) -> None:
    with _lines_lock:
        line = _lines.pop(status.get("model") or "the model", None)
    if line and line["handle"] is not None:
        line["handle"].update({"text/plain": f"✓ {status.get('model')} loaded after {waited_s:.0f} s"}, raw=True)


class LoadWait:
    """One wait for a loading model: each `round(status)` reports progress or raises why to stop."""

    def __init__(self, progress: Optional[Progress], timeout: float):
        self.progress = progress or default_progress
        self.timeout = timeout
        self.started: Optional[float] = None  # the first round: the model was found loading
        self.rounds = 0
        self.last: dict = {}

    def finish(self) -> None:
        """The model is ready: a default line says so (a caller's progress needs no word)."""
        if self.rounds and self.progress is default_progress:
            _default_finished(self.last, self.waited_s)

    @property
    def waited_s(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def round(self, status: dict) -> None:
        self.started = self.started or time.monotonic()
        self.rounds += 1
        self.last = status
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
    wait.finish()
