"""CacheInspector: a request's KV cache drawn as rows x positions, then bytes layer by layer.

`refresh()` reads `client.cache_layout(request_id)` (without an id: the newest decoding request,
else a fresh cache, summarized); `follow()` re-reads it on a background thread while a request
decodes, so the cache can be watched growing token by token. A model still loading or a server
out of reach is a note in the toolbar, and the inspector draws once it can.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import ipywidgets as W

from mlx_nb.widgets.base import PictureWidget, one_line
from mlx_nb.pictures.cache import build_cache_svg

MAX_RETRY_S = 10.0


class CacheInspector(PictureWidget):
    """`CacheInspector(request_id=...)`; `.refresh()` redraws; `auto_refresh=True` follows it."""

    def __init__(self, client: Any = None, request_id: Optional[str] = None, *, engine: Any = None,
                 auto_refresh: bool = False, interval: float = 0.5, **kwargs):
        from mlx_nb.client import Client

        self.client = client or Client(engine=engine)
        self.request_id = request_id
        self.layout_data: dict = {}
        self.refresh_button = W.Button(description="Refresh", icon="refresh", layout=W.Layout(width="auto"))
        self.refresh_button.on_click(lambda _: self.refresh())
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        super().__init__([self.refresh_button], **kwargs)
        self.refresh()  # drawn at once (also what a saved notebook shows), then kept up to date
        if auto_refresh:
            self.follow(request_id, interval)

    def refresh(self, request_id: Optional[str] = None) -> dict:
        """Redraw from the current layout; a finished request falls back to a fresh cache."""
        from mlx_nb.client import ClientError

        try:
            status = self.client.status()
            if not status.get("ready"):
                self._wait_for_load(status)
                return self.layout_data
            rid = request_id or self.request_id or self._newest_decoding(status)
            try:
                self._draw(self.client.cache_layout(rid))
                self.say(f"request {rid}" if rid else "a fresh cache: no request is decoding")
            except ClientError as exc:
                if rid is None:
                    raise
                self._draw(self.client.cache_layout(None))
                self.say(f"{one_line(exc)}; showing a fresh cache")
        except (ClientError, OSError) as exc:
            self.say(f"mlx: {one_line(exc)}")
        return self.layout_data

    def _wait_for_load(self, status: dict) -> None:
        """Say what the load does and draw once it is done (on a thread: the cell goes on)."""
        from mlx_nb.models.progress import describe

        self.say(describe(status))
        if self._thread is not None and self._thread.is_alive():
            return
        stop = self._stop

        def wait():
            try:
                self.client.wait_ready(progress=lambda s: None if stop.is_set() else self.say(describe(s)))
            except Exception as exc:
                self.say(f"mlx: {one_line(exc)}")
                return
            if not stop.is_set():
                self.refresh()

        self._thread = threading.Thread(target=wait, daemon=True, name="mlx-nb-cache-inspector-load")
        self._thread.start()

    def _draw(self, layout: dict) -> None:
        self.layout_data = layout
        self.html.value = build_cache_svg(layout)

    def follow(self, request_id: Optional[str] = None, interval: float = 0.5) -> None:
        """Redraw every `interval` s: the given request until it ends, else the newest decoding one."""
        self.stop()
        self._stop = stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, args=(request_id, interval, stop), daemon=True,
                                        name="mlx-nb-cache-inspector")
        self._thread.start()

    def _follow(self, request_id: Optional[str], interval: float, stop: threading.Event) -> None:
        from mlx_nb.client import ClientError, ModelLoadingError, MlxConnectionError
        from mlx_nb.models.progress import describe

        seen, pause = 0, interval
        while not stop.wait(pause):
            pause = interval
            try:
                status = None if seen else self.client.status()
                if status is not None and not status.get("ready"):
                    self.say(describe(status))
                    continue
                rid = request_id or self._newest_decoding(status)
                if rid is None:
                    if not self.layout_data:
                        self._draw(self.client.cache_layout(None))
                    self.say("waiting for a request to decode")
                    continue
                layout = self.client.cache_layout(rid)
                if stop.is_set():
                    return
                self._draw(layout)
                self.say(f"following {rid}")
                seen += 1
            except ModelLoadingError as exc:
                self.say(one_line(exc))
            except MlxConnectionError as exc:  # the server is away: ask less often until it is back
                self.say(f"mlx: {one_line(exc)}")
                pause = min(MAX_RETRY_S, max(pause, interval) * 2)
            except ClientError as exc:  # the request ended (or has not started yet)
                if request_id is not None and seen:
                    self.say(f"{request_id} finished")
                    return
                if request_id is None:
                    seen = 0
                    continue
                self.say(f"mlx: {one_line(exc)}")
                if not any(r.get("id") == request_id for r in self.client.status().get("requests", [])):
                    return  # not queued either: it never existed, or ended before we looked
            except Exception as exc:  # keep the widget alive; say what went wrong
                self.say(f"mlx: {one_line(exc)}")
                return

    def _newest_decoding(self, status: Optional[dict] = None) -> Optional[str]:
        requests = (status if status is not None else self.client.status()).get("requests", [])
        live = [r for r in requests if r.get("phase") == "decode"]
        return live[-1]["id"] if live else None

    def stop(self) -> None:
        """Stop following."""
        self._stop.set()

    def close(self) -> None:
        self.stop()
        super().close()
