"""Anthropic Messages: parsing, mapping to engine kwargs, message body and stream events."""

import json

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from api_fakes import deltas, feed_all, result
from pydantic import TypeAdapter

from mlx_nb.api import (
    APIError,
    MessagesStream,
    anthropic_message,
    messages_engine_kwargs,
    messages_response,
    parse_messages_request,
)
from mlx_nb.engine.types import Delta

EVENTS = TypeAdapter(RawMessageStreamEvent)
USER = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "name": "get_weather",
        "description": "weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def parse(body, **kw):
    return parse_messages_request(body, model_names=["m"], **kw)


def error_of(body):
    with pytest.raises(APIError) as info:
        parse(body)
    return info.value


# -- requests --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"messages": USER}, "max_tokens", "Field required"),
        ({"max_tokens": 0, "messages": USER}, "max_tokens", "greater than or equal to 1"),
        ({"max_tokens": 5, "messages": []}, "messages", "at least one"),
        (
            {"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]},
            "messages.0.role",
            "'user', 'assistant' or 'system'",
        ),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
            "messages.0.content.0.type",
            "Input should be 'text'",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}],
            },
            "messages.0.content.0",
            "media_type",
        ),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            "messages.0.content.0",
            "tool_use_id",
        ),
        ({"max_tokens": 5, "messages": USER, "temperature": 1.5}, "temperature", "less than or equal to 1"),
        ({"max_tokens": 5, "messages": USER, "tools": [{"name": "f"}]}, "tools.0", "needs an input_schema"),
            (
                {"max_tokens": 5, "messages": USER, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
                "tools.0",
                "runs no tools itself",
            ),
            (
                {"max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "x"}}]}]},
                "messages.0.content.0",
                "only text documents",
            ),
    ],
)
def test_bad_requests(body, param, words):
    err = error_of(body)
    assert err.status == 400 and err.param == param and words in err.message
    assert err.to_anthropic_dict()["error"]["type"] == "invalid_request_error"


def test_unknown_model_is_404_not_found_error():
    err = error_of({"model": "claude-x", "max_tokens": 5, "messages": USER})
    assert err.status == 404 and err.to_anthropic_dict()["error"]["type"] == "not_found_error"


def test_kwargs_system_string_and_sampling():
    req = parse(
        {
            "model": "m",
            "max_tokens": 32,
            "system": "be terse",
            "messages": USER,
            "stop_sequences": ["END"],
            "temperature": 0.2,
            "top_p": 0.9,
            "top_k": 20,
            "metadata": {"user_id": "u"},
        }
    )
    assert messages_engine_kwargs(req) == {
        "messages": [{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi"}],
        "max_tokens": 32,
        "stop": ["END"],
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 20,
        "logprobs": 0,
        "tools": None,
    }


def test_kwargs_system_blocks_images_tool_use_and_tool_result():
    req = parse(
        {
            "max_tokens": 64,
            "system": [
                {"type": "text", "text": "rule one"},
                {"type": "text", "text": "rule two", "cache_control": {"type": "ephemeral"}},
            ],
            "tools": TOOLS,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                        {"type": "text", "text": "weather where this is?"},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "s"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "sunny"}],
                        },
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such city", "is_error": True},
                        {"type": "text", "text": "thanks"},
                    ],
                },
            ],
        }
    )
    kw = messages_engine_kwargs(req)
    assert kw["messages"] == [
        {"role": "system", "content": "rule one\n\nrule two"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
                {"type": "text", "text": "weather where this is?"},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "hmm",  # the template keeps or drops it (engine/text/thinking.py)
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such city"},
        {"role": "user", "content": "thanks"},
    ]
    assert kw["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "weather", "parameters": TOOLS[0]["input_schema"]},
        }
    ]


def test_url_images_and_tool_choice_none():
    req = parse(
        {
            "max_tokens": 5,
            "tools": TOOLS,
            "tool_choice": {"type": "none"},
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/cat.jpg"}}]}
            ],
        }
    )
    kw = messages_engine_kwargs(req)
    assert kw["messages"][0]["content"] == [{"type": "image_url", "image_url": {"url": "https://x/cat.jpg"}}]
    assert kw["tools"] is None


# -- non-stream responses --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "finish, matched, reason, seq",
    [
        ("stop", None, "end_turn", None),
        ("length", None, "max_tokens", None),
        ("stop", "END", "stop_sequence", "END"),
        ("abort", None, "end_turn", None),
    ],
)
def test_message_stop_reasons(finish, matched, reason, seq):
    body = anthropic_message(result("Hello", finish=finish), model="m", matched_stop=matched)
    msg = Message.model_validate(body)
    assert msg.id == "msg_req-1" and msg.role == "assistant" and msg.type == "message"
    assert msg.content[0].type == "text" and msg.content[0].text == "Hello"
    assert (msg.stop_reason, msg.stop_sequence) == (reason, seq)
    assert (msg.usage.input_tokens, msg.usage.output_tokens, msg.usage.cache_read_input_tokens) == (8, 5, 4)


def test_message_tool_use():
    req = parse({"max_tokens": 64, "messages": USER, "tools": TOOLS})
    body = messages_response(req, result("Let me look.<tool_call>" + WEATHER + "</tool_call>"), model="m")
    msg = Message.model_validate(body)
    assert msg.stop_reason == "tool_use"
    assert [b.type for b in msg.content] == ["text", "tool_use"]
    assert msg.content[0].text == "Let me look."
    tool = msg.content[1]
    assert tool.name == "get_weather" and tool.input == {"city": "Paris"} and tool.id.startswith("toolu_")


def test_message_engine_error_is_500_api_error():
    with pytest.raises(APIError) as info:
        anthropic_message(result("", finish="error", error="boom"), model="m")
    assert info.value.to_anthropic_dict()["error"]["type"] == "api_error"


# -- streams ---------------------------------------------------------------------------------------


def check(events):
    """Every event but ping must parse as the SDK's stream event union; returns the names."""
    for name, data in events:
        assert data["type"] == name
        if name != "ping":
            EVENTS.validate_python(data)
    return [n for n, _ in events]


def test_text_stream_sequence():
    events = feed_all(MessagesStream("m", "req-1"), deltas(["Hel", "lo"]))
    assert check(events) == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == "Hello"
    start = events[0][1]["message"]
    assert start["id"] == "msg_req-1" and start["content"] == [] and start["stop_reason"] is None
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 5 and delta["usage"]["input_tokens"] == 8


@pytest.mark.parametrize("finish, matched, reason", [("length", None, "max_tokens"), ("stop", "END", "stop_sequence")])
def test_stream_stop_reasons(finish, matched, reason):
    events = feed_all(MessagesStream("m", "r"), deltas(["a"], finish=finish), matched_stop=matched)
    check(events)
    assert events[-2][1]["delta"]["stop_reason"] == reason
    assert events[-2][1]["delta"]["stop_sequence"] == matched


def test_stream_tool_use_split_across_deltas():
    pieces = ["Checking.", "<tool_", "call>" + WEATHER + "</tool_call>"]
    events = feed_all(MessagesStream("m", "r"), deltas(pieces))
    assert check(events) == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    tool_start = events[5][1]
    assert tool_start["index"] == 1 and tool_start["content_block"]["type"] == "tool_use"
    assert tool_start["content_block"]["name"] == "get_weather" and tool_start["content_block"]["input"] == {}
    assert json.loads(events[6][1]["delta"]["partial_json"]) == {"city": "Paris"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_stream_for_request_without_tools_keeps_markup_as_text():
    req = parse({"max_tokens": 64, "messages": USER, "stream": True})
    events = feed_all(
        MessagesStream.for_request(req, model="m", request_id="r"), deltas(["<tool_call>" + WEATHER + "</tool_call>"])
    )
    check(events)
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_stream_error_event_and_done():
    s = MessagesStream("m", "r")
    events = feed_all(s, [Delta("r", text="x"), Delta("r", finish_reason="error", error="boom")])
    assert events[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": "boom"}})
    assert s.feed(Delta("r", text="late")) == []


def test_empty_reply_stream_still_well_formed():
    events = feed_all(MessagesStream("m", "r"), deltas([]))
    assert check(events) == ["message_start", "message_delta", "message_stop"]


def test_system_messages_inside_messages_as_current_claude_code_sends_them():
    """Claude Code's mid-conversation system messages (and its other fields) are taken, not a 400;
    the engine's normalization then hoists and merges every system message."""
    from mlx_nb.api import count_tokens_kwargs, parse_count_tokens_request
    from mlx_nb.engine.inputs.messages import normalize_messages

    body = {
        "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "You are Claude Code."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "system", "content": "Available tools: Read, Edit."},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "list files"},
        ],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "context_management": {"edits": []},
        "output_config": {"effort": "low"},
        "metadata": {"user_id": "u"},
    }
    kwargs = messages_engine_kwargs(parse(body))
    assert [m["role"] for m in kwargs["messages"]] == ["system", "user", "system", "assistant", "user"]
    merged = normalize_messages(kwargs["messages"])
    assert [m["role"] for m in merged] == ["system", "user", "assistant", "user"]
    assert "You are Claude Code." in merged[0]["content"] and "Available tools" in merged[0]["content"]
    counted = count_tokens_kwargs(parse_count_tokens_request({k: v for k, v in body.items() if k != "max_tokens"},
                                                             model_names=["m"]))
    assert counted["messages"] == kwargs["messages"]
