"""A request that leaves a sampling setting out gets the model's own recommendation (its
generation_config.json), else the server's default; a request's own value always wins."""

import json
import shutil

import pytest
from server_helpers import body, server_config

from mlx_nb.api import ServerDefaults
from mlx_nb.api.anthropic_messages import messages_engine_kwargs, parse_messages_request
from mlx_nb.api.openai_chat import chat_engine_requests, parse_chat_request
from mlx_nb.api.openai_completions import completion_engine_requests, parse_completion_request
from mlx_nb.api.openai_responses import parse_responses_request, responses_engine_kwargs
from mlx_nb.models.sampling_defaults import read
from mlx_nb.models.sources import resolve

RECOMMENDED = {"temperature": 0.0, "top_p": 0.8, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1}


@pytest.fixture(scope="module")
def recommending_model(tmp_path_factory):
    """tiny-llama with a generation_config.json that recommends sampling (and junk that is ignored)."""
    path = tmp_path_factory.mktemp("models") / "tiny-llama-recommends"
    shutil.copytree(resolve("tiny-llama"), path)
    config = json.loads((path / "generation_config.json").read_text()) if (path / "generation_config.json").exists() else {}
    config.update(RECOMMENDED, do_sample=True, top_a="x", typical_p=0.5, max_new_tokens=9)
    (path / "generation_config.json").write_text(json.dumps(config))
    return path


def test_read_keeps_the_sampling_values_in_range(recommending_model, tmp_path):
    assert read("x", recommending_model) == {"values": RECOMMENDED, "source": "generation_config.json"}
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 7, "top_k": 2.5, "top_p": True}))
    assert read("x", tmp_path) == {"values": {}, "source": None}
    assert read("smollm2-135m-instruct", tmp_path)["values"] == {"temperature": 0.2, "top_p": 0.9}


def _routes(fields: dict, d: ServerDefaults) -> list[dict]:
    """The engine kwargs each route makes of a request carrying `fields` (temperature, top_p)."""
    msgs = [{"role": "user", "content": "hi"}]
    return [
        chat_engine_requests(parse_chat_request({"messages": msgs, **fields}, defaults=d), d)[0],
        completion_engine_requests(parse_completion_request({"prompt": "hi", **fields}, defaults=d), d)[0],
        messages_engine_kwargs(parse_messages_request({"messages": msgs, "max_tokens": 5, **fields}, defaults=d), d),
        responses_engine_kwargs(parse_responses_request({"input": "hi", **fields}, defaults=d), d),
    ]


def test_every_route_fills_in_the_model_defaults_and_a_request_overrides_them():
    d = ServerDefaults(temperature=1.0, sampling=dict(RECOMMENDED))
    for kwargs in _routes({}, d):
        assert kwargs["temperature"] == 0.0 and kwargs["top_p"] == 0.8 and kwargs["top_k"] == 20
        assert kwargs["repetition_penalty"] == 1.1
    for kwargs in _routes({"temperature": 0.7, "top_p": 0.5}, d):
        assert kwargs["temperature"] == 0.7 and kwargs["top_p"] == 0.5 and kwargs["top_k"] == 20
    plain = ServerDefaults(temperature=1.0)  # a model that recommends nothing: the API's 1.0
    for kwargs in _routes({}, plain):
        assert kwargs["temperature"] == 1.0 and "top_p" not in kwargs


@pytest.fixture
def jp_server_config(recommending_model):
    return server_config(model=str(recommending_model), default_temperature=1.0)


async def test_live_server_applies_and_shows_the_model_defaults(jp_fetch, mlx_ext):
    mlx_ext.engine.wait_ready(60)
    listed = json.loads((await jp_fetch("mlx", "v1", "models")).body)["data"][0]
    assert listed["sampling_defaults"] == {"values": RECOMMENDED, "source": "generation_config.json"}
    status = json.loads((await jp_fetch("mlx", "v1", "status")).body)
    assert status["sampling_defaults"]["values"] == RECOMMENDED

    async def ask(**fields):
        req = {"messages": [{"role": "user", "content": "alpha beta"}], "max_tokens": 12, **fields}
        r = await jp_fetch("mlx", "v1", "chat", "completions", method="POST", body=body(req))
        return json.loads(r.body)["choices"][0]["message"]["content"]

    # the model's temperature 0 makes replies that set none repeatable, although the server's is 1.0
    first = await ask()
    assert all([await ask() == first for _ in range(3)])
    assert first == await ask(temperature=0.0)
    seeded = {await ask(temperature=2.0, seed=s) for s in range(4)}  # the request's own value wins
    assert len(seeded) > 1
