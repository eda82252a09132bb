"""Legacy Completions: parsing, engine kwargs, response and stream chunks (openai SDK types)."""

import pytest
from api_fakes import deltas, feed_all, lp, result
from openai.types import Completion

from mlx_nb.api import (
    APIError,
    CompletionStream,
    completion_engine_kwargs,
    completion_response,
    parse_completion_request,
)
from mlx_nb.engine.types import Delta


def parse(body, **kw):
    return parse_completion_request(body, model_names=["m"], **kw)


def error_of(body):
    with pytest.raises(APIError) as info:
        parse(body)
    return info.value


def test_engine_kwargs():
    req = parse(
        b'{"model": "m", "prompt": "Once upon", "max_tokens": 8, "stop": ".", "temperature": 0.5, "logprobs": 2}'
    )
    assert completion_engine_kwargs(req) == {
        "prompt": "Once upon",
        "max_tokens": 8,
        "temperature": 0.5,
        "stop": ["."],
        "logprobs": 2,
        "tools": None,
        "suffix": None,
        "split_reasoning": False,  # a raw completion is text as the model wrote it, markers included
    }
    assert parse({"prompt": ["one"]}).prompt == "one"
    assert completion_engine_kwargs(parse({"prompt": "x", "logprobs": 0}))["logprobs"] == 1
    assert completion_engine_kwargs(parse({"prompt": "x", "suffix": "end"}))["suffix"] == "end"  # the engine decides


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"prompt": "x", "echo": True}, "echo", "not supported"),
        ({"prompt": "x", "best_of": 3}, "best_of", "best_of=1"),
        ({"prompt": [1, 2, 3]}, "prompt", "token-id prompts"),
        ({"prompt": ["a", "b"]}, "prompt", "exactly one prompt"),
        ({"prompt": ""}, "prompt", "empty"),
        ({}, "prompt", "Field required"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"prompt": "x", "logprobs": True, "temperature": -1}, "temperature", "greater than or equal to 0"),
    ],
)
def test_bad_requests(body, param, words):
    err = error_of(body)
    assert err.status == 400 and err.param == param and words in err.message


def test_unknown_model_and_bad_json():
    assert error_of({"prompt": "x", "model": "other"}).status == 404
    assert "not valid JSON" in error_of(b"prompt=x").message


@pytest.mark.parametrize("engine, wire", [("stop", "stop"), ("length", "length"), ("abort", "stop")])
def test_response_shape(engine, wire):
    body = completion_response(result(" there was", finish=engine), model="m", created=5)
    parsed = Completion.model_validate(body)
    assert parsed.object == "text_completion" and parsed.id == "cmpl-req-1"
    assert parsed.choices[0].text == " there was" and parsed.choices[0].finish_reason == wire
    assert parsed.usage.total_tokens == 17


def test_response_logprobs_legacy_shape():
    lps = [lp(" th", -0.1, [(" th", -0.1), (" a", -1.0)]), lp("ere", -0.2, [("ere", -0.2)])]
    body = completion_response(result(" there", logprobs=lps), model="m", created=5, top_logprobs=1)
    parsed = Completion.model_validate(body)
    got = parsed.choices[0].logprobs
    assert got.tokens == [" th", "ere"] and got.token_logprobs == [-0.1, -0.2]
    assert got.top_logprobs == [{" th": -0.1}, {"ere": -0.2}] and got.text_offset == [0, 3]


def test_stream_chunks():
    req = parse({"prompt": "x", "stream": True, "stream_options": {"include_usage": True}})
    s = CompletionStream.for_request(req, model="m", created=5, request_id="req-1")
    chunks = feed_all(s, deltas(["a", "b"]))
    assert [c["choices"][0]["text"] for c in chunks[:3]] == ["a", "b", ""]
    # OpenAI streams send finish_reason null until the end; the SDK builds stream chunks without
    # validation (its Completion type says non-null), so only the last two are checked strictly.
    assert [c["choices"][0]["finish_reason"] for c in chunks[:3]] == [None, None, "stop"]
    assert {c["object"] for c in chunks} == {"text_completion"}
    finish, usage = (Completion.model_validate(c) for c in chunks[2:])
    assert finish.choices[0].finish_reason == "stop"
    assert usage.choices == [] and usage.usage.completion_tokens == 5
    assert s.feed(Delta("req-1", text="late")) == []


def test_stream_error():
    chunks = CompletionStream("m", 5, "r").feed(Delta("r", finish_reason="error", error="boom"))
    assert chunks == [{"error": {"message": "boom", "type": "server_error", "param": None, "code": None}}]
