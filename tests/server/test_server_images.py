"""Remote images through the routes (allow_remote_images on, the defaults otherwise): loopback,
private and redirected-inward URLs are clear 400s in each route's shape; a public host's image
is fetched and answered. The public host is the pretend internet of tests/image_hosts.py, plugged
into the engine's ImageOptions hooks; the loopback server is real."""

import json

import pytest
from image_hosts import INTERNAL_NAME, PUBLIC_NAME, ImageServer, PretendInternet
from server_helpers import body, server_config

MODEL = "tiny-qwen3-vl"


@pytest.fixture
def jp_server_config():
    return server_config(model=MODEL, allow_remote_images=True)


@pytest.fixture
def internet(mlx_ready):
    server = ImageServer()
    net = PretendInternet(server)
    net.hook(mlx_ready.engine.image_options)
    yield net
    server.close()


def chat(url: str) -> bytes:
    return body({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": url}}]}]})


def anthropic(url: str) -> bytes:
    return body({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": url}}, {"type": "text", "text": "what is this?"}]}]})


async def test_inward_image_urls_are_refused_with_a_clear_400(jp_fetch, internet):
    loopback = f"{internet.server.url}/pic.png"
    cases = {
        loopback: "loopback",
        "http://10.1.2.3/pic.png": "private",
        f"http://{INTERNAL_NAME}/pic.png": "private",
        f"http://{PUBLIC_NAME}/to?u={loopback}": "loopback",  # public-looking, redirects inward
    }
    for url, kind in cases.items():
        r = await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=chat(url), raise_error=False)
        error = json.loads(r.body)["error"]
        assert r.code == 400 and error["type"] == "invalid_request_error", r.body
        assert f"is a {kind} address" in error["message"] and error["message"].startswith("messages[0].content[1]: ")

        r = await jp_fetch("mlx", "v1", "messages", method="POST", body=anthropic(url), raise_error=False)
        reply = json.loads(r.body)
        assert r.code == 400 and reply["type"] == "error" and f"is a {kind} address" in reply["error"]["message"]
    assert [h.split("?")[0] for h in internet.server.hits] == ["/to", "/to"]  # only the public hop was asked


async def test_a_public_image_is_fetched_and_answered(jp_fetch, internet):
    r = await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=chat(f"http://{PUBLIC_NAME}/pic.png"))
    reply = json.loads(r.body)
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")
    text_only = json.loads((await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=body(
        {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "what is this?"}]}))).body)
    assert reply["usage"]["prompt_tokens"] > text_only["usage"]["prompt_tokens"]  # the image is in the prompt
    assert internet.server.hits == ["/pic.png"]
    assert all(thread.startswith("mlx-nb-image-fetch") for _, _, thread in internet.connected)
