"""Every Client method against the real server route it calls (a `jupyter mlx` process on tiny-llama).

Each test checks what the Client returns against what the server itself recorded (its batch
events, its status, the raw route), so a Client that sends a parameter the server ignores, or
reads a field the server does not send, fails here.
"""

import asyncio
import threading

import httpx
import pytest

from mlx_nb.client import Client, ClientError
from mlx_nb.client.content import request_source

MODEL = "tiny-llama"  # what the `live` server (conftest) serves


@pytest.fixture
def client(live):
    return Client(live.url, api_key=live.token)


def inserted(live, since: int) -> set[str]:
    """Request ids the server admitted after `since`."""
    return {r for e in live.events(since) if e["kind"] == "insert" for r in e["requests"]}


def test_models_and_model_name(live, client):
    assert client.models() == [m["id"] for m in live.get("models")["data"]] == [MODEL]
    assert client.model_name() == MODEL and client.backend == live.url and not client.embedded


def test_chat(live, client):
    since = live.last_seq()
    reply = client.chat("hi there, server", max_tokens=4)
    assert reply.finish_reason in ("stop", "length") and reply.model == MODEL
    assert 1 <= reply.usage["completion_tokens"] <= 4
    assert reply.request_id in inserted(live, since)  # the id the server knows the request by
    insert = next(e for e in live.events(since) if e["kind"] == "insert")
    assert insert["detail"]["label"] == "hi there, server" and insert["detail"]["source"] == request_source()


def test_stream(live, client):
    since = live.last_seq()
    st = client.stream("hello", max_tokens=6)
    chunks = list(st)
    assert "".join(chunks) == st.reply.text and st.reply.finish_reason in ("stop", "length")
    assert st.request_id in inserted(live, since)


def test_achat_and_astream(live, client):
    since = live.last_seq()

    async def main():
        reply = await client.achat("one", max_tokens=4)
        st = client.astream("two", max_tokens=4)
        chunks = [c async for c in st]
        return reply, st, chunks

    reply, st, chunks = asyncio.run(main())
    assert reply.finish_reason in ("stop", "length") and "".join(chunks) == st.reply.text
    assert {reply.request_id, st.request_id} <= inserted(live, since)


def test_status_lists_a_live_request(live, client):
    st = client.stream("go on", max_tokens=3000)
    try:
        next(st)
        status = client.status()
        assert set(status) == set(live.get("status")) and status["ready"] and status["model"] == MODEL
        assert st.request_id in [r["id"] for r in status["requests"]]
        assert status["load"]["phase"] == "ready" and status["load"]["elapsed_s"] > 0
    finally:
        st.close()


def test_cache_layout_of_a_live_request(live, client):
    st = client.stream("go on", max_tokens=3000)
    try:
        next(st)
        layout = client.cache_layout(st.request_id)
        assert layout["request"] == st.request_id
        assert all(layer["nbytes"] > 0 for layer in layout["layers"])  # a real cache, not a fresh one
        raw = live.get("cache", request=st.request_id)  # the parameter earlier clients sent still works
        assert raw["request"] == st.request_id
    finally:
        st.close()
    fresh = client.cache_layout()
    assert fresh["request"] is None and all(layer["nbytes"] == 0 for layer in fresh["layers"])


def test_unknown_request_id_is_a_404_and_one_line(live, client):
    r = live.http.get(f"{live.url}/cache", params={"request_id": "req-nope"})
    assert r.status_code == 404 and "req-nope" in r.json()["error"]["message"]
    with pytest.raises(ClientError) as info:
        client.cache_layout("req-nope")
    message = str(info.value)
    assert "404" in message and "no live request 'req-nope'" in message and "\n" not in message


def test_events(live, client):
    since = live.last_seq()
    reply = client.chat("hi", max_tokens=3)
    events = client.events(since)
    assert events == live.events(since)[: len(events)] and events
    assert any(reply.request_id in e["requests"] for e in events if e["kind"] == "filter")


def test_subscribe(live, client):
    got: list[dict] = []
    arrived = threading.Event()

    def on_event(event):
        got.append(event)
        if event["kind"] == "filter":
            arrived.set()

    before = set(threading.enumerate())
    unsubscribe = client.subscribe(on_event, since=live.last_seq())
    (reader,) = [t for t in threading.enumerate() if t not in before and t.name == "mlx-nb-events"]
    try:
        reply = client.chat("hi", max_tokens=3)
        assert arrived.wait(20), got
        assert any(reply.request_id in e["requests"] for e in got if e["kind"] == "filter")
        assert [e["seq"] for e in got] == sorted({e["seq"] for e in got})  # in order, none twice
    finally:
        unsubscribe()
    reader.join(5)  # the stream is idle now: unsubscribing must not wait for the next keep-alive (15 s)
    assert not reader.is_alive()


def test_abort(live, client):
    st = client.stream("count to a thousand", max_tokens=3000)
    next(st)
    since = live.last_seq()
    client.abort(st.request_id)
    list(st)
    assert st.reply.finish_reason == "abort"
    left = live.wait_event(since, lambda e: e["kind"] == "filter" and st.request_id in e["requests"])
    assert left["detail"]["reason"] == "abort"


def test_openai(live, client):
    oa = client.openai()
    assert [m.id for m in oa.models.list()] == [MODEL]
    since = live.last_seq()
    done = oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert done.choices[0].finish_reason in ("stop", "length")
    insert = next(e for e in live.events(since) if e["kind"] == "insert")
    assert insert["detail"]["source"].startswith("route: OpenAI/Python")  # a plain SDK client


def test_load_and_wait_ready(live, client):
    assert client.load(MODEL) is client and client.model == MODEL
    assert client.wait_ready(timeout=5) is client
    with pytest.raises(ClientError) as info:
        client.load("tiny-gemma3")
    assert MODEL in str(info.value) and "\n" not in str(info.value) and client.model == MODEL


def test_health_needs_no_token(live):
    r = httpx.get(f"{live.url}/health", timeout=5, trust_env=False)
    assert r.json() == {"status": "ok"}


def test_chat_with_a_response_format_over_the_route(live, client):
    """A pydantic model, a schema dict: sent as response_format, held by the server's constraint
    (the random tiny model at temperature 1 writes valid JSON only because of it)."""
    import json

    from pydantic import BaseModel, Field

    class Point(BaseModel):
        x: int = Field(ge=-9, le=9)
        label: str = Field(max_length=6)

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    for seed in range(3):
        reply = client.chat("a point", max_tokens=200, temperature=1.0, seed=seed, response_format=Point)
        assert reply.finish_reason == "stop" and Point.model_validate_json(reply.text)
        assert json.loads(client.chat("ok?", max_tokens=50, temperature=1.0, seed=seed,
                                      response_format=schema).text) in ({"ok": True}, {"ok": False})
    reply = asyncio.run(client.achat("a point", max_tokens=200, temperature=1.0, response_format=Point))
    assert Point.model_validate_json(reply.text)
    with pytest.raises(TypeError, match="pydantic model class"):
        client.chat("x", response_format=42)
