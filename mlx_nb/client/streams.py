"""Streams of one chat reply, sync and async, over either backend.

Both share one bookkeeping base (text so far, request id, finish reason, usage, timings) so a
widget's Stop button or a magic's KeyboardInterrupt aborts the same way everywhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional


class ClientError(RuntimeError):
    """A request the backend refused or failed; the message is written for people. `status` is the
    HTTP status when a server answered with one."""

    def __init__(self, message: str = "", status: Optional[int] = None):
        super().__init__(message)
        self.status = status


class MlxConnectionError(ClientError, ConnectionError):
    """The URL backend cannot be reached."""


@dataclass
class ChatReply:
    """One finished answer: its text, why it ended, token counts and timings (for tokens/s readouts)."""

    text: str
    finish_reason: Optional[str]
    usage: dict = field(default_factory=dict)
    request_id: Optional[str] = None
    model: Optional[str] = None
    ttft_s: Optional[float] = None
    elapsed_s: Optional[float] = None
    reasoning: str = ""  # a thinking model's reasoning, apart from the answer in `text`

    @property
    def tokens_per_s(self) -> Optional[float]:
        n = self.usage.get("completion_tokens") or 0
        if n < 2 or self.ttft_s is None or not self.elapsed_s or self.elapsed_s <= self.ttft_s:
            return None
        return (n - 1) / (self.elapsed_s - self.ttft_s)

    def __str__(self) -> str:
        return self.text


def _usage(u: Any) -> dict:
    """Engine Usage or OpenAI usage -> one plain dict."""
    if u is None:
        return {}
    p, c = getattr(u, "prompt_tokens", 0) or 0, getattr(u, "completion_tokens", 0) or 0
    cached = getattr(u, "cached_tokens", None) or getattr(getattr(u, "prompt_tokens_details", None), "cached_tokens", 0)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c, "cached_tokens": cached or 0}


# -- streams ----------------------------------------------------------------------------------
class _Stream:
    """Bookkeeping shared by sync and async streams: text so far, id, finish reason, usage, timings."""

    def __init__(self, client: Any, model: str):
        self.client, self.model = client, model
        self.request_id: Optional[str] = None
        self.finish_reason: Optional[str] = None
        self.usage: dict = {}
        self.error: Optional[str] = None
        self.aborted = False
        self._parts: list[str] = []
        self._reasoning: list[str] = []
        self._abort_fn: Optional[Callable[[], Any]] = None
        self._drains = False  # True: after an abort the backend still sends a final piece (with usage)
        self._t0, self._t_first, self._t_end = time.perf_counter(), None, None

    def _opened(self, request_id: Optional[str], abort_fn: Callable[[], Any], drains: bool = False) -> None:
        self._abort_fn, self._drains = abort_fn, drains
        if request_id:
            self._set_id(request_id)
        if self.aborted:  # Stop pressed before the request started
            abort_fn()

    def _restart_clock(self) -> None:
        """The request really starts now (after waiting for the model to load): time from here."""
        self._t0 = time.perf_counter()

    def _set_id(self, request_id: str) -> None:
        self.request_id = request_id
        self.client._live[request_id] = self

    def _take(self, text: str, finish: Optional[str], usage: dict, error: Optional[str], reasoning: str = "") -> None:
        if reasoning:
            self._reasoning.append(reasoning)
        if text or reasoning:
            self._t_first = self._t_first or time.perf_counter()
        if text:
            self._parts.append(text)
        self.finish_reason = finish or self.finish_reason
        self.usage = usage or self.usage
        self.error = error or self.error

    def _end(self) -> None:
        self._t_end = time.perf_counter()
        self.client._live.pop(self.request_id, None)
        if self.finish_reason is None and self.aborted:
            self.finish_reason = "abort"
        if not self.usage.get("completion_tokens") and self._parts:
            # A stream closed early (Stop over HTTP) never receives the final usage: each chunk
            # carried about one token, so count those, and say the count is an estimate.
            self.usage = {**self.usage, "completion_tokens": len(self._parts), "estimated": True}

    def _check(self) -> None:
        if self.finish_reason == "error" or (self.error and self.finish_reason != "abort"):
            raise ClientError(self.error or "the request failed")

    def abort(self) -> None:
        """Stop generating (safe from any thread); the stream then ends with finish_reason 'abort'."""
        self.aborted = True
        if self._abort_fn is not None and self.finish_reason is None:
            try:
                self._abort_fn()
            except Exception:  # a remote stream may already be closed
                pass

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def reasoning(self) -> str:
        """A thinking model's reasoning so far (it streams before the answer)."""
        return "".join(self._reasoning)

    @property
    def reply(self) -> Optional[ChatReply]:
        """The whole reply once the stream has ended, else None."""
        if self._t_end is None:
            return None
        ttft = None if self._t_first is None else self._t_first - self._t0
        return ChatReply(self.text, self.finish_reason, self.usage, self.request_id, self.model,
                         ttft, self._t_end - self._t0, self.reasoning)


class ChatStream(_Stream):
    """Iterator of text chunks (an empty one when only reasoning came: `.reasoning` grew); `.abort()`
    from any thread; `.reply` once it has ended."""

    def __init__(self, client: Any, model: str, opener: Callable[["ChatStream"], Any]):
        super().__init__(client, model)
        self._gen = self._run(opener(self))

    def _run(self, pieces):
        try:
            for text, finish, usage, error, reasoning in pieces:
                self._take(text, finish, usage, error, reasoning)
                if text or reasoning:  # a reasoning piece yields "": readers see `.reasoning` grow
                    yield text
                if self.aborted and not self._drains:
                    break
        except Exception:
            if not self.aborted:
                raise
        finally:
            if self.finish_reason is None:  # closed early, interrupted or failed
                self.abort()
            pieces.close()
            self._end()
        self._check()

    def __iter__(self):
        return self

    def __next__(self) -> str:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()


class AsyncChatStream(_Stream):
    """Async iterator of text chunks; the request starts on the first `__anext__`."""

    def __init__(self, client: Any, model: str, opener: Callable[["AsyncChatStream"], Any]):
        super().__init__(client, model)
        self._agen = self._run(opener(self))

    async def _run(self, pieces):
        try:
            async for text, finish, usage, error, reasoning in pieces:
                self._take(text, finish, usage, error, reasoning)
                if text or reasoning:
                    yield text
                if self.aborted and not self._drains:
                    break
        except Exception:
            if not self.aborted:
                raise
        finally:
            if self.finish_reason is None:
                self.abort()
            await pieces.aclose()
            self._end()
        self._check()

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        return await self._agen.__anext__()

    async def aclose(self) -> None:
        await self._agen.aclose()
