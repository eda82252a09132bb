"""Error shapes, SSE framing and the models list: the small shared pieces of the wire layer."""

import json

import openai
import pytest

from mlx_nb.api import (
    APIError,
    from_request_error,
    invalid_request,
    model_loading,
    model_not_found,
    models_list,
    not_found,
    request_too_large,
    sse_comment,
    sse_done,
    sse_event,
)
from mlx_nb.engine.types import RequestError


def test_openai_and_anthropic_error_shapes():
    err = invalid_request("messages.0.role: bad", "messages.0.role")
    assert err.status == 400
    assert err.to_dict() == {
        "error": {
            "message": "messages.0.role: bad",
            "type": "invalid_request_error",
            "param": "messages.0.role",
            "code": None,
        }
    }
    assert err.to_anthropic_dict() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "messages.0.role: bad"},
    }


@pytest.mark.parametrize(
    "err, status, code, anthropic_type",
    [
        (model_not_found("gpt-9", ["a"]), 404, "model_not_found", "not_found_error"),
        (not_found("no such request"), 404, "not_found", "not_found_error"),
        (request_too_large(2_000_000, 1_000_000), 413, "request_too_large", "request_too_large"),
        (model_loading("smollm2"), 503, "model_loading", "overloaded_error"),
    ],
)
def test_error_helpers(err, status, code, anthropic_type):
    assert isinstance(err, APIError)
    assert (err.status, err.code) == (status, code)
    assert err.to_anthropic_dict()["error"]["type"] == anthropic_type
    assert "\n" not in err.message


def test_model_not_found_names_the_model_and_param():
    err = model_not_found("gpt-9", ["smollm2-135m-instruct"])
    assert "gpt-9" in err.message and "smollm2-135m-instruct" in err.message
    assert err.param == "model"


def test_engine_request_error_becomes_400_with_param():
    err = from_request_error(RequestError("this model is text-only", "messages"))
    assert (err.status, err.param, err.message) == (400, "messages", "this model is text-only")


def test_openai_sdk_reads_our_error_body():
    body = model_not_found("x").to_dict()
    obj = openai.types.ErrorObject.model_validate(body["error"])
    assert obj.code == "model_not_found"


def test_sse_event_formats():
    assert sse_event({"a": 1}) == b'data: {"a":1}\n\n'
    assert sse_event({"type": "ping"}, event="ping") == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert sse_done() == b"data: [DONE]\n\n"
    assert sse_comment("keep-alive") == b": keep-alive\n\n"


def test_sse_event_keeps_unicode_and_splits_lines():
    raw = sse_event({"t": "héllo 🙂"})
    assert json.loads(raw.decode()[len("data: ") :]) == {"t": "héllo 🙂"}
    assert "🙂".encode() in raw
    assert sse_event("a\nb") == b"data: a\ndata: b\n\n"


def test_models_list_shape():
    body = models_list(["smollm2-135m-instruct", "tiny-llama"], created=7)
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["smollm2-135m-instruct", "tiny-llama"]
    for card in body["data"]:
        openai.types.Model.model_validate(card)
