"""Client over the embedded engine (tiny-llama) and over an unreachable URL."""

import asyncio
import io
import socket

import pytest

from mlx_nb.client import (
    ChatReply,
    ChatStream,
    Client,
    ClientError,
    MlxConnectionError,
    build_messages,
    openai_client,
)
from mlx_nb.engine import RequestError


@pytest.fixture(scope="module")
def client():
    c = Client(model="tiny-llama", embedded=True)
    c.load()
    return c


def dead_url() -> str:
    """A loopback port nobody listens on: connections are refused at once."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/mlx/v1"


def last_seq(client) -> int:
    events = client.events()
    return events[-1]["seq"] if events else 0


def test_chat_returns_a_reply(client):
    r = client.chat("hi", max_tokens=8)
    assert isinstance(r, ChatReply)
    assert r.finish_reason in ("stop", "length")
    assert 1 <= r.usage["completion_tokens"] <= 8
    assert r.usage["total_tokens"] == r.usage["prompt_tokens"] + r.usage["completion_tokens"]
    assert r.request_id and r.model == "tiny-llama" and str(r) == r.text
    assert client.backend == "embedded"


def test_stream_yields_the_reply_text(client):
    st = client.chat([{"role": "user", "content": "hello"}], system="be brief", max_tokens=12, stream=True)
    assert isinstance(st, ChatStream) and st.request_id  # the request started when the stream was made
    chunks = list(st)
    assert "".join(chunks) == st.reply.text == st.text
    assert st.reply.finish_reason in ("stop", "length")
    again = "".join(client.stream("hello", system="be brief", max_tokens=12))
    assert again == st.reply.text  # greedy: the same answer


def test_achat_and_astream(client):
    async def main():
        reply = await client.achat("hi", max_tokens=6)
        st = client.astream("hi", max_tokens=6)
        chunks = [c async for c in st]
        return reply, st, chunks

    reply, st, chunks = asyncio.run(main())
    assert reply.finish_reason in ("stop", "length")
    assert "".join(chunks) == st.reply.text == reply.text


def test_gathered_achats_share_the_batch(client):
    since = last_seq(client)

    async def main():
        return await asyncio.gather(*[client.achat(f"question {i}", max_tokens=32) for i in range(4)])

    replies = asyncio.run(main())
    assert all(r.finish_reason in ("stop", "length") for r in replies)
    ids = {r.request_id for r in replies}
    steps = [e for e in client.events(since) if e["kind"] == "step"]
    shared = max(len(ids & set(e["requests"])) for e in steps)
    assert shared >= 2, "the four requests never decoded in the same step"
    assert client.status()["peak_batch_size"] >= 2


def test_abort_by_request_id(client):
    st = client.stream("go on forever", max_tokens=3000)
    next(st)
    client.abort(st.request_id)
    rest = list(st)
    assert st.reply.finish_reason == "abort"
    assert st.reply.usage["completion_tokens"] < 3000
    assert len(rest) < 3000


def test_closing_a_stream_early_aborts_it(client):
    st = client.stream("go on forever", max_tokens=3000)
    next(st)
    st.close()
    assert st.reply.finish_reason == "abort"


def test_bad_input_fails_before_streaming(client):
    with pytest.raises(RequestError, match="max_tokens"):
        client.stream("hi", max_tokens=0)
    with pytest.raises(ClientError, match="no live request"):
        client.cache_layout("req-does-not-exist")


def test_introspection(client):
    assert client.status()["model"] == "tiny-llama"
    layout = client.cache_layout()
    assert [layer["type"] for layer in layout["layers"]] == ["KVCache", "KVCache"]
    assert {"kind", "step", "requests", "seq"} <= set(client.events()[-1])
    assert "tiny-llama" in client.models() and "smollm2-135m-instruct" in client.models()


def test_images_become_data_url_parts(tmp_path):
    from PIL import Image

    img = Image.new("RGB", (4, 4), "red")
    path = tmp_path / "red.png"
    img.save(path)
    msgs = build_messages("what color?", system="sys", images=[path, img, b"\xff\xd8\xff\xe0jpeg"])
    assert msgs[0] == {"role": "system", "content": "sys"}
    parts = msgs[1]["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url", "image_url", "text"]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert parts[2]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert parts[3] == {"type": "text", "text": "what color?"}
    with pytest.raises(FileNotFoundError):
        build_messages("x", images=[tmp_path / "missing.png"])
    with pytest.raises(TypeError):
        build_messages("x", images=[io.StringIO("no")])


def test_unreachable_url_is_one_clear_line():
    url = dead_url()
    c = Client(url, api_key="tok", model="m")
    assert c.backend == url and not c.embedded
    for call in (lambda: c.chat("hi"), c.status, c.events, c.models, lambda: c.cache_layout()):
        with pytest.raises(MlxConnectionError) as info:
            call()
        assert isinstance(info.value, ConnectionError)
        message = str(info.value)
        assert url in message and "\n" not in message and "MLX_NB_URL" in message

    async def main():
        return await c.achat("hi")

    with pytest.raises(MlxConnectionError):
        asyncio.run(main())


def test_env_picks_the_server(monkeypatch):
    monkeypatch.setenv("MLX_NB_URL", "http://127.0.0.1:1/mlx/v1/")
    monkeypatch.setenv("MLX_NB_TOKEN", "secret")
    c = Client()
    assert c.backend == "http://127.0.0.1:1/mlx/v1"
    oa = openai_client()
    assert str(oa.base_url).rstrip("/") == "http://127.0.0.1:1/mlx/v1" and oa.api_key == "secret"
    assert Client(embedded=True).embedded
    monkeypatch.delenv("MLX_NB_URL")
    with pytest.raises(ClientError, match="MLX_NB_URL"):
        openai_client()


def test_a_client_bound_to_a_given_engine():
    from mlx_nb import Engine
    from mlx_nb.widgets import CacheInspector

    with Engine("tiny-llama", wait=True) as eng:
        c = Client(engine=eng)
        assert c.embedded and c.engine is eng and c.model_name() == "tiny-llama"
        reply = c.chat("hi", max_tokens=4)
        assert reply.finish_reason in ("stop", "length")
        assert any(reply.request_id in e["requests"] for e in eng.events())
        with pytest.raises(ClientError, match="bound to an Engine serving tiny-llama"):
            c.chat("hi", model="tiny-qwen3.5")
        assert 'data-layers="2"' in CacheInspector(engine=eng).svg  # its two (identical, fresh) layers
