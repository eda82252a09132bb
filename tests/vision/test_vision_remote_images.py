"""Remote and local image sources that could be turned against the server: internal addresses,
redirects into them, slow servers, upstream errors, hidden files, paths outside the root.

A real HTTP server on loopback stands for every host; the pretend internet (tests/image_hosts.py,
plugged into ImageOptions' resolve/connect hooks) gives it a public-looking name and address."""

import asyncio

import numpy as np
import pytest
from image_hosts import INTERNAL_NAME, PUBLIC_IP, PUBLIC_NAME, ImageServer, PretendInternet, png_bytes
from PIL import Image

from mlx_nb.engine.inputs.images import ImageOptions, load_image, prefetch_remote_images
from mlx_nb.engine.inputs.remote_images import refusal
from mlx_nb.engine.types import RequestError, TooLargeError


@pytest.fixture
def server():
    s = ImageServer()
    yield s
    s.close()


@pytest.fixture
def internet(server):
    return PretendInternet(server)


def remote(internet, tmp_path, **kw) -> ImageOptions:
    return internet.hook(ImageOptions(roots=[tmp_path], allow_remote=True, **kw))


def same_picture(img, server) -> bool:
    return np.array_equal(np.asarray(img), np.asarray(Image.open(__import__("io").BytesIO(server.png)).convert("RGB")))


def test_internal_targets_are_refused_by_default(server, internet, tmp_path):
    opts = remote(internet, tmp_path)
    refused = {
        f"{server.url}/pic.png": "loopback",
        f"http://[::1]:{server.port}/pic.png": "loopback",
        "http://[::ffff:127.0.0.1]/pic.png": "loopback",
        "http://localhost/pic.png": "loopback",
        "http://10.20.30.40/pic.png": "private",
        "https://192.168.1.1/pic.png": "private",
        f"http://{INTERNAL_NAME}/pic.png": "private",  # a name whose address is internal
        "http://169.254.169.254/latest/meta-data/": "link-local",  # cloud metadata
        "http://224.0.0.1/pic.png": "multicast",
        "http://240.0.0.1/pic.png": "reserved",
        "http://0.0.0.0/pic.png": "unspecified",
        "http://100.64.0.1/pic.png": "non-public",  # carrier-grade NAT
    }
    for url, kind in refused.items():
        with pytest.raises(RequestError, match=rf"^x: image host \S+ is a {kind} address .*allow_private_image_hosts"):
            load_image(url, "x", opts)
    assert internet.connected == [] and server.hits == []  # refused before any connection


def test_a_public_host_redirecting_inward_is_refused_at_the_hop(server, internet, tmp_path):
    opts = remote(internet, tmp_path)
    for inward in (f"{server.url}/pic.png", "http://10.0.0.1/pic.png", f"http://{INTERNAL_NAME}/x"):
        with pytest.raises(RequestError, match=r"is a (loopback|private) address"):
            load_image(f"http://{PUBLIC_NAME}/to?u={inward}", "x", opts)
    assert [h.split("?")[0] for h in server.hits] == ["/to"] * 3  # the public hop was asked, the inward one never
    with pytest.raises(RequestError, match="only http"):
        load_image(f"http://{PUBLIC_NAME}/to?u=file:///etc/passwd", "x", opts)
    with pytest.raises(RequestError, match="more than 5 redirects"):
        load_image(f"http://{PUBLIC_NAME}/loop", "x", opts)


def test_a_public_host_is_fetched_pinned_on_the_fetch_threads(server, internet, tmp_path):
    img = load_image(f"http://{PUBLIC_NAME}/pic.png", "x", remote(internet, tmp_path))
    assert same_picture(img, server)
    assert internet.resolved == [PUBLIC_NAME]  # resolved once: the connection went to the checked address
    ((ip, port, thread),) = internet.connected
    assert (ip, port) == (PUBLIC_IP, 80) and thread.startswith("mlx-nb-image-fetch")


def test_internal_targets_are_fetched_when_the_setting_allows(server, internet, tmp_path):
    opts = remote(internet, tmp_path, allow_private=True)
    assert same_picture(load_image(f"{server.url}/pic.png", "x", opts), server)
    assert same_picture(load_image(f"http://{PUBLIC_NAME}/to?u={server.url}/pic.png", "x", opts), server)


def test_failures_never_echo_the_upstream(server, internet, tmp_path):
    opts = remote(internet, tmp_path, allow_private=True)
    with pytest.raises(RequestError) as info:
        load_image(f"{server.url}/missing.png", "x", opts)
    said = str(info.value).replace(server.url, "URL")  # its port may hold the digits 404
    assert "did not answer with an image" in said
    assert "404" not in said and "Not Found" not in said
    with pytest.raises(RequestError, match="the connection failed"):
        load_image("http://127.0.0.1:1/pic.png", "x", opts)  # nothing listens on port 1
    assert len(server.png) > 40
    with pytest.raises(TooLargeError, match="larger than 40 bytes"):
        load_image(f"{server.url}/pic.png", "x", remote(internet, tmp_path, allow_private=True, max_bytes=40))


def test_one_deadline_for_the_whole_fetch(server, internet, tmp_path):
    """The drip answers at once and keeps sending: a per-read timeout would never fire."""
    opts = remote(internet, tmp_path, allow_private=True, timeout_s=1.0)
    with pytest.raises(RequestError, match=r"no answer within 1 s"):
        load_image(f"{server.url}/drip", "x", opts)
    assert server.drip_closed.wait(10)  # the fetch thread's connection was closed, not left running


def test_the_server_path_awaits_fetches_and_refuses_the_same(server, internet, tmp_path):
    opts = remote(internet, tmp_path)
    messages = [{"role": "user", "content": [{"type": "text", "text": "look"},
                                             {"type": "image_url", "image_url": {"url": f"http://{PUBLIC_NAME}/pic.png"}},
                                             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]
    fetched = asyncio.run(prefetch_remote_images(messages, opts))
    assert fetched[0]["content"][1] == {"type": "image", "image": server.png}
    assert fetched[0]["content"][2] is messages[0]["content"][2]  # other parts untouched
    inward = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"{server.url}/pic.png"}}]}]
    with pytest.raises(RequestError, match=r"^messages\[0\]\.content\[0\]: image host 127\.0\.0\.1 is a loopback"):
        asyncio.run(prefetch_remote_images(inward, opts))


def test_refusal_kinds():
    assert refusal("8.8.8.8") == "" and refusal("2606:4700::1111") == ""
    assert refusal("fe80::1%eth0") == "link-local" and refusal("fc00::1") == "private"


# -- local files --------------------------------------------------------------------------------
def test_local_paths_are_relative_to_the_root_and_never_hidden(tmp_path, monkeypatch):
    root = tmp_path / "root"
    for rel in ("pics/a.png", ".secret/a.png", ".a.png", "pics/.cache/a.png"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(png_bytes())
    (root / "pics" / "link.png").symlink_to(root / ".secret" / "a.png")
    (tmp_path / "outside.png").write_bytes(png_bytes())
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "pics").mkdir(parents=True)
    monkeypatch.chdir(elsewhere)  # a relative path must not mean the process's cwd
    opts = ImageOptions(roots=[root])

    assert load_image("pics/a.png", "x", opts).size == (24, 16)
    assert load_image(str(root / "pics/a.png"), "x", opts).size == (24, 16)
    assert load_image("pics/../pics/a.png", "x", opts).size == (24, 16)
    for hidden in (".secret/a.png", ".a.png", "pics/.cache/a.png", "pics/link.png", str(root / ".a.png")):
        with pytest.raises(RequestError, match="hidden file or folder"):
            load_image(hidden, "x", opts)
    for outside in ("../outside.png", str(tmp_path / "outside.png"), f"file://{tmp_path}/outside.png"):
        with pytest.raises(RequestError, match="outside the allowed image roots"):
            load_image(outside, "x", opts)
