"""The model routes: models, chat/completions, completions and (Anthropic) messages.

Each verb is parse -> `engine.submit` -> either one JSON body or an SSE stream, with every wire
detail left to `mlx_nb.api`. Streams write one event per Delta and `await self.flush()` after it,
so tokens leave as they are made; a client that goes away aborts its request, which frees its
batch slot at the engine's next step (a `filter` event with reason `abort`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional

from jupyter_server.auth.decorator import authorized
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_ext.base import MLXHandler
from mlx_nb.api import (
    ChatStream,
    CompletionStream,
    MessagesStream,
    chat_engine_kwargs,
    chat_response,
    completion_engine_kwargs,
    completion_response,
    messages_engine_kwargs,
    messages_response,
    model_card,
    model_not_found,
    models_list,
    parse_chat_request,
    parse_completion_request,
    parse_messages_request,
    sse_done,
    sse_event,
)
from mlx_nb.engine.types import Delta


class ModelsHandler(MLXHandler):
    """The configured model; listed while it loads too (the list is config, not weights)."""

    @web.authenticated
    @authorized
    def get(self):
        self.write_json(models_list([self.ext.model]))


class ModelHandler(MLXHandler):
    @web.authenticated
    @authorized
    def get(self, name: str):
        if name != self.ext.model:
            raise model_not_found(name, [self.ext.model])
        self.write_json(model_card(name))


class GenerateHandler(MLXHandler):
    """Submits one request and answers it whole or as a stream; aborts it if the client leaves."""

    handle = None
    gone = False

    def on_connection_close(self):
        self.gone = True
        if self.handle is not None and not self.handle.done:
            self.handle.abort()
        super().on_connection_close()

    def source(self) -> str:
        """Who asks, for the batch timeline: the X-MLX-Source header mlx_nb's Client sends, else the route."""
        given = self.request.headers.get("X-MLX-Source", "").strip()
        agent = self.request.headers.get("User-Agent", "").split(" ")[0]
        return (given or f"route: {agent}".rstrip(": "))[:80]

    async def submit(self, kwargs: dict):
        """`engine.submit` off the event loop: it templates and tokenizes the prompt."""
        handle = await asyncio.to_thread(self.ready_engine().submit, **kwargs, source=self.source())
        self.handle = handle
        if self.gone:  # left while the prompt was being tokenized
            handle.abort()
        return handle

    def tool_support(self) -> dict:
        """The tokenizer's tool-call parser and markers, when the model has them."""
        tok = self.ready_engine().loaded.tokenizer
        start, end = getattr(tok, "tool_call_start", None), getattr(tok, "tool_call_end", None)
        return {
            "tool_parser": getattr(tok, "tool_parser", None),
            "tool_markers": (start, end) if start and end else None,
        }

    async def stream(self, handle, frames: Callable[[Delta], bytes], tail: bytes = b"") -> None:
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")  # nginx and friends: do not buffer the stream
        try:
            async for delta in handle:
                data = frames(delta)
                if data and not self.gone:
                    self.write(data)
                    await self.flush()
            if tail and not self.gone:
                self.write(tail)
                await self.flush()
        except StreamClosedError:
            return  # the client left; tornado finishes the (closed) response
        finally:
            if not handle.done:  # any early exit frees the batch slot
                handle.abort()
        self.finish(set_content_type="text/event-stream; charset=utf-8")

    def engine_info(self) -> tuple[list[str], Optional[int]]:
        engine = self.ready_engine()
        return [engine.model_name], engine.loaded.context_length


class ChatHandler(GenerateHandler):
    @web.authenticated
    @authorized
    async def post(self):
        names, context = self.engine_info()
        req = parse_chat_request(self.request.body, model_names=names, context_length=context)
        handle = await self.submit(chat_engine_kwargs(req))
        model, created, tools = names[0], int(time.time()), self.tool_support()
        if not req.stream:
            result = await handle.aresult()
            if not self.gone:
                self.write_json(chat_response(req, result, model=model, created=created, **tools))
            return
        chat = ChatStream.for_request(req, model=model, created=created, request_id=handle.id, **tools)
        await self.stream(handle, lambda d: b"".join(sse_event(c) for c in chat.feed(d)), sse_done())


class CompletionsHandler(GenerateHandler):
    @web.authenticated
    @authorized
    async def post(self):
        names, context = self.engine_info()
        req = parse_completion_request(self.request.body, model_names=names, context_length=context)
        handle = await self.submit(completion_engine_kwargs(req))
        model, created = names[0], int(time.time())
        if not req.stream:
            result = await handle.aresult()
            if not self.gone:
                self.write_json(completion_response(result, model=model, created=created, top_logprobs=req.logprobs))
            return
        text = CompletionStream.for_request(req, model=model, created=created, request_id=handle.id)
        await self.stream(handle, lambda d: b"".join(sse_event(c) for c in text.feed(d)), sse_done())


class MessagesHandler(GenerateHandler):
    """Anthropic Messages: errors in Anthropic's shape, named SSE events, no `[DONE]`."""

    anthropic = True

    @web.authenticated
    @authorized
    async def post(self):
        names, context = self.engine_info()
        req = parse_messages_request(self.request.body, model_names=names, context_length=context)
        handle = await self.submit(messages_engine_kwargs(req))
        model, tools = names[0], self.tool_support()
        if not req.stream:
            result = await handle.aresult()
            if not self.gone:
                self.write_json(messages_response(req, result, model=model, matched_stop=result.matched_stop, **tools))
            return
        msgs = MessagesStream.for_request(req, model=model, request_id=handle.id, **tools)

        def frames(d: Delta) -> bytes:
            return b"".join(sse_event(data, event=name) for name, data in msgs.feed(d, matched_stop=d.matched_stop))

        await self.stream(handle, frames)
