"""BatchEvents: what happened to the batch, step by step, for the visualizer and the SSE route.

A bounded ring buffer plus subscriptions. Publishing happens on the engine thread; subscribers
get events through their own thread-safe callback (e.g. `loop.call_soon_threadsafe`).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Callable


@dataclass
class BatchEvent:
    kind: str  # insert | prefill | extend | filter | step | error
    step: int
    time: float
    requests: list[str] = field(default_factory=list)
    detail: dict = field(default_factory=dict)
    seq: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def prompt_snippet(messages, prompt, limit: int = 48) -> str:
    """The last user message's (or the prompt's) first words, one line: how a timeline names a lane."""
    text = prompt if isinstance(prompt, str) else ""
    for message in reversed(messages or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # text parts only: an image has no words
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            text = content if isinstance(content, str) else ""
            break
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class EventLog:
    def __init__(self, capacity: int = 4096):
        self._events: deque[BatchEvent] = deque(maxlen=capacity)
        self._subscribers: dict[int, Callable[[BatchEvent], None]] = {}
        self._ids = itertools.count()
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def publish(self, kind: str, step: int, requests: list[str], **detail) -> BatchEvent:
        event = BatchEvent(kind, step, time.time(), list(requests), detail, next(self._seq))
        with self._lock:
            self._events.append(event)
            subscribers = list(self._subscribers.values())
        for callback in subscribers:
            try:
                callback(event)
            except Exception:  # a broken subscriber must not stop the engine
                pass
        return event

    def recent(self, since: int = 0) -> list[BatchEvent]:
        with self._lock:
            return [e for e in self._events if e.seq > since]

    def subscribe(self, callback: Callable[[BatchEvent], None]) -> Callable[[], None]:
        """Call `callback(event)` for every new event; returns the unsubscribe function."""
        key = next(self._ids)
        with self._lock:
            self._subscribers[key] = callback

        def unsubscribe():
            with self._lock:
                self._subscribers.pop(key, None)

        return unsubscribe
