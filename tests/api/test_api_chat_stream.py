"""ChatStream: Deltas in, chat.completion.chunk dicts out, checked against the openai SDK types."""

import json

import pytest
from api_fakes import deltas, feed_all, lp
from openai.types.chat import ChatCompletionChunk

from mlx_nb.api import ChatStream, parse_chat_request
from mlx_nb.engine.types import Delta

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def stream(**kw):
    return ChatStream("m", 100, "req-1", **kw)


def validate_all(chunks):
    return [ChatCompletionChunk.model_validate(c) for c in chunks]


def content_of(chunks):
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))


def test_plain_text_sequence():
    chunks = feed_all(stream(), deltas(["Hel", "lo", "!"]))
    parsed = validate_all(chunks)
    assert parsed[0].choices[0].delta.role == "assistant" and parsed[0].choices[0].delta.content == ""
    assert [p.choices[0].delta.content for p in parsed[1:4]] == ["Hel", "lo", "!"]
    assert parsed[-1].choices[0].finish_reason == "stop" and parsed[-1].choices[0].delta.content is None
    assert all(p.choices[0].finish_reason is None for p in parsed[:-1])
    assert {p.id for p in parsed} == {"chatcmpl-req-1"} and {p.object for p in parsed} == {"chat.completion.chunk"}
    assert all(p.usage is None for p in parsed)


def test_include_usage_adds_a_final_chunk_with_empty_choices():
    chunks = feed_all(stream(include_usage=True), deltas(["a"], finish="length"))
    parsed = validate_all(chunks)
    assert parsed[-2].choices[0].finish_reason == "length"
    assert parsed[-1].choices == [] and parsed[-1].usage.total_tokens == 17
    assert parsed[-1].usage.prompt_tokens_details.cached_tokens == 4


def test_abort_finishes_with_stop_and_nothing_after_done():
    s = stream()
    chunks = feed_all(s, deltas(["partial"], finish="abort"))
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert s.feed(Delta("req-1", text="late")) == []


def test_first_delta_empty_still_sends_role():
    chunks = stream().feed(Delta("req-1", text=""))
    assert len(chunks) == 1 and chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_error_delta_becomes_an_error_object():
    chunks = feed_all(stream(), [Delta("req-1", text="x"), Delta("req-1", finish_reason="error", error="boom")])
    assert chunks[-1] == {"error": {"message": "boom", "type": "server_error", "param": None, "code": None}}


@pytest.mark.parametrize(
    "pieces",
    [
        ["<tool_", "call>" + WEATHER + "</tool_call>"],
        ["<tool_call>", WEATHER[:10], WEATHER[10:], "</tool", "_call>"],
        list("<tool_call>" + WEATHER + "</tool_call>"),  # one character per delta
    ],
)
def test_streamed_tool_call_split_across_deltas(pieces):
    chunks = feed_all(stream(), deltas(pieces))
    parsed = validate_all(chunks)
    assert content_of(chunks) == ""  # no markup leaks out as content
    calls = [tc for p in parsed for tc in (p.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1
    call = calls[0]
    assert call.index == 0 and call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert parsed[-1].choices[0].finish_reason == "tool_calls"


def test_text_then_two_tool_calls():
    text = (
        "Checking.<tool_call>" + WEATHER + '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    chunks = feed_all(stream(), deltas([text[:12], text[12:40], text[40:]]))
    parsed = validate_all(chunks)
    assert content_of(chunks) == "Checking.\n"
    calls = [tc for p in parsed for tc in (p.choices[0].delta.tool_calls or [])]
    assert [(c.index, c.function.name) for c in calls] == [(0, "get_weather"), (1, "get_time")]
    assert parsed[-1].choices[0].finish_reason == "tool_calls"


def test_held_back_prefix_that_is_not_a_marker_is_released():
    chunks = feed_all(stream(), deltas(["a <to", "day"]))
    assert content_of(chunks) == "a <today"
    chunks = feed_all(stream(), deltas(["ends with <tool_"]))
    assert content_of(chunks) == "ends with <tool_"


def test_unclosed_or_unparseable_tool_call_comes_back_as_text():
    chunks = feed_all(stream(), deltas(['<tool_call>{"name": "get_we'], finish="length"))
    assert content_of(chunks) == '<tool_call>{"name": "get_we'
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    chunks = feed_all(stream(), deltas(["<tool_call>not json</tool_call> ok"]))
    assert content_of(chunks) == "<tool_call>not json</tool_call> ok"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_tool_parsing_can_be_switched_off():
    chunks = feed_all(stream(parse_tools=False), deltas(["<tool_call>" + WEATHER + "</tool_call>"]))
    assert content_of(chunks).startswith("<tool_call>")


def test_custom_parser_and_markers():
    def parser(text, tools):
        name, _, arg = text.partition(":")
        return {"name": name.strip(), "arguments": {"x": arg.strip()}}

    chunks = feed_all(stream(tool_parser=parser, tool_markers=("[[", "]]")), deltas(["hi [[f: 1", "]] bye"]))
    calls = [tc for c in chunks for tc in (c["choices"][0]["delta"].get("tool_calls") or []) if c["choices"]]
    assert calls[0]["function"] == {"name": "f", "arguments": '{"x": "1"}'}
    assert content_of(chunks) == "hi  bye"


def test_logprobs_ride_on_content_chunks():
    lps = [[lp("He", -0.1, [("He", -0.1), ("A", -2)])], [lp("llo", -0.3, [("llo", -0.3), ("y", -1)])]]
    chunks = feed_all(stream(top_logprobs=1), deltas(["He", "llo"], logprobs=lps))
    parsed = validate_all(chunks)
    got = [
        (c.token, len(c.top_logprobs))
        for p in parsed
        if p.choices and p.choices[0].logprobs
        for c in p.choices[0].logprobs.content
    ]
    assert got == [("He", 1), ("llo", 1)]


def test_for_request_reads_the_request():
    req = parse_chat_request(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "response_format": {"type": "json_object"},
        }
    )
    s = ChatStream.for_request(req, model="m", created=1, request_id="r")
    chunks = feed_all(s, deltas(["{not json"]))
    validate_all(chunks)
    assert chunks[-1]["choices"] == [] and "usage" in chunks[-1]
    assert chunks[-2]["choices"][0]["json_error"].startswith("content is not valid JSON")
    assert s.splitter.enabled is False  # no tools offered, so no tool parsing
