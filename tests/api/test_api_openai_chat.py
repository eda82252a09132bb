"""Chat Completions: request parsing (good and bad), engine kwargs, non-stream responses."""

import json

import pytest
from api_fakes import USAGE, lp, result
from openai.types.chat import ChatCompletion

from mlx_nb.api import (
    APIError,
    ServerDefaults,
    chat_completion,
    chat_engine_kwargs,
    chat_engine_requests,
    chat_response,
    parse_chat_request,
    parse_tool_calls,
)

NAMES = ["smollm2-135m-instruct"]
USER = [{"role": "user", "content": "hi"}]


def parse(body, **kw):
    kw.setdefault("model_names", NAMES)
    return parse_chat_request(body, **kw)


def error_of(body, **kw) -> APIError:
    with pytest.raises(APIError) as info:
        parse(body, **kw)
    assert "\n" not in info.value.message
    return info.value


# -- parsing: good ---------------------------------------------------------------------------------


def test_minimal_request_from_bytes():
    req = parse(json.dumps({"messages": USER}).encode())
    assert req.model is None and req.messages[0].content == "hi" and not req.stream


@pytest.mark.parametrize("model", [None, "smollm2-135m-instruct"])
def test_model_omitted_or_known_is_accepted(model):
    body = {"messages": USER} if model is None else {"messages": USER, "model": model}
    assert parse(body).model == model


def test_all_roles_and_part_kinds_accepted():
    body = {
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "system", "content": "really"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ],
        "user": "someone",  # accepted and ignored
        "unknown_future_field": {"x": 1},
    }
    assert len(parse(body).messages) == 5


def test_unknown_model_names_are_not_checked_without_a_list():
    assert parse({"messages": USER, "model": "anything"}, model_names=None).model == "anything"


# -- parsing: bad ----------------------------------------------------------------------------------


def test_malformed_json_is_400_with_position():
    err = error_of(b'{"messages": [')
    assert err.status == 400 and "not valid JSON" in err.message and "line 1" in err.message


def test_non_object_body():
    assert "JSON object" in error_of(b"[1, 2]").message


@pytest.mark.parametrize(
    "body, param, words",
    [
        (
            {"messages": [{"role": "bot", "content": "x"}]},
            "messages.0.role",
            "Input should be 'system', 'developer', 'user'",
        ),
        ({"messages": []}, "messages", "at least one message"),
        ({}, "messages", "Field required"),
        ({"messages": "hi"}, "messages", "valid list"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content", "valid string"),
        ({"messages": [{"role": "user"}]}, "messages.0", "needs content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
            "messages.0.content.0.type",
            "'text' or 'image_url'",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
            "messages.0.content.0.text",
            "valid string",
        ),
        ({"messages": USER, "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"messages": USER, "max_completion_tokens": -3}, "max_completion_tokens", "greater than or equal to 1"),
        ({"messages": USER, "max_tokens": "many"}, "max_tokens", "valid integer"),
        ({"messages": USER, "temperature": 3}, "temperature", "less than or equal to 2"),
        ({"messages": USER, "temperature": "hot"}, "temperature", "valid number"),
        ({"messages": USER, "n": 0}, "n", "greater than or equal to 1"),
        ({"messages": USER, "n": 17}, "n", "less than or equal to 16"),
        ({"messages": USER, "stop": 5}, "stop", "valid string"),
        ({"messages": USER, "top_logprobs": 21, "logprobs": True}, "top_logprobs", "less than or equal to 20"),
        ({"messages": USER, "top_logprobs": 2}, None, "requires logprobs"),
        ({"messages": USER, "response_format": {"type": "xml"}}, "response_format.type", "'json_object'"),
        ({"messages": USER, "logit_bias": {"five": 10}}, "logit_bias.five", "valid integer"),
        ({"messages": USER, "presence_penalty": 3}, "presence_penalty", "less than or equal to 2"),
        ({"messages": USER, "stream": "yes please"}, "stream", "valid boolean"),
        ({"messages": USER, "functions": [{"name": "f"}]}, "functions", "send 'tools' instead"),
    ],
)
def test_bad_requests_are_400_naming_the_field(body, param, words):
    err = error_of(body)
    assert err.status == 400 and err.type == "invalid_request_error"
    assert err.param == param
    assert words in err.message
    if param:
        assert err.message.startswith(f"{param}: ")


@pytest.mark.parametrize("default", [None, 300])
@pytest.mark.parametrize("cap", [None, 100, 1000])
@pytest.mark.parametrize("asked", [None, 50, 500, 32000])
def test_budget_is_the_request_or_the_default_under_the_cap(asked, cap, default):
    """A large budget is never refused here (the engine clamps it to what fits); None = rest of context."""
    req = parse({"messages": USER, **({} if asked is None else {"max_tokens": asked})})
    got = chat_engine_kwargs(req, ServerDefaults(max_tokens=default, max_tokens_cap=cap))["max_tokens"]
    want = asked if asked is not None else default
    if cap is not None:
        want = cap if want is None else min(want, cap)
    assert got == want


def test_temperature_default_is_the_servers_unless_the_request_sets_one():
    assert "temperature" not in chat_engine_kwargs(parse({"messages": USER}))
    assert chat_engine_kwargs(parse({"messages": USER}), ServerDefaults(temperature=1.0))["temperature"] == 1.0
    req = parse({"messages": USER, "temperature": 0})
    assert chat_engine_kwargs(req, ServerDefaults(temperature=1.0))["temperature"] == 0


def test_model_names_aliases_and_any_name():
    strict = ServerDefaults(aliases={"gpt-4o": NAMES[0]})
    assert strict.resolve_model("gpt-4o", NAMES) == NAMES[0] == strict.resolve_model(NAMES[0], NAMES)
    err = error_of({"messages": USER, "model": "claude"}, defaults=strict)
    assert err.status == 404 and "gpt-4o" in err.message  # the aliases are offered as names
    lenient = ServerDefaults(any_model=True)
    assert lenient.resolve_model("whatever-the-client-says", NAMES) == NAMES[0]
    with pytest.raises(APIError):  # two models served: a name must mean one of them
        lenient.resolve_model("whatever", NAMES + ["other"])


def test_n_choices_are_n_engine_requests_with_distinct_seeds():
    reqs = chat_engine_requests(parse({"messages": USER, "n": 3, "seed": 7}))
    assert [r["seed"] for r in reqs] == [7, 8, 9] and all(r["messages"] == USER for r in reqs)
    assert [r.get("seed") for r in chat_engine_requests(parse({"messages": USER, "n": 2}))] == [None, None]


def test_unknown_model_is_404():
    err = error_of({"messages": USER, "model": "gpt-4o"})
    assert (err.status, err.code, err.param) == (404, "model_not_found", "model")
    assert err.to_dict()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("args, words", [("{nope", "not valid JSON"), ("[1, 2]", "JSON object")])
def test_bad_tool_call_arguments_string(args, words):
    err = error_of(
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": args}}]}]}
    )
    assert err.param == "messages.0.tool_calls.0.function.arguments" and words in err.message


# -- engine kwargs ---------------------------------------------------------------------------------


def test_engine_kwargs_mapping():
    req = parse(
        {
            "messages": USER,
            "max_tokens": 64,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 40,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "logit_bias": {"7": -100, "9": 2.5},
            "stop": "\n\n",
            "seed": 3,
        }
    )
    kw = chat_engine_kwargs(req)
    assert kw == {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 64,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "logit_bias": {7: -100.0, 9: 2.5},
        "stop": ["\n\n"],
        "seed": 3,
        "logprobs": 0,
        "tools": None,
    }


def test_unset_sampling_fields_are_left_to_the_engine():
    kw = chat_engine_kwargs(parse({"messages": USER}))
    assert kw == {"messages": USER, "stop": [], "max_tokens": None, "logprobs": 0, "tools": None}


def test_max_completion_tokens_wins_and_stop_list_drops_empties():
    kw = chat_engine_kwargs(
        parse({"messages": USER, "max_tokens": 10, "max_completion_tokens": 20, "stop": ["a", "", "b"]})
    )
    assert kw["max_tokens"] == 20 and kw["stop"] == ["a", "b"]


@pytest.mark.parametrize(
    "logprobs, top, engine", [(None, None, 0), (False, None, 0), (True, None, 1), (True, 0, 1), (True, 5, 5)]
)
def test_logprobs_mapping(logprobs, top, engine):
    body = {"messages": USER, "logprobs": logprobs}
    if top is not None:
        body["top_logprobs"] = top
    assert chat_engine_kwargs(parse(body))["logprobs"] == engine


def test_top_k_minus_one_means_disabled():
    assert chat_engine_kwargs(parse({"messages": USER, "top_k": -1}))["top_k"] == 0


def test_messages_become_plain_dicts_with_tool_arguments_as_dicts():
    req = parse(
        {
            "messages": [
                {"role": "developer", "content": "sys"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": "https://x/y.png"},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        },
                        {"id": "call_2", "type": "function", "function": {"name": "noop", "arguments": ""}},
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
        }
    )
    msgs = chat_engine_kwargs(req)["messages"]
    assert msgs[0] == {"role": "developer", "content": "sys"}  # the engine maps developer -> system
    assert msgs[1]["content"][1] == {"type": "image_url", "image_url": {"url": "https://x/y.png"}}
    assert msgs[2]["content"] == ""
    assert msgs[2]["tool_calls"][0] == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
    assert msgs[2]["tool_calls"][1]["function"]["arguments"] == {}
    assert msgs[3] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    assert all(isinstance(m, dict) for m in msgs)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_tools_pass_through_unless_tool_choice_none():
    assert chat_engine_kwargs(parse({"messages": USER, "tools": TOOLS}))["tools"] == TOOLS
    assert chat_engine_kwargs(parse({"messages": USER, "tools": TOOLS, "tool_choice": "none"}))["tools"] is None


def test_response_format_json_becomes_a_system_instruction_after_leading_system():
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    req = parse(
        {
            "messages": [{"role": "system", "content": "you add"}, {"role": "user", "content": "1+1"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        }
    )
    msgs = chat_engine_kwargs(req)["messages"]
    assert [m["role"] for m in msgs] == ["system", "system", "user"]
    assert "JSON" in msgs[1]["content"] and '"answer"' in msgs[1]["content"]
    plain = chat_engine_kwargs(parse({"messages": USER, "response_format": {"type": "text"}}))["messages"]
    assert plain == USER


# -- non-stream responses --------------------------------------------------------------------------


@pytest.mark.parametrize("engine, wire", [("stop", "stop"), ("length", "length"), ("abort", "stop")])
def test_chat_completion_shape_and_finish_reasons(engine, wire):
    body = chat_completion(result("Hello!", finish=engine), model="m", created=123)
    parsed = ChatCompletion.model_validate(body)
    assert parsed.id == "chatcmpl-req-1" and parsed.object == "chat.completion" and parsed.created == 123
    assert parsed.choices[0].message.content == "Hello!" and parsed.choices[0].message.role == "assistant"
    assert parsed.choices[0].finish_reason == wire
    assert (parsed.usage.prompt_tokens, parsed.usage.completion_tokens, parsed.usage.total_tokens) == (12, 5, 17)
    assert parsed.usage.prompt_tokens_details.cached_tokens == 4
    assert body["choices"][0]["logprobs"] is None


def test_engine_error_result_raises_500():
    with pytest.raises(APIError) as info:
        chat_completion(result("", finish="error", error="out of memory"), model="m", created=1)
    assert info.value.status == 500 and "out of memory" in info.value.message


def test_logprobs_in_response_trimmed_to_request():
    lps = [lp("Hel", -0.1, [("Hel", -0.1), ("Hi", -2.0)]), lp("lo", -0.2, [("lo", -0.2), ("p", -3.0)])]
    req = parse({"messages": USER, "logprobs": True, "top_logprobs": 1})
    body = chat_response(req, result("Hello", logprobs=lps), model="m", created=1)
    parsed = ChatCompletion.model_validate(body)
    content = parsed.choices[0].logprobs.content
    assert [c.token for c in content] == ["Hel", "lo"]
    assert [len(c.top_logprobs) for c in content] == [1, 1]
    assert content[0].bytes == list(b"Hel")
    none_top = chat_response(
        parse({"messages": USER, "logprobs": True}), result("Hello", logprobs=lps), model="m", created=1
    )
    assert none_top["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []


TOOL_TEXT = 'Let me check.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def test_parse_tool_calls_non_stream():
    content, calls = parse_tool_calls(TOOL_TEXT)
    assert content == "Let me check."
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_chat_response_with_tool_calls():
    req = parse({"messages": USER, "tools": TOOLS})
    body = chat_response(
        req,
        result('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'),
        model="m",
        created=1,
    )
    parsed = ChatCompletion.model_validate(body)
    choice = parsed.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris"}


def test_tool_markup_left_alone_without_tools_or_when_truncated():
    req = parse({"messages": USER})
    assert chat_response(req, result(TOOL_TEXT), model="m", created=1)["choices"][0]["message"]["content"] == TOOL_TEXT
    cut = 'ok <tool_call>{"name": "get_wea'
    body = chat_response(parse({"messages": USER, "tools": TOOLS}), result(cut, finish="length"), model="m", created=1)
    assert body["choices"][0]["message"]["content"] == cut and body["choices"][0]["finish_reason"] == "length"
    assert "tool_calls" not in body["choices"][0]["message"]


def test_tool_calls_after_length_keep_finish_reason_length():
    req = parse({"messages": USER, "tools": TOOLS})
    body = chat_response(req, result(TOOL_TEXT + " and then", finish="length"), model="m", created=1)
    assert body["choices"][0]["finish_reason"] == "length" and body["choices"][0]["message"]["tool_calls"]


def test_json_mode_checks_the_reply():
    req = parse({"messages": USER, "response_format": {"type": "json_object"}})
    good = chat_response(req, result('{"a": 1}'), model="m", created=1)
    assert "json_error" not in good["choices"][0]
    bad = chat_response(req, result("Sure! {a: 1}"), model="m", created=1)
    assert bad["choices"][0]["message"]["content"] == "Sure! {a: 1}"
    assert bad["choices"][0]["json_error"].startswith("content is not valid JSON")
    ChatCompletion.model_validate(bad)


def test_usage_defaults_when_engine_gave_none():
    body = chat_completion(result("x", usage=None), model="m", created=1)
    assert body["usage"]["total_tokens"] == 0
    assert USAGE.total_tokens == 17
