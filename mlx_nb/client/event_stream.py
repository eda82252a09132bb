"""Live BatchEvents from a server's `events` SSE route: what `Client.subscribe` does over HTTP.

A daemon thread reads the stream and hands each event to a callback. A dropped connection is
resumed with `Last-Event-ID`: the route replays every event after it, so none is missed or repeated.
Failed connections are retried with a growing pause (1 s doubling to 30 s); an answer that retrying
cannot change (401, 403, 404) stops the reader. Either way `on_state(message)` tells the owner
(a widget shows it); an empty message means connected. The route sends a keep-alive comment
every 15 s, so a read timeout longer than that means the server is gone; `close()` shuts the open
connection down (httpx's documented `network_stream` extension gives its socket), so the thread
ends at once instead of at the next event or keep-alive.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Callable, Iterable, Optional

READ_TIMEOUT_S = 20.0  # longer than the route's keep-alive period
FIRST_RETRY_S, MAX_RETRY_S = 1.0, 30.0
FINAL = {401: "the token was refused", 403: "access was refused", 404: "there is no events route there"}


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

    def __init__(self, url: str, headers: dict, since: int, callback: Callable[[dict], None],
                 on_state: Optional[Callable[[str], None]] = None):
        self.url, self.headers, self.last, self.callback = url, dict(headers), since, callback
        self.on_state = on_state
        self.error: str = ""  # the last connection problem, for whoever wonders why nothing comes
        self.stopped = False  # gave up for good (401/403/404)
        self._stop = threading.Event()
        self._response = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="mlx-nb-events")
        self.thread.start()

    def close(self) -> None:
        self._stop.set()
        response = self._response
        if response is None:
            return
        try:  # a read blocked in recv() wakes only when its socket is shut down, not closed
            stream = response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
        try:
            response.close()
        except Exception:
            pass

    def _state(self, message: str) -> None:
        if message != self.error:
            self.error = message
            if self.on_state is not None and not self._stop.is_set():
                try:
                    self.on_state(message)
                except Exception:  # the owner's display must not stop the reader
                    pass

    def _run(self) -> None:
        import httpx

        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=5.0)
        pause = FIRST_RETRY_S
        while not self._stop.is_set():
            try:
                headers = {**self.headers, "Last-Event-ID": str(self.last)}
                with httpx.stream("GET", self.url, headers=headers, timeout=timeout) as resp:
                    self._response = resp
                    if resp.status_code in FINAL:
                        self.stopped = True
                        self._state(f"{self.url} answered {resp.status_code}: {FINAL[resp.status_code]}; "
                                    "live updates stopped")
                        return
                    if resp.status_code != 200:
                        raise ValueError(f"answered {resp.status_code}")
                    pause = FIRST_RETRY_S
                    self._state("")
                    self._read(resp.iter_lines())
            except (httpx.HTTPError, ValueError) as exc:
                if self._stop.is_set():
                    return
                self._state(f"cannot reach {self.url} ({type(exc).__name__}: {exc}); retrying in {pause:.0f} s")
            finally:
                self._response = None
            self._stop.wait(pause)
            pause = min(MAX_RETRY_S, pause * 2)

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
