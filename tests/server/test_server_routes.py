"""Every `mlx/v1` route through a real in-process Jupyter server (pytest-jupyter) on a tiny model.

The base URL is pytest-jupyter's `/a%40b/`, which catches bad URL joins; the server runs with
`allow_unauthenticated_access = False`, and `jp_fetch` sends the token unless told otherwise.
"""

import asyncio
import json
import os
from pathlib import Path

import pytest
from jupyter_server.auth import Authorizer
from server_helpers import HELLO, MODEL, body, server_config, sse_events
from tornado.httpclient import HTTPClientError


async def fetch_error(jp_fetch, *parts, **kwargs) -> HTTPClientError:
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch(*parts, **kwargs)
    return info.value


def error_body(err: HTTPClientError) -> dict:
    return json.loads(err.response.body)


async def test_models(jp_fetch, mlx_ready):
    mlx_ext = mlx_ready
    r = await jp_fetch("mlx", "v1", "models")
    assert json.loads(r.body) == {
        "object": "list",
        "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "mlx-nb",
                  "sampling_defaults": {"values": {}, "source": None},  # a random fixture recommends nothing
                  "state": "loaded"}],
    }
    r = await jp_fetch("mlx", "v1", "models", MODEL)
    assert json.loads(r.body)["id"] == MODEL
    r = await jp_fetch("mlx", "v1", "models", "gpt-4o")  # one model served: any name means it
    assert json.loads(r.body)["id"] == MODEL
    mlx_ext.accept_any_model = False
    err = await fetch_error(jp_fetch, "mlx", "v1", "models", "gpt-4o")
    assert err.code == 404 and error_body(err)["error"]["code"] == "model_not_found"


async def test_model_names_clients_are_configured_with(jp_fetch, mlx_ready):
    """By default any name is accepted while one model is served (the reply names the real one);
    with `accept_any_model` off only the model and its aliases are, and the aliases are listed."""
    ask = {**HELLO, "model": "gpt-4o-mini"}
    reply = json.loads((await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=body(ask))).body)
    assert reply["model"] == MODEL
    claude = {"model": "claude-sonnet-4-5", "max_tokens": 4, "messages": HELLO["messages"]}
    reply = json.loads((await jp_fetch("mlx", "v1", "messages", method="POST", body=body(claude))).body)
    assert reply["model"] == MODEL
    mlx_ready.accept_any_model = False
    mlx_ready.model_aliases = {"claude-sonnet-4-5": MODEL}
    reply = json.loads((await jp_fetch("mlx", "v1", "messages", method="POST", body=body(claude))).body)
    assert reply["model"] == MODEL
    listed = [m["id"] for m in json.loads((await jp_fetch("mlx", "v1", "models")).body)["data"]]
    assert listed == [MODEL, "claude-sonnet-4-5"]
    err = await fetch_error(jp_fetch, "mlx", "v1", "chat", "completions", method="POST", body=body(ask))
    assert err.code == 404 and "claude-sonnet-4-5" in error_body(err)["error"]["message"]


async def test_chat_non_stream(jp_fetch, mlx_ready):
    r = await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=body({**HELLO, "model": MODEL}))
    assert r.headers["Content-Type"].startswith("application/json")
    reply = json.loads(r.body)
    assert reply["object"] == "chat.completion" and reply["model"] == MODEL
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")
    assert reply["usage"]["completion_tokens"] <= 8 and reply["usage"]["prompt_tokens"] > 0


async def test_chat_stream_is_sse(jp_fetch, mlx_ready):
    pieces: list[bytes] = []
    # greedy, so the reply is long enough to arrive in several reads however fast the engine is
    request = {**HELLO, "max_tokens": 48, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    r = await jp_fetch(
        "mlx", "v1", "chat", "completions", method="POST", body=body(request), streaming_callback=pieces.append
    )
    assert r.headers["Content-Type"].startswith("text/event-stream")
    assert r.headers["Cache-Control"] == "no-cache" and r.headers["X-Accel-Buffering"] == "no"
    assert len(pieces) > 2  # flushed per delta, not buffered into one write
    events = sse_events(b"".join(pieces))
    assert events[-1] == ("", "[DONE]")
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    assert len({c["id"] for c in chunks}) == 1


async def test_completions(jp_fetch, mlx_ready):
    request = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}
    r = await jp_fetch("mlx", "v1", "completions", method="POST", body=body(request))
    reply = json.loads(r.body)
    assert reply["object"] == "text_completion" and reply["choices"][0]["finish_reason"] in ("stop", "length")
    pieces: list[bytes] = []
    await jp_fetch(
        "mlx",
        "v1",
        "completions",
        method="POST",
        body=body({**request, "stream": True}),
        streaming_callback=pieces.append,
    )
    events = sse_events(b"".join(pieces))
    assert events[-1][1] == "[DONE]"
    assert "".join(json.loads(d)["choices"][0]["text"] for _, d in events[:-1]) == reply["choices"][0]["text"]


async def test_messages_anthropic(jp_fetch, mlx_ready):
    request = {"model": MODEL, "max_tokens": 6, "temperature": 0, "system": "Be brief.",
               "messages": [{"role": "user", "content": "hi"}]}
    r = await jp_fetch("mlx", "v1", "messages", method="POST", body=body(request))
    reply = json.loads(r.body)
    assert reply["type"] == "message" and reply["role"] == "assistant"
    assert reply["stop_reason"] in ("end_turn", "max_tokens") and reply["content"][0]["type"] == "text"
    pieces: list[bytes] = []
    r = await jp_fetch(
        "mlx", "v1", "messages", method="POST", body=body({**request, "stream": True}), streaming_callback=pieces.append
    )
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(b"".join(pieces))
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert all(json.loads(data)["type"] == name for name, data in events)
    text = "".join(json.loads(d)["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == reply["content"][0]["text"]


async def test_status_and_cache(jp_fetch, mlx_ready):
    status = json.loads((await jp_fetch("mlx", "v1", "status")).body)
    assert status["model"] == MODEL and status["ready"] and status["context_length"] == 4096
    fresh = json.loads((await jp_fetch("mlx", "v1", "cache")).body)
    assert fresh["request"] is None and fresh["layers"]
    err = await fetch_error(jp_fetch, "mlx", "v1", "cache", params={"request": "req-nope"})
    assert err.code == 404 and "req-nope" in error_body(err)["error"]["message"]

    # a live request (submitted in-process, so it is surely decoding while we look)
    handle = mlx_ready.engine.submit(messages=HELLO["messages"], max_tokens=3000)
    try:
        async for _ in handle:
            break  # its first token: it is in the batch now
        live = json.loads((await jp_fetch("mlx", "v1", "cache", params={"request": handle.id})).body)
        assert live["request"] == handle.id and live["layers"][0]["offset"] > 0
        status = json.loads((await jp_fetch("mlx", "v1", "status")).body)
        assert handle.id in [r["id"] for r in status["requests"]]
    finally:
        handle.abort()
    assert (await handle.aresult()).finish_reason == "abort"


@pytest.mark.parametrize("backlog", [1000, 1], ids=["queued", "resync"])
async def test_events_json_and_sse(jp_fetch, mlx_ready, monkeypatch, backlog):
    monkeypatch.setattr("jupyter_ext.monitor.MAX_BACKLOG", backlog)  # 1: a lagging reader re-reads the log
    first = json.loads((await jp_fetch("mlx", "v1", "events", params={"stream": "0"})).body)
    since = first[-1]["seq"] if first else 0
    await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=body(HELLO))
    recorded: list = []

    async def record():  # the reply can arrive a moment before its `filter` event is published
        recorded[:] = json.loads((await jp_fetch("mlx", "v1", "events", params={"stream": "0", "since": since})).body)
        return any(e["kind"] == "filter" for e in recorded)

    for _ in range(200):
        if await record():
            break
        await asyncio.sleep(0.02)
    assert {"insert", "step", "filter"} <= {e["kind"] for e in recorded} and all(e["seq"] > since for e in recorded)

    # SSE: replays what is after `since`, then goes live; ended here the way shutdown ends it
    pieces: list[bytes] = []
    stream = asyncio.ensure_future(
        jp_fetch("mlx", "v1", "events", params={"since": since}, streaming_callback=pieces.append)
    )
    await wait_for(lambda: len(sse_events(b"".join(pieces))) >= len(recorded))
    await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=body(HELLO))
    await wait_for(lambda: len(sse_events(b"".join(pieces))) > len(recorded) + 3)
    for queue in list(mlx_ready.event_queues):
        queue.put_nowait(None)
    r = await asyncio.wait_for(stream, 10)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    seen = [json.loads(data) for _, data in sse_events(b"".join(pieces))]
    assert [e["seq"] for e in seen[: len(recorded)]] == [e["seq"] for e in recorded]
    seqs = [e["seq"] for e in seen]
    assert seqs == list(range(since + 1, seqs[-1] + 1))  # each once, in order, none lost
    assert b"id: %d\n" % seqs[-1] in b"".join(pieces)

    err = await fetch_error(jp_fetch, "mlx", "v1", "events", params={"since": "-1"})
    assert err.code == 400 and error_body(err)["error"]["param"] == "since"


async def wait_for(condition, timeout=10.0):
    for _ in range(int(timeout / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


BAD_CHAT = [
    (b"{not json", 400, None, "not valid JSON"),
    (b"[1, 2]", 400, None, "must be a JSON object"),
    (body({"messages": "hi"}), 400, "messages", "list"),
    (body({"messages": [{"role": "wizard", "content": "hi"}]}), 400, "messages.0.role", "'system'"),
    (body({"messages": []}), 400, "messages", "at least one"),
    (body({**HELLO, "max_tokens": 0}), 400, "max_tokens", "greater than or equal to 1"),
    (body({**HELLO, "temperature": "hot"}), 400, "temperature", "number"),
    (body({**HELLO, "n": 99}), 400, "n", "less than or equal to 16"),
]


async def test_chat_errors_are_openai_shaped(jp_fetch, mlx_ready):
    for raw, status, param, words in BAD_CHAT:
        err = await fetch_error(jp_fetch, "mlx", "v1", "chat", "completions", method="POST", body=raw)
        error = error_body(err)["error"]
        assert err.code == status, (raw, error)
        assert error["param"] == param and words in error["message"], (raw, error)
        assert "Traceback" not in err.response.body.decode()
    err = await fetch_error(jp_fetch, "mlx", "v1", "completions", method="POST", body=body({"prompt": ""}))
    assert err.code == 400 and error_body(err)["error"]["param"] == "prompt"


async def test_messages_errors_are_anthropic_shaped(jp_fetch, mlx_ready):
    cases = [
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error", "max_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, 400, "invalid_request_error", "role"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
             "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]},
            400,
            "invalid_request_error",
            "runs no tools itself",
        ),
    ]
    for request, status, kind, words in cases:
        err = await fetch_error(jp_fetch, "mlx", "v1", "messages", method="POST", body=body(request))
        reply = error_body(err)
        assert err.code == status and reply["type"] == "error", reply
        assert reply["error"]["type"] == kind and words in reply["error"]["message"], reply


async def test_unknown_route_and_method(jp_fetch, mlx_ext):
    for parts, method in [
        (("mlx", "v1", "nope"), "GET"),
        (("mlx", "v1", "audio", "speech"), "POST"),
        (("mlx", "v1"), "GET"),
    ]:
        kwargs = {"body": b"{}"} if method == "POST" else {}
        err = await fetch_error(jp_fetch, *parts, method=method, **kwargs)
        assert err.code == 404 and error_body(err)["error"]["type"] == "not_found_error"
    err = await fetch_error(jp_fetch, "mlx", "v1", "chat", "completions")  # GET on a POST route
    assert err.code == 405 and "error" in error_body(err)


async def test_body_too_large(jp_fetch, mlx_ready):
    mlx_ready.max_body_bytes = 2000
    big = body({"messages": [{"role": "user", "content": "x" * 3000}], "max_tokens": 1})
    err = await fetch_error(jp_fetch, "mlx", "v1", "chat", "completions", method="POST", body=big)
    assert err.code == 413 and error_body(err)["error"]["code"] == "request_too_large"
    err = await fetch_error(jp_fetch, "mlx", "v1", "messages", method="POST", body=big)
    assert err.code == 413 and error_body(err)["error"]["type"] == "request_too_large"
    await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=body(HELLO))  # under the limit


async def test_auth(jp_fetch, jp_serverapp, mlx_ready):
    token = jp_serverapp.identity_provider.token
    no_token = {"Authorization": ""}
    for parts, method in [
        (("models",), "GET"),
        (("chat", "completions"), "POST"),
        (("events",), "GET"),
        (("status",), "GET"),
        (("messages",), "POST"),
        (("nope",), "GET"),
    ]:
        kwargs = {"body": body(HELLO)} if method == "POST" else {}
        err = await fetch_error(jp_fetch, "mlx", "v1", *parts, method=method, headers=dict(no_token), **kwargs)
        assert err.code == 401, parts
        assert err.response.headers["WWW-Authenticate"].startswith("Bearer")
        assert error_body(err)["error"]["type"] == "authentication_error"
    err = await fetch_error(jp_fetch, "mlx", "v1", "models", headers={"Authorization": "Bearer wrong"})
    assert err.code == 401
    err = await fetch_error(jp_fetch, "mlx", "v1", "models", headers={"Authorization": "", "x-api-key": "wrong"})
    assert err.code == 401
    for headers in ({"Authorization": f"Bearer {token}"}, {"Authorization": "", "x-api-key": token}):
        r = await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=body(HELLO), headers=headers)
        assert r.code == 200
    r = await jp_fetch("mlx", "v1", "health", headers=dict(no_token))  # readiness needs no token
    assert json.loads(r.body) == {"status": "ok"}
    for method in ("HEAD", "GET"):  # Claude Code's look at its base URL: no login redirect (it looped)
        r = await jp_fetch("mlx", method=method, headers=dict(no_token), follow_redirects=False)
        assert r.code == 200 and "Location" not in r.headers


def no_auth_config(**server):
    # Jupyter's "no token": anyone who can reach the port is a user. (Set on ServerApp, which forwards
    # it, because pytest-jupyter replaces an empty IdentityProvider.token with a random one.)
    return server_config({"allow_unauthenticated_access": True, "token": "", **server})


@pytest.mark.parametrize("jp_server_config", [no_auth_config(disable_check_xsrf=True)])
async def test_auth_off_when_the_server_has_no_token(jp_fetch, mlx_ready):
    """With Jupyter's own auth switched off (and its XSRF check, as API clients need), the routes
    follow it: no key, or the SDKs' placeholder keys, all work."""
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer anything"}, {"x-api-key": "sk-none"}):
        r = await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=body(HELLO), headers=headers)
        assert r.code == 200 and json.loads(r.body)["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("jp_server_config", [no_auth_config()])
async def test_auth_off_keeps_jupyters_xsrf_check(jp_fetch, mlx_ready):
    """No token but Jupyter's XSRF check on: a POST without it is refused as Jupyter refuses it,
    in the OpenAI error shape; GETs still work."""
    r = await jp_fetch("mlx", "v1", "models", headers={"Authorization": ""})
    assert r.code == 200
    err = await fetch_error(jp_fetch, "mlx", "v1", "chat", "completions", method="POST", body=body(HELLO),
                            headers={"Authorization": ""})
    message = error_body(err)["error"]["message"]
    assert err.code == 403 and "_xsrf" in message and "disable_check_xsrf=True" in message and "\n" not in message


class DenyMLX(Authorizer):
    """Lets users do everything except use the `mlx` resource."""

    def is_authorized(self, handler, user, action, resource):
        return resource != "mlx"


@pytest.mark.parametrize("jp_server_config", [server_config({"authorizer_class": DenyMLX})])
async def test_authorizer_can_refuse_with_403(jp_fetch):
    err = await fetch_error(jp_fetch, "mlx", "v1", "models")
    assert err.code == 403 and error_body(err)["error"]["type"] == "permission_error"
    await jp_fetch("api", "status")  # the rest of the server is still allowed


async def test_503_while_loading(load_gate, jp_fetch, mlx_ext):
    assert not mlx_ext.engine.ready
    err = await fetch_error(jp_fetch, "mlx", "v1", "chat", "completions", method="POST", body=body(HELLO))
    assert err.code == 503 and err.response.headers["Retry-After"] == "2"
    assert error_body(err)["error"]["code"] == "model_loading"
    err = await fetch_error(jp_fetch, "mlx", "v1", "messages", method="POST", body=body({**HELLO, "max_tokens": 4}))
    assert err.code == 503 and error_body(err)["error"]["type"] == "overloaded_error"
    err = await fetch_error(jp_fetch, "mlx", "v1", "health")
    assert err.code == 503 and error_body(err) == {"status": "loading"}
    assert json.loads((await jp_fetch("mlx", "v1", "status")).body)["loading"] is True
    assert json.loads((await jp_fetch("mlx", "v1", "models")).body)["data"][0]["id"] == MODEL
    load_gate.set()
    mlx_ext.engine.wait_ready(60)
    r = await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=body(HELLO))
    assert r.code == 200


@pytest.mark.parametrize("jp_server_config", [server_config(load_on_start=False)])
async def test_lazy_load_starts_on_first_request(load_gate, jp_fetch, mlx_ext):
    assert json.loads((await jp_fetch("mlx", "v1", "health")).body) == {"status": "idle"}
    assert mlx_ext.engine is None
    err = await fetch_error(jp_fetch, "mlx", "v1", "chat", "completions", method="POST", body=body(HELLO))
    assert err.code == 503 and err.response.headers["Retry-After"] == "2"
    load_gate.set()
    mlx_ext.engine.wait_ready(60)
    assert (await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=body(HELLO))).code == 200


@pytest.mark.parametrize("jp_server_config", [server_config(model="tiny-no-such-model")])
async def test_load_failure_is_503_without_retry(jp_fetch, mlx_ext):
    with pytest.raises(ValueError, match="tiny-no-such-model"):
        mlx_ext.engine.wait_ready(60)
    err = await fetch_error(jp_fetch, "mlx", "v1", "chat", "completions", method="POST", body=body(HELLO))
    assert err.code == 503 and "Retry-After" not in err.response.headers
    assert error_body(err)["error"]["code"] == "model_load_failed"
    err = await fetch_error(jp_fetch, "mlx", "v1", "health")
    assert err.code == 503 and error_body(err) == {"status": "error"}


@pytest.fixture
def prior_env(monkeypatch):
    """What the environment held before the server started (requested before the server)."""
    monkeypatch.setenv("MLX_NB_URL", "http://elsewhere/v1")
    monkeypatch.delenv("MLX_NB_TOKEN", raising=False)


async def test_kernel_environment(prior_env, jp_serverapp, jp_http_port, mlx_ext):
    assert os.environ["MLX_NB_URL"] == f"http://127.0.0.1:{jp_http_port}/a%40b/mlx/v1"
    assert os.environ["MLX_NB_TOKEN"] == mlx_ext.keys.kernel_key  # the mlx API key, not the Jupyter token
    await mlx_ext.stop_extension()  # as at server shutdown: the previous values come back
    assert os.environ["MLX_NB_URL"] == "http://elsewhere/v1" and "MLX_NB_TOKEN" not in os.environ


@pytest.mark.filterwarnings("error::jupyter_server.utils.JupyterServerAuthWarning")
async def test_every_route_is_decorated(jp_fetch, mlx_ready):
    # Registering a handler verb without @web.authenticated / @allow_unauthenticated warns (an
    # error here); the health route is the one deliberate @allow_unauthenticated.
    r = await jp_fetch("mlx", "v1", "health", headers={"Authorization": ""})
    assert r.code == 200


async def test_unexpected_failure_is_json_without_traceback(jp_fetch, mlx_ready, monkeypatch):
    def broken():
        raise RuntimeError("secret internals")

    monkeypatch.setattr(mlx_ready.engine, "status", broken)
    err = await fetch_error(jp_fetch, "mlx", "v1", "status")
    assert err.code == 500
    assert error_body(err) == {
        "error": {
            "message": "internal server error: see the Jupyter server log",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }


@pytest.mark.parametrize("jp_server_config", [server_config(prefill_budget_s=None, max_batch=4, prefill_batch=2,
                                                           prefix_cache=False, max_image_pixels=1000,
                                                           memory_limit=8 << 30, buffer_cache_bytes=32 << 20)])
async def test_config_reaches_the_engine(jp_serverapp, mlx_ready):
    import inspect

    from mlx_nb import Engine

    options = mlx_ready.engine_options()
    assert set(options) <= set(inspect.signature(Engine).parameters), "an option the Engine does not take"
    assert options["image_roots"] == [jp_serverapp.root_dir] and options["allow_remote_images"] is False
    engine = mlx_ready.engine
    assert engine.options["prefill_budget_s"] is None and engine.options["max_batch"] == 4
    assert engine.options["prefill_batch"] == 2 and engine.prefix_options["enabled"] is False
    assert engine.image_options.max_pixels == 1000
    status = engine.status()
    assert status["prefix_cache"] == {"enabled": False} and status["prefill_batch"] == 2
    assert status["memory"]["memory_limit_bytes"] == 8 << 30 and status["memory"]["buffer_cache_limit_bytes"] == 32 << 20
    assert engine.image_options.roots == [Path(jp_serverapp.root_dir).resolve()]


@pytest.mark.parametrize("jp_server_config", [server_config(model="tiny-qwen3-vl")])
async def test_images_under_the_server_root(jp_fetch, jp_root_dir, mlx_ready):
    """Local images only under the server root; an image over the size limit is a 413."""
    from PIL import Image

    inside = jp_root_dir / "red.png"
    Image.new("RGB", (32, 32), (255, 0, 0)).save(inside)

    def ask(path):
        content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": str(path)}}]
        return body({"messages": [{"role": "user", "content": content}], "max_tokens": 4})

    r = await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=ask(inside))
    assert json.loads(r.body)["usage"]["prompt_tokens"] > 0
    outside = jp_root_dir.parent / "secret.png"
    Image.new("RGB", (8, 8)).save(outside)
    err = await fetch_error(jp_fetch, "mlx", "v1", "chat", "completions", method="POST", body=ask(outside))
    assert err.code == 400 and "outside the allowed image roots" in error_body(err)["error"]["message"]
    assert error_body(err)["error"]["param"] == "messages[0].content[1]"
    huge = jp_root_dir / "huge.png"
    Image.new("RGB", (64, 64), (0, 0, 255)).save(huge)
    mlx_ready.engine.image_options.max_pixels = 64 * 64 - 1
    err = await fetch_error(jp_fetch, "mlx", "v1", "chat", "completions", method="POST", body=ask(huge))
    assert err.code == 413 and error_body(err)["error"]["code"] == "request_too_large"
    assert "more than 4095 pixels" in error_body(err)["error"]["message"]
    mlx_ready.engine.image_options.max_pixels = 40_000_000
    r = await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=ask(huge))  # the engine goes on
    assert json.loads(r.body)["choices"][0]["finish_reason"] in ("stop", "length")


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


async def test_openai_sdk_gets_the_tool_call_the_model_makes(jp_serverapp, http_server, mlx_ready, monkeypatch):
    """A random model never calls a tool by itself, so this test's engine is made to emit one
    (a forcing logits processor added to its submits); the route, the detokenizer, mlx_lm's tool
    parser, the SSE stream and the openai SDK's parsing are all the real thing. (`http_server` makes
    the test server answer on its port, which the SDK reaches through MLX_NB_URL.)"""
    import openai
    from forcing import forced

    engine = mlx_ready.engine
    tok = engine.loaded.tokenizer
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ids = tok.encode(call, add_special_tokens=False) + [sorted(tok.eos_token_ids)[0]]
    submit = engine.submit_requests
    monkeypatch.setattr(engine, "submit_requests", lambda reqs: submit([forced(req, ids) for req in reqs]))
    client = openai.AsyncOpenAI(base_url=os.environ["MLX_NB_URL"], api_key=jp_serverapp.identity_provider.token,
                                max_retries=0, timeout=60)
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, max_tokens=64)

    reply = await client.chat.completions.create(**ask)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (made,) = choice.message.tool_calls
    assert made.function.name == "get_weather" and json.loads(made.function.arguments) == {"city": "Paris"}

    chunks = [c async for c in await client.chat.completions.create(**ask, stream=True)]
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "get_weather" and calls[0].id
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()


async def test_unknown_routes_answer_in_their_apis_shape(jp_fetch, mlx_ext):
    """A client configured with one /v1 too many (Claude Code given .../mlx/v1) gets an error its SDK
    reads (Anthropic's shape on an Anthropic path) that names the base URL to use."""
    err = await fetch_error(jp_fetch, "mlx", "v1", "v1", "messages", method="POST", body=b"{}")
    reply = error_body(err)
    assert err.code == 404 and reply["type"] == "error" and reply["error"]["type"] == "not_found_error"
    assert reply["error"]["message"].endswith("/mlx (it adds /v1 itself)")
    err = await fetch_error(jp_fetch, "mlx", "v1", "v1", "chat", "completions", method="POST", body=b"{}")
    reply = error_body(err)
    assert err.code == 404 and "type" not in reply and reply["error"]["code"] == "not_found"
    assert "set the client's base URL" in reply["error"]["message"]
