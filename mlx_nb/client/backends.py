"""The two things a Client can talk to: shared in-process Engines, or an OpenAI-compatible URL.

Each backend `open`s a request for a stream (sync) or `aopen`s it (async) and yields
(text, finish_reason, usage, error) pieces; the stream classes do the rest.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Optional

from mlx_nb.client.streams import (
    AsyncChatStream,
    ChatStream,
    ClientError,
    MlxConnectionError,
    _Stream,
    _usage,
)
from mlx_nb.client.content import request_source
from mlx_nb.client.waiting import LoadWait, ModelLoadingError, wait_embedded

# -- shared embedded engines ----------------------------------------------------------------
_ENGINES: dict[str, Any] = {}
_ENGINES_LOCK = threading.Lock()


def shared_engine(model: str):
    """The process-wide embedded Engine for `model`, started (not awaited) on first use. Its prefix
    cache is also kept where a server's is (engine/prefix_disk.default_folder): a restarted kernel
    skips the prompts it read before."""
    from mlx_nb.engine import Engine
    from mlx_nb.engine import default_prefix_folder as default_folder

    with _ENGINES_LOCK:
        eng = _ENGINES.get(model)
        if eng is None or eng.load_error is not None or eng.closed:
            eng = _ENGINES[model] = Engine(model, prefix_cache_dir=default_folder() or None)
        return eng


def close_engines() -> None:
    """Close every shared embedded engine (tests, or to free memory)."""
    with _ENGINES_LOCK:
        engines = list(_ENGINES.values())
        _ENGINES.clear()
    for eng in engines:
        eng.close()


def _engine_request(messages: list, params: dict, adapter: Optional[str] = None):
    """The Client's parameters as the engine's request: an OpenAI `response_format` becomes its
    `Constraint` here, as a route reads it (mlx_nb.api.constraint_fields)."""
    from mlx_nb.api.constraint_fields import constraint_of
    from mlx_nb.engine import SubmitRequest

    given = dict(params)
    constraint = constraint_of(response_format=given.pop("response_format", None))
    return SubmitRequest.of(messages=messages, constraint=constraint, adapter=adapter, **given)


def adapter_name(spec: str) -> str:
    """What an embedded engine calls the adapter `base@spec` names: a folder's own name, else `spec`."""
    from pathlib import Path

    from mlx_nb.models.adapters import is_adapter_dir

    path = Path(spec).expanduser()
    return path.name if is_adapter_dir(path) else spec


class _Embedded:
    """Shared engines by model name, or one given Engine (`Client(engine=eng)`)."""

    name = "embedded"

    def __init__(self, engine: Any = None):
        self.fixed = engine

    def default_model(self) -> str:
        from mlx_nb.models.sources import DEFAULT_MODEL

        return self.fixed.model_name if self.fixed is not None else DEFAULT_MODEL

    def engine(self, model: Optional[str]):
        """The engine of `model` (of its base model for `model@adapter`: an adapter rides in its batch)."""
        from mlx_nb.registry import split_adapter

        model = split_adapter(model)[0]
        if self.fixed is None:
            return shared_engine(model or self.default_model())
        if model not in (None, self.fixed.model_name):
            raise ClientError(f"this client is bound to an Engine serving {self.fixed.model_name}, not {model}")
        return self.fixed

    def adapter(self, eng, model: Optional[str]) -> Optional[str]:
        """The LoRA adapter `model` names, `base@folder` (read into the ready `eng` the first time,
        named by the folder) or `base@name` (one already loaded on it); None without one."""
        from pathlib import Path

        from mlx_nb.client.training import trained_adapter
        from mlx_nb.models.adapters import is_adapter_dir
        from mlx_nb.registry import split_adapter

        spec = split_adapter(model)[1]
        if spec is None:
            return None
        name = adapter_name(spec)
        with _ENGINES_LOCK:  # two chats naming it at once read it once
            if name not in {a["name"] for a in eng.adapters()}:
                folder = spec if is_adapter_dir(Path(spec).expanduser()) else trained_adapter(spec, eng.model_name)
                if folder is None:  # a name: it had to be loaded already, or be one of our fine-tunes
                    raise ClientError(f"{spec} is neither an adapter loaded on {eng.model_name}, an mlx_lm adapter "
                                      "folder (adapter_config.json + adapters.safetensors) nor a fine-tune of "
                                      "this data home: name its folder, or see client.training_jobs()")
                eng.load_adapter(name, folder)
        return name

    def open(self, st: ChatStream, messages: list, params: dict, wait: LoadWait):
        eng = self.engine(st.model)
        if not eng.ready:
            wait_embedded(eng, wait)
            st._restart_clock()
        handle = eng.submit_request(_engine_request(messages, params, self.adapter(eng, st.model)))
        st._opened(handle.id, handle.abort, drains=True)
        return ((d.text, d.finish_reason, _usage(d.usage), d.error, d.reasoning) for d in handle)

    async def aopen(self, st: AsyncChatStream, messages: list, params: dict, wait: LoadWait):
        st.model = st.model or self.default_model()
        eng = self.engine(st.model)
        if not eng.ready:
            await asyncio.to_thread(wait_embedded, eng, wait)
            st._restart_clock()
        # submit templates, tokenizes and decodes images: off the event loop
        adapter = await asyncio.to_thread(self.adapter, eng, st.model)
        handle = await asyncio.to_thread(eng.submit_request, _engine_request(messages, params, adapter))
        st._opened(handle.id, handle.abort, drains=True)
        async for d in handle:
            yield d.text, d.finish_reason, _usage(d.usage), d.error, d.reasoning


@contextmanager
def _translated(url: str):
    """openai / httpx failures -> one readable line naming the URL."""
    import httpx
    import openai

    try:
        yield
    except (openai.APIConnectionError, httpx.TransportError) as exc:
        cause = exc.__cause__ or exc
        raise MlxConnectionError(
            f"cannot reach {url} ({cause}): is Jupyter running with mlx_nb? check MLX_NB_URL or %mlx connect"
        ) from None
    except openai.APIStatusError as exc:
        raise _status_error(url, exc.status_code, exc.body, exc.response.headers) from None
    except openai.APIError as exc:
        raise ClientError(_error_text(exc.body) or exc.message) from None


def _status_error(url: str, status: int, body, headers) -> ClientError:
    """An error status -> ModelLoadingError (503 `model_loading`, with its Retry-After) or ClientError."""
    inner = body.get("error", body) if isinstance(body, dict) else None
    text = _error_text(body) or f"HTTP {status}"
    if status == 503 and isinstance(inner, dict) and inner.get("code") == "model_loading":
        try:
            retry = float(headers.get("retry-after") or 2.0)
        except ValueError:
            retry = 2.0
        return ModelLoadingError(f"{url}: {text}", retry_after=min(max(retry, 0.1), 30.0))
    return ClientError(f"{url} answered {status}: {text}", status=status)


def _error_text(body: Any) -> str:
    if isinstance(body, dict):
        inner = body.get("error", body)
        return str(inner.get("message", inner)) if isinstance(inner, dict) else str(inner)
    return str(body or "")


class _Remote:
    def __init__(self, url: str, api_key: Optional[str]):
        self.name, self.url, self.api_key = url, url, api_key
        self._sync = None
        self._async: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # one per event loop
        self._models: Optional[list[str]] = None

    def _kwargs(self) -> dict:
        import openai

        # openai.Timeout is the Timeout of the HTTP library this SDK runs on (httpx, or its fork
        # httpx2 from openai 3 on): each SDK rejects the other library's objects
        return dict(base_url=self.url, api_key=self.api_key or "none", max_retries=0,
                    timeout=openai.Timeout(600.0, connect=5.0), default_headers={"X-MLX-Source": request_source()})

    @property
    def sync(self):
        if self._sync is None:
            import openai

            self._sync = openai.OpenAI(**self._kwargs())
        return self._sync

    def asyncclient(self):
        import openai

        loop = asyncio.get_running_loop()
        if loop not in self._async:
            self._async[loop] = openai.AsyncOpenAI(**self._kwargs())
        return self._async[loop]

    def default_model(self) -> str:
        if self._models is None:
            self._models = self.models()
        return self._models[0] if self._models else "default"

    def models(self) -> list[str]:
        with _translated(self.url):
            return [m.id for m in self.sync.models.list()]

    @property
    def headers(self) -> dict:
        return {"Authorization": f"token {self.api_key}"} if self.api_key else {}

    def get(self, path: str, **params) -> Any:
        return self.send("GET", path, **params)

    def send(self, method: str, path: str, timeout: float = 10.0, **params) -> Any:
        """A route's JSON answer; an error status raises the ClientError that says what to do."""
        import httpx

        with _translated(self.url):
            r = httpx.request(method, f"{self.url}/{path}", params={k: v for k, v in params.items() if v is not None},
                              headers=self.headers, timeout=httpx.Timeout(timeout, connect=5.0))
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = r.text[:200]
            raise _status_error(f"{self.url}/{path}", r.status_code, body, r.headers)
        return r.json()

    def subscribe(self, callback, since: int, on_state=None) -> Callable[[], None]:
        """Read the `events` SSE route on a thread: `callback(event)` for each event after `since`."""
        from mlx_nb.client.event_stream import EventStream

        return EventStream(f"{self.url}/events", self.headers, since, callback, on_state).close

    @staticmethod
    def _request(st: _Stream, messages: list, params: dict) -> dict:
        extra = {k: params[k] for k in ("top_p", "stop", "seed", "response_format") if params.get(k) is not None}
        body = {k: params[k] for k in ("chat_template_kwargs", "reasoning_budget") if params.get(k) is not None}
        if body:  # fields the openai SDK does not name: the server reads them from the body
            extra["extra_body"] = body
        return dict(model=st.model, messages=messages, stream=True, stream_options={"include_usage": True},
                    max_tokens=params["max_tokens"], temperature=params["temperature"], **extra)

    @staticmethod
    def _piece(st: _Stream, chunk) -> tuple:
        if st.request_id is None and getattr(chunk, "id", None):
            st._set_id(chunk.id.removeprefix("chatcmpl-"))  # the engine's id, as events and status name it
        choice = chunk.choices[0] if chunk.choices else None
        delta = choice.delta if choice is not None else None
        text = (delta.content or "") if delta is not None else ""
        reasoning = (getattr(delta, "reasoning_content", None) or "") if delta is not None else ""
        return text, choice.finish_reason if choice is not None else None, _usage(chunk.usage), None, reasoning

    def load_status(self) -> dict:
        """The status route's answer (it answers while the model loads), or what little we know."""
        try:
            return self.get("status")
        except ClientError:
            return {}

    def open(self, st: ChatStream, messages: list, params: dict, wait: LoadWait):
        request = self._request(st, messages, params)
        while True:
            try:
                with _translated(self.url):
                    resp = self.sync.chat.completions.create(**request)
                break
            except ModelLoadingError as exc:  # wait, saying what the load does, then ask again
                wait.round(self.load_status() or {"model": st.model})
                time.sleep(exc.retry_after)
                st._restart_clock()
        wait.finish()
        st._opened(None, resp.close)  # closing the stream makes the server abort the request
        return self._chunks(st, resp)

    def _chunks(self, st: ChatStream, resp):
        try:
            with _translated(self.url):
                for chunk in resp:
                    yield self._piece(st, chunk)
        finally:
            resp.close()

    async def aopen(self, st: AsyncChatStream, messages: list, params: dict, wait: LoadWait):
        with _translated(self.url):
            st.model = st.model or await asyncio.to_thread(self.default_model)
        request = self._request(st, messages, params)
        while True:
            try:
                with _translated(self.url):
                    resp = await self.asyncclient().chat.completions.create(**request)
                break
            except ModelLoadingError as exc:
                wait.round(await asyncio.to_thread(self.load_status) or {"model": st.model})
                await asyncio.sleep(exc.retry_after)
                st._restart_clock()
        wait.finish()
        st._opened(None, lambda: None)  # the reader sees `aborted` at the next chunk and closes
        try:
            with _translated(self.url):
                async for chunk in resp:
                    yield self._piece(st, chunk)
        finally:
            await resp.close()
