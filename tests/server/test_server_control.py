"""`DELETE mlx/v1/requests/{id}`: aborting a live request of any client, through a real in-process
Jupyter server with the Jupyter token (what the Lab's sidebar sends) and with the scoped API key."""

import asyncio
import json
import os

import httpx
import pytest
from tornado.httpclient import HTTPClientError

from jupyter_ext.keys import KEY_FILE


def long_request(engine):
    eos = engine.loaded.tokenizer.eos_token_ids
    return engine.submit(prompt="tell me everything", max_tokens=3000, logit_bias={t: -100 for t in eos})


async def test_abort_one_request_and_the_other_goes_on(jp_fetch, mlx_ready):
    engine = mlx_ready.engine
    victim, other = long_request(engine), engine.submit(prompt="hello", max_tokens=8)
    await asyncio.to_thread(lambda: next(iter(victim)))  # it decodes
    r = await jp_fetch("mlx", "v1", "requests", victim.id, method="DELETE")
    assert r.code == 202 and json.loads(r.body) == {"id": victim.id, "aborting": True}
    done = await victim.aresult()
    assert done.finish_reason == "abort"
    assert (await other.aresult()).error is None
    with pytest.raises(HTTPClientError) as err:  # not live any more
        await jp_fetch("mlx", "v1", "requests", victim.id, method="DELETE")
    assert err.value.code == 404 and "no live request" in json.loads(err.value.response.body)["error"]["message"]


async def test_the_api_key_may_abort_too(jp_runtime_dir, http_server, mlx_ready):
    engine = mlx_ready.engine
    victim = long_request(engine)
    await asyncio.to_thread(lambda: next(iter(victim)))
    key = (jp_runtime_dir / KEY_FILE).read_text().strip()
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.delete(f"{os.environ['MLX_NB_URL']}/requests/{victim.id}", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 202
        assert (await victim.aresult()).finish_reason == "abort"
        unknown = await http.delete(f"{os.environ['MLX_NB_URL']}/requests/nope", headers={"Authorization": f"Bearer {key}"})
        assert unknown.status_code == 404
        anonymous = await http.delete(f"{os.environ['MLX_NB_URL']}/requests/nope")
        assert anonymous.status_code in (401, 403)


async def test_delete_cache_empties_the_prefix_cache(jp_fetch, mlx_ready):
    engine = mlx_ready.engine
    chat = [{"role": "system", "content": "You are terse. " * 20}, {"role": "user", "content": "hi"}]
    await engine.submit(messages=chat, max_tokens=4).aresult()
    held = engine.status()["prefix_cache"]
    assert held["entries"] >= 1
    r = await jp_fetch("mlx", "v1", "cache", method="DELETE")
    body = json.loads(r.body)
    assert body["entries"] == held["entries"] and body["bytes"] > 0
    assert engine.status()["prefix_cache"]["entries"] == 0
