"""A real `jupyter mlx` process on loopback, driven the way users drive it: the openai and anthropic
SDKs holding the server's mlx API key, many concurrent streams, a client that hangs up; and what
else the headless server serves (nothing of Jupyter's unless asked).

One server for the module (it takes a few seconds to start); each test reads only the batch
events recorded after it began (`since`), so tests do not see each other's requests.
"""

import json
import threading
import time

import anthropic
import httpx
import openai
import pytest
from live_server import serving
from server_helpers import MODEL

HI = [{"role": "user", "content": "hi"}]
GREEDY = {"temperature": 0}  # this anthropic SDK has no temperature argument; the API still takes the field


@pytest.fixture(autouse=True)
def jp_server_cleanup():
    """pytest-jupyter's cleanup is for in-process servers; this module runs its own process."""
    yield


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("live"), MODEL) as server:
        yield server


def openai_client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url, api_key=live.key, max_retries=0)


def test_openai_chat_and_stream(live):
    client = openai_client(live)
    reply = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, temperature=0)
    assert reply.model == MODEL and reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens <= 8

    text, reasons, usage = "", [], None
    for chunk in client.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reasons.append(choice.finish_reason)
    assert text == reply.choices[0].message.content  # greedy: the same reply either way
    assert reasons[-1] == reply.choices[0].finish_reason and usage.completion_tokens == reply.usage.completion_tokens


def test_openai_completions(live):
    client = openai_client(live)
    reply = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
    assert reply.object == "text_completion" and reply.choices[0].finish_reason in ("stop", "length")
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6,
                                           temperature=0, stream=True)
    )
    assert streamed == reply.choices[0].text


def test_openai_tools_round_trip(live):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    client = openai_client(live)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=tools, max_tokens=24
    )
    choice = reply.choices[0]  # a random tiny model: only the round trip is meaningful
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    for call in choice.message.tool_calls or []:
        assert call.type == "function" and isinstance(call.function.arguments, str)
    # a tool result sent back is accepted too
    followup = client.chat.completions.create(
        model=MODEL,
        max_tokens=4,
        tools=tools,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    )
    assert followup.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_sixteen_concurrent_streams_share_batches(live):
    since = live.last_seq()
    client = openai_client(live)
    start = threading.Barrier(16)
    results: dict[int, tuple] = {}

    def chat(i: int):
        start.wait()
        ids, text, reason = set(), "", None
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"count to {i}"}], max_tokens=300, stream=True
        )
        for chunk in stream:
            ids.add(chunk.id)
            for choice in chunk.choices:
                text += choice.delta.content or ""
                reason = choice.finish_reason or reason
        results[i] = (ids, text, reason)

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 16 and all(reason in ("stop", "length") for _, _, reason in results.values())
    request_ids = {next(iter(ids)).removeprefix("chatcmpl-") for ids, _, _ in results.values()}
    assert len(request_ids) == 16
    steps = [e for e in live.events(since) if e["kind"] == "step"]
    widest = max(steps, key=lambda e: len(e["requests"]))
    assert len(widest["requests"]) >= 8, f"widest step held {len(widest['requests'])} requests"
    assert set(widest["requests"]) <= request_ids


def test_anthropic_sdk(live):
    client = anthropic.Anthropic(base_url=f"{live.base}/mlx", api_key=live.key, max_retries=0)
    message = client.messages.create(model=MODEL, max_tokens=8, system="Be brief.", messages=HI, extra_body=GREEDY)
    assert message.role == "assistant" and message.stop_reason in ("end_turn", "max_tokens")
    assert message.content[0].type == "text" and message.usage.output_tokens <= 8
    with client.messages.stream(model=MODEL, max_tokens=8, system="Be brief.", messages=HI,
                                extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == message.content[0].text == final.content[0].text
    assert final.stop_reason == message.stop_reason
    assert client.messages.create(model="claude-team-default", max_tokens=2, messages=HI).model == MODEL
    counted = client.messages.count_tokens(model="claude-team-default", system="Be brief.", messages=HI)
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


def test_disconnect_mid_stream_frees_the_slot(live):
    since = live.last_seq()
    request = {"model": MODEL, "messages": HI, "max_tokens": 3000, "stream": True}
    auth = {"Authorization": f"Bearer {live.key}"}
    with (
        httpx.Client(timeout=30, trust_env=False) as client,
        client.stream("POST", f"{live.url}/chat/completions", json=request, headers=auth) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: "):
                request_id = json.loads(line[6:])["id"].removeprefix("chatcmpl-")
                break
    # leaving the block closed the connection right after the first chunk
    aborted = live.wait_event(since, lambda e: e["kind"] == "filter" and request_id in e["requests"])
    assert aborted["detail"]["reason"] == "abort"
    assert request_id not in [r["id"] for r in live.get("status")["requests"]]


def test_the_key_works_on_every_route_and_opens_nothing_else(live):
    client = openai_client(live)
    assert [m.id for m in client.models.list()] == [MODEL] and client.models.retrieve(MODEL).id == MODEL
    for path in ("status", "cache", "health"):
        assert live.http.get(f"{live.url}/{path}").status_code == 200
    assert isinstance(live.get("events", stream=0), list)
    with live.http.stream("GET", f"{live.url}/events", params={"since": live.last_seq() - 1}) as events:
        assert events.status_code == 200 and events.headers["content-type"].startswith("text/event-stream")
    # the headless server serves nothing else of Jupyter, whoever asks
    for credential in (live.http, live.jupyter):
        for path in ("api/kernels", "api/contents", "api/terminals", "api/sessions", "files/server.log", "lab"):
            r = credential.get(f"{live.base}/{path}")
            assert r.status_code in (403, 404) or "/login" in r.headers.get("location", ""), (path, r.status_code)
    assert live.jupyter.get(f"{live.base}/api/status").status_code == 200  # the Jupyter token still is the token
    assert live.http.get(f"{live.base}/api/status").status_code == 403  # and the key is not


def test_headless_serves_more_only_when_asked(tmp_path):
    with serving(tmp_path, MODEL, "--services=kernels") as server:
        assert server.jupyter.get(f"{server.base}/api/kernels").status_code == 200
        assert server.http.get(f"{server.base}/api/kernels").status_code == 403  # still not with the key
        assert server.jupyter.get(f"{server.base}/api/contents").status_code == 404


def test_client_over_http_chats_streams_aborts_and_watches_the_batch(live):
    """`Client(url)`, as a notebook uses the server, and a BatchVisualizer fed by the events SSE route."""
    import asyncio

    from mlx_nb import Client
    from mlx_nb.widgets import BatchVisualizer

    client = Client(live.url, api_key=live.key)
    assert client.models() == [MODEL] and not client.embedded
    viz = BatchVisualizer(client)  # subscribes to the events route from here on
    try:
        reply = client.chat("hi", max_tokens=4)
        assert reply.finish_reason in ("stop", "length") and reply.usage["completion_tokens"] >= 1
        chunks = list(client.stream("hello", max_tokens=6))
        assert chunks and all(isinstance(c, str) for c in chunks)

        async def two():
            return await asyncio.gather(client.achat("one", max_tokens=5), client.achat("two", max_tokens=5))

        a, b = asyncio.run(two())
        assert a.request_id != b.request_id and a.text is not None and b.text is not None

        st = client.stream("count to a thousand", max_tokens=2000)
        next(iter(st))
        st.abort()
        aborted = live.wait_event(0, lambda e: e["kind"] == "filter" and st.request_id in e["requests"])
        assert aborted["detail"]["reason"] == "abort"

        ids = {reply.request_id, a.request_id, b.request_id, st.request_id}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            seen = {r for e in viz.events if e["kind"] == "filter" for r in e["requests"]}
            if ids <= seen and st.request_id in viz.svg:  # received, then drawn by the redraw thread
                break
            time.sleep(0.05)
        assert ids <= seen, "the visualizer did not receive every request's end over SSE"
        assert "<svg" in viz.svg and st.request_id in viz.svg
    finally:
        viz.close()
