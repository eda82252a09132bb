"""CacheInspector: the KV cache drawn layer by layer (type, offset, shapes, bytes) as inline SVG.

`refresh()` reads `client.cache_layout(request_id)`; `follow()` re-reads it on a background
thread while a request decodes, so the cache can be watched growing token by token.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import ipywidgets as W

from mlx_nb.widgets.svg_cache import build_cache_svg


class CacheInspector(W.VBox):
    """`CacheInspector(request_id=...)`: one SVG row per layer; `.refresh()` redraws."""

    def __init__(self, client: Any = None, request_id: Optional[str] = None, *, engine: Any = None,
                 auto_refresh: bool = False, interval: float = 0.5, **kwargs):
        from mlx_nb.client import Client

        self.client = client or Client(engine=engine)
        self.request_id = request_id
        self.layout_data: dict = {}
        self.html = W.HTML()
        self.note = W.Label("")
        self.refresh_button = W.Button(description="Refresh", icon="refresh")
        self.refresh_button.on_click(lambda _: self.refresh())
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        super().__init__([W.HBox([self.refresh_button, self.note]), self.html], **kwargs)
        self.refresh()
        if auto_refresh:
            self.follow(request_id, interval)

    @property
    def svg(self) -> str:
        return self.html.value

    def refresh(self, request_id: Optional[str] = None) -> dict:
        """Redraw from the current layout; a finished request falls back to a fresh cache."""
        from mlx_nb.client import ClientError

        rid = request_id or self.request_id
        try:
            layout = self.client.cache_layout(rid)
            self.note.value = ""
        except ClientError as exc:
            if rid is None:
                raise
            layout = self.client.cache_layout(None)
            self.note.value = f"{exc}; showing a fresh cache"
        self._draw(layout)
        return layout

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
        from mlx_nb.client import ClientError

        seen = 0
        while not stop.wait(interval):
            try:
                rid = request_id or self._newest_decoding()
                if rid is None:
                    continue
                self._draw(self.client.cache_layout(rid))
                self.note.value = f"following {rid}"
                seen += 1
            except ClientError:  # the request ended (or has not started yet)
                if request_id is not None and seen:
                    self.note.value = f"{request_id} finished"
                    return
            except Exception as exc:  # keep the widget alive; say what went wrong
                self.note.value = f"mlx: {exc}"
                return

    def _newest_decoding(self) -> Optional[str]:
        live = [r for r in self.client.status().get("requests", []) if r.get("phase") == "decode"]
        return live[-1]["id"] if live else None

    def stop(self) -> None:
        """Stop following."""
        self._stop.set()

    def close(self) -> None:
        self.stop()
        super().close()
