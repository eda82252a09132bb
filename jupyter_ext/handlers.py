"""The model routes: models, and the generating POST routes (chat/completions, completions,
messages, responses) run by one handler skeleton over `mlx_nb.api.routes`; count_tokens.

A generating request is parse -> submit (one engine request per choice) -> one JSON body, or an
SSE stream that opens at admission: headers and the opening event (role chunk, message_start
with the prompt's token count, response.created) leave as soon as the engine has taken the
request, then a keep-alive comment every `stream_keepalive_s` while no delta comes (a long
prompt being read), one event per delta, `await self.flush()` after each. A client that goes away
aborts its requests, which frees their batch slots at the engine's next step. A stream that names
a model still loading opens at once and carries the load's progress as comments meanwhile.

A budget the engine had to clamp (or the server's cap) is reported, not refused: header
`X-MLX-Max-Tokens-Clamped: <requested>` and, in a whole body, `usage.max_tokens_clamped`
(`{"requested", "granted"}`); `X-MLX-Max-Tokens` always says the budget granted.
With `backend_url` set, these routes answer through the remote backend (`jupyter_ext.remote`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Optional

from jupyter_server.auth.decorator import authorized
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_ext.base import MLXHandler, as_api_error
from jupyter_ext.proxy import ProxyMixin
from mlx_nb.api import (
    APIError,
    count_tokens_kwargs,
    invalid_request,
    model_card,
    model_not_found,
    models_list,
    not_found,
    parse_count_tokens_request,
    sse_comment,
    sse_event,
)
from mlx_nb.api.forced_tools import enforced
from mlx_nb.api.routes import CHAT, COMPLETIONS, MESSAGES, RESPONSES, Admitted, Route, Serving, serving_for
from mlx_nb.engine import SubmitRequest, prefetch_remote_images
from mlx_nb.models.adapters import AdapterError
from mlx_nb.models.progress import describe
from mlx_nb.registry import keep_alive_seconds, split_adapter

SSE = "text/event-stream; charset=utf-8"


class PicksModels:
    """A handler that serves a model the request names: the default one, another registered
    model (loaded on demand), and a registered LoRA adapter on it (`model@adapter`)."""

    chosen = None  # the engine serving this request

    async def engine_named(self, name: Optional[str]):
        """The ready engine serving `name`: another registered model's (loaded now if it is not,
        the request waiting for it), else the default one (the default's name, an alias, or a name
        the route refuses)."""
        if not self.ext.registered(name):
            self.chosen = self.ready_engine()
            return self.chosen
        try:
            keep = keep_alive_seconds(requested_field(self.request.body, "keep_alive"))
        except ValueError as exc:
            raise invalid_request(str(exc), "keep_alive") from None
        # off the event loop: making room may close an idle model's engine (ModelUnavailable: a 503)
        engine = await asyncio.to_thread(self.ext.registry.engine_for, name)
        self.ext.registry.keep_alive(name, keep)
        await self.wait_loading(engine, name)  # this request waits for it, the other models keep serving
        self.chosen = self.ready_engine(engine, name)
        return self.chosen

    async def wait_loading(self, engine, name: str) -> None:
        while not engine.ready and engine.load_error is None and not engine.closed:
            await asyncio.sleep(0.05)

    def adapter_base(self, name: Optional[str], shown: str) -> None:
        """`name@adapter` names a model this server serves locally (else the 404 listing them)."""
        if self.ext.remote is not None:
            raise not_found("this server relays a backend: it loads no adapters of its own")
        if name and name not in self.ext.model_names():
            raise model_not_found(shown, self.ext.model_names())

    async def adapter_on(self, engine, adapter: str) -> dict:
        """A registered adapter on `engine` (read from its folder the first time): 404 for a name
        that is not registered, 400 for a folder that does not fit the model."""
        if adapter not in self.ext.registry.adapters:
            raise model_not_found(f"{engine.model_name}@{adapter}", self.ext.model_names())
        try:
            return await asyncio.to_thread(self.ext.registry.adapter_on, engine, adapter)
        except AdapterError as exc:
            raise invalid_request(str(exc), "model") from None


class ModelsHandler(ProxyMixin, MLXHandler):
    """The served model and its aliases; listed while it loads too (the list is config, not weights)."""

    @web.authenticated
    @authorized
    async def get(self):
        if self.ext.remote is not None:
            return await self.proxy_get("models")
        body = models_list(self.ext.model_names())
        engine = self.ext.engine
        registry = {m["name"]: m for m in self.ext.registry.describe()}
        for card in body["data"]:
            named = registry.get(card["id"])
            if "@" in card["id"]:  # the default model with a registered adapter
                card.update(self._adapter_card(card["id"], engine))
            elif named is None or named["pinned"]:  # the default model and its aliases
                if engine is not None and engine.loaded is not None:  # what a request that sets nothing gets
                    card["sampling_defaults"] = engine.sampling_defaults()
                card["state"] = registry.get(self.ext.model, {}).get("state", "loading")
            else:  # another registered model: loaded when a request names it
                card.update({k: v for k, v in named.items() if k not in ("name", "pinned")})
        self.write_json(body)

    def _adapter_card(self, name: str, engine) -> dict:
        adapter = name.rpartition("@")[2]
        loaded = {a["name"]: a for a in (engine.adapters() if engine is not None and engine.ready else [])}
        card = {"kind": "adapter", "adapter": adapter, "adapter_path": self.ext.registry.adapters.get(adapter),
                "state": "loaded" if adapter in loaded else "available"}
        if adapter in loaded:
            card.update({k: loaded[adapter][k] for k in ("rank", "scale", "bytes")})
        return card


class ModelHandler(PicksModels, ProxyMixin, MLXHandler):
    @web.authenticated
    @authorized
    async def get(self, name: str):
        if self.ext.remote is None and name in self.ext.embedding_model_names():  # the embeddings route's
            return self.write_json(self._embedder_card(name))
        served = [await self.ext.remote.model()] if self.ext.remote is not None else self.ext.model_names()
        self.write_json(model_card(self.ext.server_defaults().resolve_model(name, served)))

    def _embedder_card(self, name: str) -> dict:
        """An embedding model's card: its kind and state (it loads on the first embeddings request)."""
        embedder = self.ext.embedder
        ready = embedder is not None and embedder.ready
        card = {**model_card(name), "kind": "embedding", "state": "loaded" if ready else "available"}
        if ready:
            card.update(dimensions=embedder.dimensions, max_tokens=embedder.max_tokens, pooling=embedder.pooling.mode)
        return card

    @web.authenticated
    @authorized
    async def post(self, name: str):
        """Load a registered model now (before any request names it); its card with its state.
        `model@adapter` loads the model and then the adapter on it."""
        base, adapter = split_adapter(name)
        if adapter is not None:
            self.adapter_base(base, name)
            engine = await self.engine_named(base)
            described = await self.adapter_on(engine, adapter)
            return self.write_json({**model_card(name), "kind": "adapter", "state": "loaded", **described})
        self._registered(name)
        await asyncio.to_thread(self.ext.registry.engine_for, name)  # ModelUnavailable: a 503
        self.write_json(self._card(name))

    @web.authenticated
    @authorized
    async def delete(self, name: str):
        """Unload a registered model now (its running requests end as aborted); the default model is
        pinned. `model@adapter` takes the adapter off the model (refused while a request uses it)."""
        base, adapter = split_adapter(name)
        if adapter is not None:
            self.adapter_base(base, name)
            entry = self.ext.registry.entry(base) if self.ext.registered(base) else None
            engine = entry.engine if entry is not None else self.ext.engine  # never loaded to unload
            loaded = {a["name"] for a in engine.adapters()} if engine is not None else set()
            if adapter in loaded:
                await asyncio.to_thread(engine.unload_adapter, adapter)
            return self.write_json({**model_card(name), "kind": "adapter", "state": "available",
                                    "unloaded_now": adapter in loaded})
        self._registered(name)
        unloaded = await asyncio.to_thread(self.ext.registry.unload, name)
        self.write_json({**self._card(name), "unloaded_now": unloaded})

    def _registered(self, name: str) -> None:
        if self.ext.remote is not None:
            raise not_found("this server relays a backend: it loads no models of its own")
        if not self.ext.registered(name):
            if name in self.ext.model_names():
                raise APIError(400, f"{name} is the server's default model: it stays loaded", "invalid_request_error",
                               "model", "model_pinned")
            raise model_not_found(name, self.ext.model_names())

    def _card(self, name: str) -> dict:
        (described,) = [m for m in self.ext.registry.describe() if m["name"] == name]
        return {**model_card(name), **{k: v for k, v in described.items() if k not in ("name", "pinned")}}


class GenerateHandler(PicksModels, ProxyMixin, MLXHandler):
    """Runs `route` for the local engine or the remote backend; aborts its requests if the client leaves."""

    route: Route
    handles: list = []
    gone = False
    adapter = None  # the registered LoRA adapter the request names (serving() reads it from the body)
    opened = False  # the SSE stream opened while the model loaded (wait_loading)

    @property
    def anthropic(self) -> bool:
        return self.route.anthropic

    def on_connection_close(self):
        self.gone = True
        for handle in self.handles:
            if not handle.done:
                handle.abort()
        super().on_connection_close()

    def source(self) -> str:
        """Who asks, for the batch timeline: the X-MLX-Source header mlx_nb's Client sends, else the route."""
        given = self.request.headers.get("X-MLX-Source", "").strip()
        agent = self.request.headers.get("User-Agent", "").split(" ")[0]
        return (given or f"route: {agent}".rstrip(": "))[:80]

    async def serving(self) -> Serving:
        if self.ext.remote is not None:
            return await self.ext.remote.serving(self.ext.server_defaults())
        engine, name = await self.requested_engine()
        return serving_for(engine, name, self.ext.server_defaults(engine))

    async def requested_engine(self):
        """(engine, the name it serves under) for the model the body names: another registered model's
        engine (loaded now if it is not, the request waiting for it), else the default one."""
        self.chosen = self.adapter = None
        asked = requested_model(self.request.body)
        name, self.adapter = split_adapter(asked, requested_field(self.request.body, "adapter"))
        if self.adapter is not None:
            self.adapter_base(name, asked or "")
        engine = await self.engine_named(name)
        if self.adapter is not None:  # its rows decode with the adapter, in the model's batch
            await self.adapter_on(engine, self.adapter)
            return engine, asked if asked and "@" in asked else (name or engine.model_name)
        return engine, name if self.ext.registered(name) else engine.model_name

    async def wait_loading(self, engine, name: str) -> None:
        """A streamed request waiting for its model to load gets its stream at once, with the load's
        progress as SSE comments (a phase change at once, else every `stream_keepalive_s`): a
        client's read timeout does not fire during a long load, and a reader sees what it waits
        for. A mistake found after the stream opened comes as the stream's error event."""
        if requested_field(self.request.body, "stream") is not True:
            return await super().wait_loading(engine, name)
        said, beat = None, 0.0
        while not engine.ready and engine.load_error is None and not engine.closed:
            line = describe({"model": name, "load": engine.load_progress.to_dict()})
            phase = engine.load_progress.phase
            if not self.opened:
                self.opened = True
                self.set_header("Content-Type", SSE)
                self.set_header("Cache-Control", "no-cache")
                self.set_header("X-Accel-Buffering", "no")
            if phase != said or time.monotonic() >= beat:
                said, beat = phase, time.monotonic() + self.ext.stream_keepalive_s
                await self.send(sse_comment(line))
            await asyncio.sleep(0.05)

    async def submit(self, requests: list[dict]) -> list:
        """Queue every choice (off the event loop: submit templates and tokenizes); the engine admits
        a route's n choices at one step. The route's keywords become the engine's typed request
        here, named for who sent them."""
        source = self.source()
        adapter = {"adapter": self.adapter} if getattr(self, "adapter", None) else {}
        typed = [SubmitRequest.of(**kw, source=source, **adapter) for kw in requests]
        if self.ext.remote is not None:
            handles = [await self.ext.remote.submit(req) for req in typed]
        else:
            engine = self.chosen or self.ready_engine()
            if engine.loaded.kind == "vision":  # remote images are fetched on their own threads, awaited here
                for req in typed:
                    if req.messages is not None:
                        req.messages = await prefetch_remote_images(req.messages, engine.image_options)
            handles = await asyncio.to_thread(engine.submit_requests, typed)  # n choices start together
        self.handles = handles
        if self.gone:  # left while the prompt was being tokenized
            for handle in handles:
                handle.abort()
        return handles

    @web.authenticated
    @authorized
    async def post(self):
        if self.ext.remote is not None and self.route.passthrough:
            return await self.proxy_post(self.route.passthrough)
        try:
            await self.answer()
        except Exception as exc:
            if not self.opened or self._finished:
                raise
            # the stream opened while the model loaded: the status line is sent, the error is an event
            self.log_exception(type(exc), exc, exc.__traceback__)
            error = as_api_error(500, exc, "", getattr(self, "wire_fields", None))
            body = error.to_anthropic_dict() if self.anthropic else error.to_dict()
            self.finish(sse_event(body, "error" if self.anthropic else None))

    async def answer(self) -> None:
        serving = await self.serving()
        if serving.tool_format:
            self.set_header("X-MLX-Tool-Format", serving.tool_format)
        req = self.route.parse(self.request.body, serving)
        if (held := enforced(self.route.forced_tool(req), serving)) is not None:
            self.set_header("X-MLX-Tool-Choice", held)
        handles = await self.submit(self.route.engine_requests(req, serving))
        clamped = self.note_budget(self.route.requested_budget(req), handles[0])
        created = int(time.time())
        if not getattr(req, "stream", False):
            results = [await h.aresult() for h in handles]
            if self.gone:
                return
            body = self.route.response(req, results, serving, created)
            if clamped and isinstance(body.get("usage"), dict):
                body["usage"]["max_tokens_clamped"] = clamped
            return self.write_json(body)
        admitted = [Admitted(h.id, h.prompt_tokens, h.max_tokens) for h in handles]
        await self.stream(self.route.stream(req, admitted, serving, created), handles)

    def note_budget(self, requested: Optional[int], handle) -> Optional[dict]:
        granted = handle.max_tokens
        if granted is None:
            return None
        self.set_header("X-MLX-Max-Tokens", str(granted))
        if requested is None or granted >= requested:
            return None
        self.set_header("X-MLX-Max-Tokens-Clamped", str(requested))
        return {"requested": requested, "granted": granted}

    async def stream(self, stream, handles: list) -> None:
        if not self.opened:
            self.set_header("Content-Type", SSE)
            self.set_header("Cache-Control", "no-cache")
            self.set_header("X-Accel-Buffering", "no")  # nginx and friends: do not buffer the stream
        deltas: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, handle) -> None:
            async for delta in handle:
                deltas.put_nowait((index, delta))

        pumps = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
        keepalive = self.ext.stream_keepalive_s
        running = len(handles)
        try:
            self.write(stream.start())
            await self.flush()  # the headers (and any opening event) leave now, before the prompt is read
            while running:
                try:
                    index, delta = await asyncio.wait_for(deltas.get(), keepalive)
                except asyncio.TimeoutError:  # the prompt is still being read: show the line is alive
                    await self.send(sse_comment("keep-alive"))
                    continue
                running -= delta.finish_reason is not None
                await self.send(stream.feed(index, delta))
            await self.send(stream.close())
        except StreamClosedError:
            return  # the client left; tornado finishes the (closed) response
        finally:
            for task in pumps:
                task.cancel()
            for handle in handles:  # any early exit frees the batch slots
                if not handle.done:
                    handle.abort()
        self.finish(set_content_type=SSE)

    async def send(self, data: bytes) -> None:
        if data and not self.gone:
            self.write(data)
            await self.flush()


def requested_field(body: bytes, field: str):
    """A top-level field of a request body, or None (the route's parser says what is wrong with a bad body)."""
    try:
        return json.loads(body).get(field)
    except (ValueError, AttributeError, TypeError, RecursionError):
        return None


def requested_model(body: bytes) -> Optional[str]:
    """The `model` a request body names, or None."""
    name = requested_field(body, "model")
    return name if isinstance(name, str) else None


class ChatHandler(GenerateHandler):
    route = CHAT


class CompletionsHandler(GenerateHandler):
    route = COMPLETIONS


class MessagesHandler(GenerateHandler):
    route = MESSAGES


class ResponsesHandler(GenerateHandler):
    route = RESPONSES
    wire_fields = {"messages": "input", "prompt": "input"}  # errors name the Responses API's own fields


class CountTokensHandler(ProxyMixin, MLXHandler):
    """Anthropic's `messages/count_tokens`: the prompt's tokens exactly as `messages` would queue them."""

    anthropic = True

    @web.authenticated
    @authorized
    async def post(self):
        if self.ext.remote is not None:  # only a backend that counts (another `jupyter mlx`) can
            return await self.proxy_post("messages/count_tokens")
        engine = self.ready_engine()
        req = parse_count_tokens_request(self.request.body, model_names=[engine.model_name],
                                         defaults=self.ext.server_defaults())
        count = await asyncio.to_thread(engine.count_tokens, **count_tokens_kwargs(req))
        self.write_json({"input_tokens": count})


class TokensHandler(MLXHandler):
    """llama-server's tokenizer routes: `tokenize`, `detokenize`, `apply-template` (api/tokens.py)."""

    @web.authenticated
    @authorized
    async def post(self, which: str):
        from mlx_nb.api import tokens

        parse, body = {"tokenize": (tokens.TokenizeRequest, tokens.tokenize_body),
                       "detokenize": (tokens.DetokenizeRequest, tokens.detokenize_body),
                       "apply-template": (tokens.ApplyTemplateRequest, tokens.apply_template_body)}[which]
        engine = self.ready_engine()
        req = tokens.parse(parse, self.request.body)
        self.write_json(await asyncio.to_thread(body, req, engine))
