"""The observing routes: status, cache layout, batch events (SSE or JSON), the batch timeline and a
request's cache as pictures (`batch.svg`, `cache.svg`: the Lab's sidebar), health, and JSON 404s.

With `backend_url` set they show what the backend exposes (`jupyter_ext.proxy`) and say plainly
what it does not. Engine calls that wait for the engine thread (`status`, `cache_layout`: up to one batch step) run
in a worker thread so the server's event loop never blocks on MLX.
"""

from __future__ import annotations

import asyncio

from jupyter_server.auth.decorator import allow_unauthenticated, authorized
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_ext.base import RETRY_AFTER_S, MLXHandler
from jupyter_ext.proxy import ProxyMixin, remote_status
from mlx_nb.api import invalid_request, not_found, sse_comment, sse_event
from mlx_nb.engine import RequestError

KEEPALIVE_S = 15.0  # a comment this often keeps proxies from closing an idle stream
MAX_BACKLOG = 1000  # events queued for one slow reader before it falls back to the event log
RESYNC = object()


class StatusHandler(MLXHandler):
    """Engine and per-request status; answers while the model loads (`loading: true`)."""

    @web.authenticated
    @authorized
    async def get(self):
        if self.ext.remote is not None:
            return self.write_json(await remote_status(self.ext.remote))
        status = await asyncio.to_thread(self.engine().status)
        status["registry"] = self.ext.registry.status()  # every model this server may serve, and its state
        self.write_json(status)


class CacheHandler(ProxyMixin, MLXHandler):
    """The KV-cache layout: of a fresh cache, or of a live request's with `?request_id=ID`
    (`?request=ID` too, as earlier clients sent it); an id that is not live is a 404. DELETE empties
    the prefix cache (the Lab's "clear the prefix cache" command; `?disk=1`: its files too) and says
    what it held. POST `?action=save` writes the prefix cache to its folder now, `?action=load` reads
    the folder into memory; both answer the prefix cache's status."""

    @web.authenticated
    @authorized
    async def delete(self):
        engine = self._own_engine()
        disk = self.get_argument("disk", "0").lower() in ("1", "true", "yes")
        self.write_json(await asyncio.to_thread(engine.clear_prefix_cache, disk))

    @web.authenticated
    @authorized
    async def post(self):
        engine = self._own_engine()
        action = self.get_argument("action", "")
        if action not in ("save", "load"):
            raise invalid_request(f"action must be save or load, not {action!r}", "action")
        act = engine.save_prefix_cache if action == "save" else engine.load_prefix_cache
        try:
            self.write_json(await asyncio.to_thread(act))
        except RequestError as exc:
            raise invalid_request(str(exc), "action") from None

    def _own_engine(self):
        if self.ext.remote is not None:
            raise not_found("this server relays a backend: its prefix cache is the backend's")
        return self.ready_engine()

    @web.authenticated
    @authorized
    async def get(self):
        request_id = self.get_argument("request_id", None) or self.get_argument("request", None) or None
        if self.ext.remote is not None:
            return await self.proxy_get("cache", {"request_id": request_id} if request_id else None, "cache layout")
        engine = self.ready_engine()
        try:
            self.write_json(await asyncio.to_thread(engine.cache_layout, request_id))
        except KeyError as exc:
            raise not_found(str(exc.args[0]) if exc.args else f"no live request {request_id!r}") from None


class EventsHandler(ProxyMixin, MLXHandler):
    """BatchEvents after `?since=N` (or `Last-Event-ID`) of the default model's batch (`?model=NAME`:
    another loaded model's): a live SSE stream, or with `?stream=0` the recorded ones as a JSON list. Each SSE event carries `id: <seq>` so a reconnecting
    EventSource resumes where it stopped."""

    queue = None

    @web.authenticated
    @authorized
    async def get(self):
        since = self._since()
        if self.ext.remote is not None:
            params = {"since": since, "stream": self.get_argument("stream", "1")}
            return await self.proxy_get("events", params, "batch events")
        engine = self._model_engine()
        if self.get_argument("stream", "1").lower() in ("0", "false", "no"):
            self.write_json(engine.events(since))
            return
        await self._stream(engine, since)

    def _model_engine(self):
        """The engine of `?model=NAME` (a loaded model: each has its own batch), else the default one."""
        name = self.get_argument("model", None)
        if name is None:
            return self.engine()
        loaded = dict(self.ext.loaded_engines())
        if name not in loaded:
            raise not_found(f"model {name} is not loaded here (loaded: {', '.join(loaded) or 'none'})")
        return loaded[name]

    def _since(self) -> int:
        raw = self.get_argument("since", None) or self.request.headers.get("Last-Event-ID") or "0"
        if not raw.isdigit():
            raise invalid_request(f"since must be a non-negative integer, not {raw!r}", "since")
        return int(raw)

    def _offer(self, event) -> None:
        """On the loop: queue one event. A reader that lags too far gets its queue swapped for one
        RESYNC marker and re-reads the engine's own event log, so memory stays bounded."""
        if self.queue.qsize() >= MAX_BACKLOG:
            held = [self.queue.get_nowait() for _ in range(self.queue.qsize())]
            self.queue.put_nowait(RESYNC)
            if None in held:  # keep a pending "stop"
                self.queue.put_nowait(None)
        else:
            self.queue.put_nowait(event.to_dict())

    async def _stream(self, engine, since: int) -> None:
        loop = asyncio.get_running_loop()
        self.queue = asyncio.Queue()
        # Subscribe before replaying, so nothing falls between the two; duplicates are skipped by seq.
        unsubscribe = engine.subscribe(lambda event: loop.call_soon_threadsafe(self._offer, event))
        self.ext.event_queues.add(self.queue)
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")
        try:
            self.write(sse_comment("mlx batch events"))
            last = self._replay(engine, since)
            await self.flush()
            while True:
                try:
                    event = await asyncio.wait_for(self.queue.get(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    self.write(sse_comment("keep-alive"))
                    await self.flush()
                    continue
                if event is None:  # the client left or the server is stopping
                    break
                if event is RESYNC:
                    last = self._replay(engine, last)
                elif event["seq"] > last:
                    last = self._send(event)
                await self.flush()
        except StreamClosedError:
            return
        finally:
            unsubscribe()
            self.ext.event_queues.discard(self.queue)
        self.finish(set_content_type="text/event-stream; charset=utf-8")

    def _replay(self, engine, last: int) -> int:
        """Write the recorded events after `last`; say so if the log no longer holds some."""
        events = engine.events(last)
        if events and events[0]["seq"] > last + 1 and last:
            self.write(sse_comment(f"{events[0]['seq'] - last - 1} events were dropped: the reader fell behind"))
        for event in events:
            last = self._send(event)
        return last

    def _send(self, event: dict) -> int:
        self.write(f"id: {event['seq']}\n".encode() + sse_event(event))
        return event["seq"]

    def on_connection_close(self):
        if self.queue is not None:
            self.queue.put_nowait(None)
        super().on_connection_close()


class BatchPictureHandler(MLXHandler):
    """`batch.svg`: the batch timeline the BatchVisualizer widget draws, from the same events (the
    engine's recent ones), for the Lab's sidebar; with several models loaded, one timeline per model
    (each has its own batch), the default model's first. `?lanes=N` keeps the last N requests (default 12);
    `?width=PX` draws it for that width (default 760; narrow widths put names above the lanes)."""

    @web.authenticated
    @authorized
    async def get(self):
        from mlx_nb.pictures.batch import build_models_batch_svg

        lanes = whole_argument(self, "lanes", "12", 1, 200)
        width = picture_width_argument(self)
        if self.ext.remote is not None:
            raise not_found("this server relays a backend: its batch is the backend's")
        self.engine()  # the default model's engine, started on first use
        by_model = {name: engine.events(0) for name, engine in self.ext.loaded_engines()}
        self.set_header("Cache-Control", "no-store")
        self.finish(build_models_batch_svg(by_model, max_lanes=lanes, width=width),
                    set_content_type="image/svg+xml; charset=utf-8")


def whole_argument(handler, name: str, default: str, low: int, high: int) -> int:
    """A query argument that must be a whole number in low..high (else a 400 saying so)."""
    raw = handler.get_argument(name, default)
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise invalid_request(f"{name} must be a whole number from {low} to {high}, not {raw!r}", name)
    return int(raw)


def picture_width_argument(handler) -> int:
    """`?width=PX`: the width to draw a picture for (the Lab's sidebar sends its own)."""
    from mlx_nb.pictures.theme import MAX_WIDTH, MIN_WIDTH, WIDTH

    return whole_argument(handler, "width", str(WIDTH), MIN_WIDTH, MAX_WIDTH)


class CachePictureHandler(MLXHandler):
    """`cache.svg?request_id=ID`: a live request's cache as the CacheInspector widget draws it (rows x
    positions per layer type, then bytes per layer), from the same layout; without an id, a fresh
    cache. An id that is not live is a 404. `?width=PX` as for `batch.svg`."""

    @web.authenticated
    @authorized
    async def get(self):
        from mlx_nb.pictures.cache import build_cache_svg

        if self.ext.remote is not None:
            raise not_found("this server relays a backend: its caches are the backend's")
        request_id = self.get_argument("request_id", None) or None
        width = picture_width_argument(self)
        engine = self.ready_engine()
        try:
            layout = await asyncio.to_thread(engine.cache_layout, request_id)
        except KeyError as exc:
            raise not_found(str(exc.args[0]) if exc.args else f"no live request {request_id!r}") from None
        self.set_header("Cache-Control", "no-store")
        self.finish(build_cache_svg(layout, width=width), set_content_type="image/svg+xml; charset=utf-8")


class HealthHandler(MLXHandler):
    """Readiness: 200 `ok` (or `idle` before a lazy load), 503 `loading` / `error`.

    Unauthenticated on purpose, like Jupyter's own `GET /api`: readiness probes (container
    health checks, scripts waiting for a server they just started) often cannot hold the token,
    and the body reveals one word — no model name, no paths, no error text.
    """

    @allow_unauthenticated
    async def get(self):
        engine = self.ext.engine
        if self.ext.remote is not None:  # asked each time: the backend may have gone since
            try:
                reachable = (await self.ext.remote.get("models")).status_code < 500
            except Exception:
                reachable = False
            status, code = ("ok", 200) if reachable else ("error", 503)
        elif engine is None:
            status, code = "idle", 200
        elif engine.ready:
            status, code = "ok", 200
        elif engine.load_error is not None:
            status, code = "error", 503
        else:
            status, code = "loading", 503
            self.set_header("Retry-After", str(RETRY_AFTER_S))
        self.set_status(code)
        self.write_json({"status": status})


class BaseURLHandler(MLXHandler):
    """`mlx` itself, the base URL Claude Code is given: it sends `HEAD <base>` to see the server is
    up. A one-word 200 without auth, like health (else Jupyter redirects it to a login page, and a
    HEAD to the login page redirects again, without end)."""

    @allow_unauthenticated
    async def get(self):
        self.write_json({"status": "ok"})

    @allow_unauthenticated
    async def head(self):
        self.set_header("Content-Type", "application/json")
        self.finish()


class NotFoundHandler(MLXHandler):
    """Any other path under `mlx/v1`: a JSON 404 (after auth, so it reveals nothing), in the shape of
    the API the path belongs to, with the base URL its clients need when they doubled a `/v1`
    (Claude Code given `.../mlx/v1` asks for `.../mlx/v1/v1/messages`)."""

    def prepare(self):
        self.anthropic = "/messages" in self.request.path  # Anthropic's error shape for its paths
        return super().prepare()

    def _missing(self, *args):
        path = self.request.path
        message = f"no route {self.request.method} {path}"
        if "/mlx/v1/v1/" in path:
            base = path.split("/mlx/v1/v1/")[0] + "/mlx"
            message += f": set the client's base URL to {base} (it adds /v1 itself)"
        raise not_found(message)

    get = web.authenticated(authorized(_missing))
    post = web.authenticated(authorized(_missing))
    put = web.authenticated(authorized(_missing))
    patch = web.authenticated(authorized(_missing))
    delete = web.authenticated(authorized(_missing))
