"""The real openai / anthropic SDK clients against our wire layer, over an in-memory transport.

The HTTP server is replaced by a function that does what a route does (parse, translate, build the
body or the SSE stream) with a canned reply in place of the engine, so this checks request
parsing of what the SDKs actually send and that their parsers (streams included) read our output.
"""

import importlib
import json

import anthropic
import openai
import pytest


def http_library(sdk):
    """The HTTP library an SDK runs on: httpx, or its fork httpx2 (same API) in newer SDKs, which
    rejects the other's objects; the SDK's re-exported Timeout is that library's."""
    for name in ("httpx2", "httpx"):
        try:
            lib = importlib.import_module(name)
        except ImportError:
            continue
        if lib.Timeout is sdk.Timeout:
            return lib
    raise AssertionError(f"{sdk.__name__} runs on neither httpx nor httpx2")


from api_fakes import deltas

from mlx_nb.api import (
    APIError,
    ChatStream,
    CompletionStream,
    MessagesStream,
    chat_engine_kwargs,
    chat_response,
    completion_engine_kwargs,
    completion_response,
    messages_engine_kwargs,
    messages_response,
    parse_chat_request,
    parse_completion_request,
    parse_messages_request,
    sse_done,
    sse_event,
)
from mlx_nb.engine.types import Delta, Result

WEATHER = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


class FakeRoute:
    """Plays server: `reply` is the engine's text, split into deltas of `piece` characters."""

    def __init__(self, reply="Hello there!", piece=3, error=None):
        self.reply, self.piece, self.error = reply, piece, error
        self.kwargs = None

    def deltas(self):
        pieces = [self.reply[i : i + self.piece] for i in range(0, len(self.reply), self.piece)]
        if self.error:
            return [Delta("r1", text=pieces[0]), Delta("r1", finish_reason="error", error=self.error)]
        return deltas(pieces, rid="r1")

    def result(self):
        return Result("r1", self.reply, "stop", deltas([], rid="r1")[-1].usage)

    def __call__(self, request):
        self.http = importlib.import_module(type(request).__module__.split(".")[0])  # answer in the caller's library
        path = request.url.path
        anthropic_route = path.endswith("/messages")
        try:
            if path.endswith("/chat/completions"):
                return self.chat(request.content)
            if path.endswith("/completions"):
                return self.completions(request.content)
            return self.messages(request.content)
        except APIError as err:
            body = err.to_anthropic_dict() if anthropic_route else err.to_dict()
            return self.http.Response(err.status, json=body)

    def sse(self, events):
        return self.http.Response(200, content=b"".join(events), headers={"content-type": "text/event-stream"})

    def chat(self, body):
        req = parse_chat_request(body, model_names=["m"])
        self.kwargs = chat_engine_kwargs(req)
        if not req.stream:
            return self.http.Response(200, json=chat_response(req, self.result(), model="m", created=1))
        stream = ChatStream.for_request(req, model="m", created=1, request_id="r1")
        return self.sse([sse_event(c) for d in self.deltas() for c in stream.feed(d)] + [sse_done()])

    def completions(self, body):
        req = parse_completion_request(body, model_names=["m"])
        self.kwargs = completion_engine_kwargs(req)
        if not req.stream:
            return self.http.Response(200, json=completion_response(self.result(), model="m", created=1))
        stream = CompletionStream.for_request(req, model="m", created=1, request_id="r1")
        return self.sse([sse_event(c) for d in self.deltas() for c in stream.feed(d)] + [sse_done()])

    def messages(self, body):
        req = parse_messages_request(body, model_names=["m"])
        self.kwargs = messages_engine_kwargs(req)
        if not req.stream:
            return self.http.Response(200, json=messages_response(req, self.result(), model="m"))
        stream = MessagesStream.for_request(req, model="m", request_id="r1")
        return self.sse([sse_event(data, event=name) for d in self.deltas() for name, data in stream.feed(d)])


def oai(route):
    httpx = http_library(openai)
    transport = httpx.Client(transport=httpx.MockTransport(route))
    return openai.OpenAI(base_url="http://test/v1", api_key="k", http_client=transport, max_retries=0)


def claude(route):
    httpx = http_library(anthropic)
    transport = httpx.Client(transport=httpx.MockTransport(route))
    return anthropic.Anthropic(base_url="http://test", api_key="k", http_client=transport, max_retries=0)


USER = [{"role": "user", "content": "hi"}]


def test_openai_chat_non_stream():
    route = FakeRoute()
    out = oai(route).chat.completions.create(model="m", messages=USER, max_completion_tokens=20, stop="\n", seed=1)
    assert out.choices[0].message.content == "Hello there!" and out.usage.total_tokens == 17
    assert route.kwargs["max_tokens"] == 20 and route.kwargs["stop"] == ["\n"] and route.kwargs["seed"] == 1


def test_openai_chat_stream_with_usage():
    route = FakeRoute()
    chunks = list(
        oai(route).chat.completions.create(
            model="m", messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there!"
    assert chunks[-1].usage.completion_tokens == 5


def test_openai_chat_tool_calls_stream_and_not():
    client = oai(FakeRoute(reply="One sec." + WEATHER, piece=4))
    out = client.chat.completions.create(model="m", messages=USER, tools=[TOOL])
    assert out.choices[0].finish_reason == "tool_calls"
    assert json.loads(out.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}
    chunks = list(client.chat.completions.create(model="m", messages=USER, tools=[TOOL], stream=True))
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "get_weather" and chunks[-1].choices[0].finish_reason == "tool_calls"


def test_openai_errors_surface_as_sdk_exceptions():
    client = oai(FakeRoute())
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=USER)
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=USER, n=17)
    assert info.value.param == "n"
    with pytest.raises(openai.APIError, match="engine fell over"):
        list(oai(FakeRoute(error="engine fell over")).chat.completions.create(model="m", messages=USER, stream=True))


def test_openai_completions_stream():
    route = FakeRoute(reply=" upon a time")
    chunks = list(oai(route).completions.create(model="m", prompt="Once", max_tokens=8, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == " upon a time"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert route.kwargs["prompt"] == "Once"
    with pytest.raises(openai.BadRequestError):
        oai(route).completions.create(model="m", prompt="Once", echo=True)


def test_anthropic_messages_non_stream_and_stream():
    route = FakeRoute()
    client = claude(route)
    msg = client.messages.create(model="m", max_tokens=20, system="terse", messages=USER)
    assert msg.content[0].text == "Hello there!" and msg.stop_reason == "end_turn"
    assert route.kwargs["messages"][0] == {"role": "system", "content": "terse"}
    with client.messages.stream(model="m", max_tokens=20, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello there!" and final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.cache_read_input_tokens) == (8, 5, 4)


def test_anthropic_streamed_tool_use_is_accumulated_by_the_sdk():
    client = claude(FakeRoute(reply="One sec." + WEATHER, piece=5))
    tools = [{"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}]
    with client.messages.stream(model="m", max_tokens=64, messages=USER, tools=tools) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"city": "Paris"} and final.stop_reason == "tool_use"


def test_anthropic_errors_surface_as_sdk_exceptions():
    with pytest.raises(anthropic.NotFoundError):
        claude(FakeRoute()).messages.create(model="claude-9", max_tokens=5, messages=USER)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        claude(FakeRoute()).messages.create(model="m", max_tokens=0, messages=USER)
    with pytest.raises(anthropic.APIStatusError, match="engine fell over"):
        with claude(FakeRoute(error="engine fell over")).messages.stream(model="m", max_tokens=5, messages=USER) as s:
            s.get_final_message()
