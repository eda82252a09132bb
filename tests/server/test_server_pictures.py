"""`batch.svg`: the batch timeline the notebook widget draws, served for the Lab's sidebar from the
engine's own events, through a real in-process Jupyter server."""

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


@pytest.mark.parametrize("lanes", ["0", "-1", "many", "201"])
async def test_a_bad_lane_count_is_a_400(jp_fetch, mlx_ready, lanes):
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("mlx", "v1", "batch.svg", params={"lanes": lanes})
    assert err.value.code == 400 and "lanes" in json.loads(err.value.response.body)["error"]["message"]
