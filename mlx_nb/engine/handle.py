"""RequestHandle: the caller's end of a request, iterable from any thread or event loop.

The engine thread pushes Deltas; a sync reader blocks on a condition, an async reader gets them
through `call_soon_threadsafe` on its own loop, so no event loop is ever blocked.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable, Optional

from mlx_nb.engine.types import Delta, Result, TokenLogprob, Usage


class RequestHandle:
    def __init__(self, request_id: str, abort: Callable[[str], None], *, prompt_tokens: Optional[int] = None,
                 max_tokens: Optional[int] = None):
        self.id = request_id
        self.prompt_tokens = prompt_tokens  # known at submit: what a stream can report before any token
        self.max_tokens = max_tokens  # the budget granted (a larger request is clamped to what fits)
        self._abort = abort
        self._deltas: list[Delta] = []
        self._cond = threading.Condition()
        self._done = False
        self._async_sinks: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = []

    # -- engine side -------------------------------------------------------------------------
    def push(self, delta: Delta) -> None:
        with self._cond:
            self._deltas.append(delta)
            if delta.finish_reason is not None:
                self._done = True
            self._cond.notify_all()
            sinks = list(self._async_sinks)
        for loop, queue in sinks:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, delta)
            except RuntimeError:  # that loop is closed; its reader is gone
                pass

    # -- caller side -------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done

    def abort(self) -> None:
        self._abort(self.id)

    def __iter__(self):
        i = 0
        while True:
            with self._cond:
                while i >= len(self._deltas):
                    self._cond.wait()
                delta = self._deltas[i]
            i += 1
            yield delta
            if delta.finish_reason is not None:
                return

    async def _aiter(self):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        with self._cond:
            backlog = list(self._deltas)
            self._async_sinks.append((loop, queue))
        try:
            for delta in backlog:
                yield delta
                if delta.finish_reason is not None:
                    return
            while True:
                delta = await queue.get()
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            with self._cond:
                self._async_sinks.remove((loop, queue))

    def __aiter__(self):
        return self._aiter()

    def wait(self, timeout: Optional[float] = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._done, timeout)

    def result(self, timeout: Optional[float] = None) -> Result:
        """Block until the request ends and return the whole reply."""
        if not self.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        return self._assemble()

    async def aresult(self) -> Result:
        async for _ in self:
            pass
        return self._assemble()

    def _assemble(self) -> Result:
        with self._cond:
            deltas = list(self._deltas)
        last = deltas[-1]
        token_ids: list[int] = []
        logprobs: list[TokenLogprob] = []
        for d in deltas:
            token_ids += d.token_ids
            logprobs += d.logprobs
        return Result(
            request_id=self.id,
            text="".join(d.text for d in deltas),
            finish_reason=last.finish_reason,
            usage=last.usage or Usage(),
            token_ids=token_ids,
            logprobs=logprobs,
            error=last.error,
            matched_stop=last.matched_stop,
            reasoning="".join(d.reasoning for d in deltas),
        )
