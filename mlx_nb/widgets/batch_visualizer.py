"""BatchVisualizer: a live SVG timeline of the engine's batch (who joins, who leaves, batch size).

`client.subscribe` pushes each BatchEvent into a thread-safe buffer: from the engine thread when
the engine is embedded (nothing else happens there: the engine must not wait on widgets), from a
reader of the server's `events` SSE route over HTTP (which retries with backoff, stops on 401/404,
and says so in the toolbar). A drawing thread redraws at most `max_hz` times a second. A server
that is loading or unreachable is a note in the toolbar, never a traceback; one that publishes no
batch events (fronting a backend without them) gets its own explanation in place of the timeline
(`.unavailable`).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Optional

import ipywidgets as W

from mlx_nb.widgets.base import PictureWidget, one_line
from mlx_nb.pictures.batch import build_batch_svg


class BatchVisualizer(PictureWidget):
    """`BatchVisualizer()`; `.refresh()` pulls new events, `live=True` redraws by itself."""

    def __init__(self, client: Any = None, *, engine: Any = None, since: int = 0, live: bool = True,
                 max_lanes: int = 24, max_hz: float = 5.0, max_events: int = 20000, **kwargs):
        from mlx_nb.client import Client

        self.client = client or Client(engine=engine)
        self.max_lanes, self.max_hz = max_lanes, max_hz
        self.events: deque = deque(maxlen=max_events)
        self.last_seq = since
        self.refresh_button = W.Button(description="Refresh", icon="refresh", layout=W.Layout(width="auto"))
        self.refresh_button.on_click(lambda _: self.refresh())
        self.clear_button = W.Button(description="Clear", icon="eraser", layout=W.Layout(width="auto"))
        self.clear_button.on_click(lambda _: self.clear())
        self._buffer: deque = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._unsubscribe = None
        self._thread: Optional[threading.Thread] = None
        self.unavailable: Optional[str] = None
        super().__init__([self.refresh_button, self.clear_button], **kwargs)
        if not self.client.embedded and not self._events_published():
            return
        if live and self.client.embedded:  # subscribe before the first pull: no gap, duplicates dropped by seq
            self._unsubscribe = self._subscribe()
        self.refresh()
        if live and not self.client.embedded:  # the route replays what came after the pull
            self._unsubscribe = self._subscribe()
        if live:
            self._thread = threading.Thread(target=self._loop, daemon=True, name="mlx-nb-batch-visualizer")
            self._thread.start()

    def _events_published(self) -> bool:
        from html import escape

        from mlx_nb.client import ClientError, MlxConnectionError

        try:
            self.client.events(since=self.last_seq)
        except MlxConnectionError:
            return True  # unreachable for now: the reader retries and says so in the toolbar
        except ClientError as exc:
            if exc.status != 404:  # loading, refused, ...: the reader says so in the toolbar
                return True
            self.unavailable = one_line(exc)
            self.html.value = f"<p><b>No batch timeline:</b> {escape(self.unavailable)}</p>"
            return False
        return True

    def _subscribe(self):
        try:
            return self.client.subscribe(self._on_event, since=self.last_seq, on_state=self._on_state)
        except Exception as exc:  # e.g. an embedded model that failed to load
            self.say(f"no live updates: {one_line(exc)}")
            return None

    def _on_event(self, event: dict) -> None:
        # Runs on the engine thread or the SSE reader: only hand the event over.
        self._buffer.append(event)
        self._wake.set()

    def _on_state(self, message: str) -> None:
        self.say(f"live updates: {message}" if message else "")

    def _add(self, events: list[dict]) -> int:
        added = 0
        with self._lock:
            for ev in sorted(events, key=lambda e: e.get("seq", 0)):
                if ev.get("seq", 0) > self.last_seq:
                    self.events.append(ev)
                    self.last_seq = ev["seq"]
                    added += 1
        return added

    def refresh(self) -> None:
        """Pull events newer than the last one seen and redraw (a failure is a note, not an error)."""
        from mlx_nb.client import ClientError

        try:
            self._add(self.client.events(since=self.last_seq))
        except (ClientError, OSError) as exc:
            self.say(f"mlx: {one_line(exc)}")
        self.redraw()

    def redraw(self) -> None:
        with self._lock:
            events = list(self.events)
        self.html.value = build_batch_svg(events, max_lanes=self.max_lanes)

    def clear(self) -> None:
        """Forget what was drawn; only events from now on are shown."""
        with self._lock:
            self.events.clear()
        self.redraw()

    def _drain(self) -> list[dict]:
        out = []
        while self._buffer:
            out.append(self._buffer.popleft())
        return out

    def _loop(self) -> None:
        period = 1.0 / self.max_hz
        while not self._closed.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if self._add(self._drain()) and not self._closed.is_set():
                self.redraw()
            self._closed.wait(period)  # at most max_hz redraws a second

    @property
    def live(self) -> bool:
        """Whether the drawing thread still runs."""
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Stop the live updates (the events reader and the drawing thread) and close the widget."""
        self._closed.set()
        self._wake.set()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        super().close()
