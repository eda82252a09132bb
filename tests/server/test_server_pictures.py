"""`batch.svg`: the batch timeline the notebook widget draws, served for the Lab's sidebar from the
engine's own events, through a real in-process Jupyter server."""

import asyncio
import json

import pytest
from tornado.httpclient import HTTPClientError

HOSTILE = '<script>alert(1)</script><img src=x onerror="alert(2)">'


async def test_the_timeline_shows_every_request_and_escapes_their_text(jp_fetch, mlx_ready):
    engine = mlx_ready.engine
    handles = [engine.submit(prompt=p, max_tokens=6, source=s)
               for p, s in (("first question", "notebook a.ipynb"), (HOSTILE, "route: curl"))]
    for h in handles:
        await h.aresult()
    r = await jp_fetch("mlx", "v1", "batch.svg", params={"lanes": "5"})
    assert r.headers["Content-Type"].startswith("image/svg+xml")
    svg = r.body.decode()
    assert svg.startswith("<svg") and svg.count('class="lane"') >= 2
    assert "notebook a.ipynb" in svg and "first question" in svg
    assert "<script" not in svg and "<img" not in svg and "&lt;script&gt;" in svg
    narrow = (await jp_fetch("mlx", "v1", "batch.svg", params={"lanes": "5", "width": "320"})).body.decode()
    assert 'width="320"' in narrow[:200] and "first question" in narrow and "&lt;script&gt;" in narrow


@pytest.mark.parametrize("name,value", [("lanes", "0"), ("lanes", "-1"), ("lanes", "many"), ("lanes", "201"),
                                        ("width", "159"), ("width", "2001"), ("width", "wide")])
async def test_a_bad_lane_count_or_width_is_a_400(jp_fetch, mlx_ready, name, value):
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("mlx", "v1", "batch.svg", params={name: value})
    message = json.loads(err.value.response.body)["error"]["message"]
    assert err.value.code == 400 and message.startswith(f"{name} must be a whole number"), message


async def test_a_live_requests_cache_picture(jp_fetch, mlx_ready):
    engine = mlx_ready.engine
    eos = engine.loaded.tokenizer.eos_token_ids
    handle = engine.submit(prompt="a question long enough to hold some cache", max_tokens=3000,
                           logit_bias={t: -100 for t in eos})
    await asyncio.to_thread(lambda: next(iter(handle)))
    r = await jp_fetch("mlx", "v1", "cache.svg", params={"request_id": handle.id})
    svg = r.body.decode()
    assert r.headers["Content-Type"].startswith("image/svg+xml")
    assert svg.startswith("<svg") and f"request {handle.id}" in svg and 'class="grid"' in svg
    narrow = (await jp_fetch("mlx", "v1", "cache.svg", params={"request_id": handle.id, "width": "300"})).body.decode()
    assert 'width="300"' in narrow[:200] and f"request {handle.id}" in narrow and 'class="grid"' in narrow
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("mlx", "v1", "cache.svg", params={"request_id": handle.id, "width": "9"})
    assert err.value.code == 400 and "width must be a whole number" in err.value.response.body.decode()
    handle.abort()
    await handle.aresult()
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("mlx", "v1", "cache.svg", params={"request_id": handle.id})
    assert err.value.code == 404
    fresh = await jp_fetch("mlx", "v1", "cache.svg")
    assert fresh.body.decode().startswith("<svg")
