"""Live BatchEvents from a server's `events` SSE route: what `Client.subscribe` does over HTTP.

A daemon thread reads the stream and hands each event to a callback. A dropped connection is
resumed with `Last-Event-ID`: the route replays every event after it, so none is missed or repeated.
The route sends a keep-alive comment every 15 s, so a read timeout longer than that means the
server is gone, and `close()` takes effect within one read.
"""

from __future__ import annotations

import json
import threading
from typing import Callable, Iterable, Optional

READ_TIMEOUT_S = 20.0  # longer than the route's keep-alive period
RETRY_S = 1.0


class SSEParser:
    """Fed one line at a time; returns an event's data when a blank line ends it. Comments
    (keep-alives) and fields other than `data` are skipped: the event's JSON carries its `seq`."""

    def __init__(self):
        self._data: list[str] = []

    def feed(self, line: str) -> Optional[str]:
        if line:
            if line.startswith("data:"):
                self._data.append(line[5:].removeprefix(" "))
            return None
        data, self._data = self._data, []
        return "\n".join(data) if data else None


class EventStream:
    """`EventStream(url, headers, since, callback)` starts reading at once; `close()` stops it."""

    def __init__(self, url: str, headers: dict, since: int, callback: Callable[[dict], None]):
        self.url, self.headers, self.last, self.callback = url, dict(headers), since, callback
        self.error: str = ""  # the last connection problem, for whoever wonders why nothing comes
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="mlx-nb-events")
        self.thread.start()

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import httpx

        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=5.0)
        while not self._stop.is_set():
            try:
                headers = {**self.headers, "Last-Event-ID": str(self.last)}
                with httpx.stream("GET", self.url, headers=headers, timeout=timeout) as resp:
                    if resp.status_code != 200:
                        self.error = f"{self.url} answered {resp.status_code}"
                    else:
                        self.error = ""
                        self._read(resp.iter_lines())
            except (httpx.HTTPError, ValueError) as exc:
                self.error = f"{type(exc).__name__}: {exc}"
            self._stop.wait(RETRY_S)

    def _read(self, lines: Iterable[str]) -> None:
        parser = SSEParser()
        for line in lines:
            if self._stop.is_set():
                return
            data = parser.feed(line)
            if data is None:
                continue
            event = json.loads(data)
            if event.get("seq", 0) > self.last:
                self.last = event["seq"]
                self.callback(event)
