"""Fronting a remote OpenAI-compatible server (`MLXExtension.backend_url`) instead of the local engine.

vLLM on a cluster, mlx_lm's (distributed) server, llama.cpp's server, exo, or another `jupyter mlx`:
every notebook of this Jupyter server then shares that engine through the same `mlx/v1` routes,
Jupyter auth, magics and widgets. How each route gets there:
- chat/completions, completions, models: proxied as they are (bytes streamed through), the model
  name mapped to the backend's (aliases / any name, as for the local engine);
- messages and responses: translated to a chat request by the same wire layer the local engine
  uses: `RemoteEngine.submit` turns the backend's chat stream into engine Deltas (its structured
  tool calls become the canonical `<tool_call>` markup the translators parse), so Anthropic and
  Responses clients work with any backend;
  the prompt's size is known only from the backend's final usage, so `message_start` reports 0
  input tokens there and `message_delta` the real count;
- status, cache, events, count_tokens: whatever the backend exposes (its `/v1/status`, `/metrics`,
  `/slots`, events and cache routes), and a plain statement of what it does not.

httpx (a dependency of jupyterlab and the openai SDK) is the client: it streams and cancels.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any, Optional

import httpx

from mlx_nb.api import DEFAULT_MARKERS, APIError
from mlx_nb.api.constraint_fields import wire_fields
from mlx_nb.api.routes import Serving
from mlx_nb.engine import Delta, RequestHandle, SamplingParams, SubmitRequest, Usage

UNNAMED = "default_model"  # what mlx_lm.server calls the model it was started with
_FINISH = {"stop": "stop", "length": "length", "tool_calls": "stop", "function_call": "stop"}
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
             "repetition_penalty", "logit_bias")


class RemoteEngine:
    """The backend at `url` (…/v1), spoken to with `api_key` as a Bearer token."""

    def __init__(self, url: str, api_key: str = "", model: str = ""):
        self.url = url.rstrip("/")
        self.root = self.url.removesuffix("/v1")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.configured_model = model
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), trust_env=False)
        self._listed: Optional[list[str]] = None
        self._ids = itertools.count(1)

    # -- what the backend serves ---------------------------------------------------------------
    async def models(self) -> list[str]:
        """The names the backend lists (cached once it answers); [] if it lists none."""
        if self._listed is None:
            r = await self.get("models")  # raises (502) while the backend cannot be reached
            try:
                body = r.json() if r.status_code == 200 else {}
            except ValueError:  # mlx_lm.server answers 200 with no body when it finds no hub cache
                body = {}
            data = body.get("data") if isinstance(body, dict) else None
            self._listed = [m["id"] for m in data or [] if isinstance(m, dict) and "id" in m]
        return self._listed

    async def model(self) -> str:
        if self.configured_model:
            return self.configured_model
        listed = await self.models()
        return listed[0] if listed else UNNAMED

    async def serving(self, defaults) -> Serving:
        return Serving(await self.model(), defaults, None, DEFAULT_MARKERS)

    async def get(self, path: str, params: Optional[dict] = None, root: bool = False) -> httpx.Response:
        """GET `{url}/{path}` (or `{root}/{path}`); a backend that cannot be reached is a 502."""
        try:
            return await self.client.get(f"{self.root if root else self.url}/{path}", params=params,
                                         headers=self.headers)
        except httpx.HTTPError as exc:
            raise unreachable(self.url, exc) from None

    async def open(self, method: str, path: str, body: Any = None, params: Optional[dict] = None) -> httpx.Response:
        """Start a request and return once its headers are in (the body is read by the caller)."""
        request = self.client.build_request(method, f"{self.url}/{path}", json=body, params=params,
                                            headers={**self.headers, "Accept": "application/json, text/event-stream"})
        try:
            return await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise unreachable(self.url, exc) from None

    # -- the engine face, for routes translated to chat ----------------------------------------
    async def submit(self, req: SubmitRequest) -> RequestHandle:
        """Like `Engine.submit_request`, over the backend's streaming chat (or completions) route."""
        chat = req.messages is not None
        body: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}}
        model = await self.model()
        if model != UNNAMED:
            body["model"] = model
        if chat:
            body["messages"] = [_wire_message(m) for m in req.messages]
        else:
            body["prompt"] = req.prompt
        sampling = req.sampling
        if sampling.max_tokens is not None:
            body["max_tokens"] = sampling.max_tokens
        unset = SamplingParams()  # what the request left at the engine's defaults is not sent, temperature aside
        body.update({k: getattr(sampling, k) for k in _SAMPLING
                     if k == "temperature" or getattr(sampling, k) != getattr(unset, k)})
        if sampling.stop:
            body["stop"] = sampling.stop
        if req.tools:
            body["tools"] = req.tools
        if req.constraint is not None:  # the backend enforces it, if it can
            body.update(wire_fields(req.constraint))
        for key in ("chat_template_kwargs", "reasoning_budget"):  # a thinking model's switches, as llama-server takes them
            if getattr(req, key) not in (None, {}):
                body[key] = getattr(req, key)
        resp = await self.open("POST", "chat/completions" if chat else "completions", body)
        if resp.status_code >= 400:
            raise await backend_error(resp, self.url)
        task: Optional[asyncio.Task] = None
        handle = RequestHandle(f"remote-{next(self._ids)}", lambda _id: task.cancel())
        task = asyncio.ensure_future(_relay(resp, handle))
        return handle

    async def close(self) -> None:
        await self.client.aclose()


async def _relay(resp: httpx.Response, handle: RequestHandle) -> None:
    """Backend chunks -> Deltas on `handle`; tool calls are emitted as markup when the reply ends."""
    calls: dict[int, dict] = {}
    finish, usage = None, None
    try:
        async for data in sse_data(resp):
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                err = chunk["error"]
                handle.push(Delta(handle.id, finish_reason="error",
                                  error=err.get("message", str(err)) if isinstance(err, dict) else str(err)))
                return
            if chunk.get("usage"):
                u = chunk["usage"]
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                usage = Usage(u.get("prompt_tokens", 0), u.get("completion_tokens", 0), cached)
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                text = delta.get("content") if "delta" in choice else choice.get("text")
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")  # vLLM's and llama-server's
                if text or reasoning:
                    handle.push(Delta(handle.id, text=text or "", reasoning=reasoning or ""))
                for tc in delta.get("tool_calls") or []:
                    call = calls.setdefault(tc.get("index", len(calls)), {"name": "", "arguments": ""})
                    fn = tc.get("function") or {}
                    call["name"] += fn.get("name") or ""
                    call["arguments"] += fn.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
        markup = "".join(_as_markup(c) for _, c in sorted(calls.items()))
        handle.push(Delta(handle.id, text=markup, finish_reason=_FINISH.get(finish, "stop"), usage=usage))
    except asyncio.CancelledError:
        handle.push(Delta(handle.id, finish_reason="abort", usage=usage))
    except (httpx.HTTPError, ValueError) as exc:
        handle.push(Delta(handle.id, finish_reason="error", error=f"the backend stream broke: {exc}"))
    finally:
        await resp.aclose()  # a cancelled relay closes the connection: the backend drops the request


async def sse_data(resp: httpx.Response):
    """The `data:` payloads of an SSE response, one per event."""
    lines: list[str] = []
    async for line in resp.aiter_lines():
        if line.startswith("data:"):
            lines.append(line[5:].strip())
        elif not line and lines:
            yield "\n".join(lines)
            lines = []
    if lines:
        yield "\n".join(lines)


def _as_markup(call: dict) -> str:
    start, end = DEFAULT_MARKERS
    try:
        args = json.loads(call["arguments"]) if call["arguments"].strip() else {}
    except json.JSONDecodeError:
        args = call["arguments"]
    return start + json.dumps({"name": call["name"], "arguments": args}, ensure_ascii=False) + end


def _wire_message(m: dict) -> dict:
    """Engine-format messages on the OpenAI wire: tool-call arguments back to JSON strings."""
    if not m.get("tool_calls"):
        return m
    calls = []
    for c in m["tool_calls"]:
        fn = dict(c["function"])
        if not isinstance(fn.get("arguments"), str):
            fn["arguments"] = json.dumps(fn.get("arguments") or {}, ensure_ascii=False)
        calls.append({**c, "function": fn})
    return {**m, "tool_calls": calls}


def unreachable(url: str, exc: Exception) -> APIError:
    return APIError(502, f"the backend at {url} cannot be reached ({type(exc).__name__}: {exc})", "server_error",
                    None, "backend_unreachable")


async def backend_error(resp: httpx.Response, url: str) -> APIError:
    """The backend's refusal as ours: its 4xx stay the client's mistake, its 5xx become 502."""
    raw = (await resp.aread()).decode("utf-8", "replace")
    await resp.aclose()
    try:
        body = json.loads(raw)
        err = body.get("error", body)
        message = err.get("message", raw) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        message = raw
    message = " ".join(str(message).split())[:500] or f"HTTP {resp.status_code}"
    status = resp.status_code if resp.status_code < 500 else 502
    return APIError(status, f"the backend at {url} answered {resp.status_code}: {message}",
                    "invalid_request_error" if status < 500 else "server_error")


class RemoteTarget:
    """Where a job's rows go when this server fronts a backend (mlx_nb/jobs/rows.py's Target): a
    RemoteEngine of the jobs' own event loop (an httpx client belongs to the loop it was made on),
    each row a chat or completion request to the backend, as a relayed Anthropic request is."""

    def __init__(self, url: str, api_key: str, model: str, defaults):
        self.args = (url, api_key, model)
        self.defaults = defaults
        self.remote: Optional[RemoteEngine] = None

    async def open(self, model: Optional[str]):
        if self.remote is None:
            self.remote = RemoteEngine(*self.args)
        return self.remote, await self.remote.serving(self.defaults()), None

    async def submit(self, engine: RemoteEngine, requests: list) -> list:
        return [await engine.submit(req) for req in requests]

    async def embedder(self, model: Optional[str]):
        raise LookupError("embeddings lines are not relayed to the backend: send the batch to the backend's own "
                          "/v1/batches")
