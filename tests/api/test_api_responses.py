"""OpenAI Responses: input items -> engine messages, refusals, and the stream's event sequence."""

import json

import pytest
from api_fakes import USAGE, deltas, feed_all, result

from mlx_nb.api import APIError, ResponsesStream, parse_responses_request, responses_engine_kwargs, responses_response

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def kwargs(body):
    return responses_engine_kwargs(parse_responses_request(body))


def test_string_input_and_instructions():
    kw = kwargs({"input": "hi", "instructions": "Be brief.", "max_output_tokens": 7})
    assert kw["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert kw["max_tokens"] == 7 and kw["tools"] is None


def test_items_become_one_conversation():
    kw = kwargs({"tools": [TOOL], "input": [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Weather here?"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": ""},
        {"type": "reasoning", "summary": []},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
    ]})
    roles = [m["role"] for m in kw["messages"]]
    assert roles == ["developer", "user", "assistant", "tool", "tool"]
    assert kw["messages"][1]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    calls = kw["messages"][2]["tool_calls"]  # text and both calls: one assistant turn
    assert kw["messages"][2]["content"] == "Checking." and [c["id"] for c in calls] == ["call_1", "call_2"]
    assert calls[0]["function"]["arguments"] == {"city": "Paris"} and calls[1]["function"]["arguments"] == {}
    assert kw["messages"][4] == {"role": "tool", "tool_call_id": "call_2", "content": "rain"}
    assert kw["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("body, words", [
    ({"input": "hi", "previous_response_id": "resp_1"}, "whole conversation"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "send the items themselves"),
    ({"input": "hi", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "runs no tools itself"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input_text"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]}, "not valid JSON"),
    ({"input": ""}, "empty"),
])
def test_refusals_are_one_line_400s(body, words):
    with pytest.raises(APIError) as info:
        kwargs(body)
    assert info.value.status == 400 and words in info.value.message and "\n" not in info.value.message


def test_stream_events_and_the_whole_response_agree():
    req = parse_responses_request({"input": "hi", "tools": [TOOL], "stream": True})
    text = 'Let me check.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    stream = ResponsesStream(req, model="m", created=1, request_id="r1")
    events = stream.start() + feed_all(stream, deltas([text[:5], text[5:20], text[20:]], rid="r1"))
    kinds = [k for k, _ in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert "".join(d["delta"] for k, d in events if k == "response.output_text.delta") == "Let me check."
    final = events[-1][1]["response"]
    whole = responses_response(req, result(text, rid="r1"), model="m", created=1)
    assert [i["type"] for i in final["output"]] == [i["type"] for i in whole["output"]] == ["message", "function_call"]
    assert json.loads(final["output"][1]["arguments"]) == {"city": "Paris"} == json.loads(whole["output"][1]["arguments"])
    assert final["usage"]["input_tokens"] == USAGE.prompt_tokens == whole["usage"]["input_tokens"]
    cut = responses_response(req, result("partial", finish="length"), model="m", created=1)
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}


def test_hosted_tools_are_dropped_with_a_warning_not_refused(caplog):
    """Codex lists hosted tools by default: they are left out, and the response and log say so."""
    from mlx_nb.api.openai_responses import parse_responses_request, response_object

    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    req = parse_responses_request({"input": "hi", "tools": [weather, {"type": "web_search"}, {"type": "file_search"}]})
    with caplog.at_level("WARNING", logger="mlx_nb.api"):
        kw = kwargs({"input": "hi", "tools": [weather, {"type": "web_search"}]})
    assert [t["function"]["name"] for t in kw["tools"]] == ["get_weather"]
    assert "web_search" in caplog.text
    body = response_object(req, response_id="resp_1", model="m", created=0, output=[], status="completed")
    assert [t["type"] for t in body["tools"]] == ["function"]
    assert len(body["warnings"]) == 2 and "'web_search' was dropped" in body["warnings"][0]


def test_namespace_tools_reach_the_model_and_calls_name_their_namespace():
    """Codex groups client-run functions as `namespace` tools: each is a function the model can call,
    and a call comes back (whole and streamed) under the client's name with its `namespace`."""
    spawn = {"type": "function", "name": "spawn", "description": "Start one.", "parameters": {"type": "object"}}
    body = {"input": [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "call_1", "name": "spawn", "namespace": "agents", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "started"},
    ], "tools": [
        TOOL, {"type": "web_search"},
        {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [spawn]},
        {"type": "namespace", "name": "jobs", "tools": [spawn, {**TOOL, "name": "wait"}]},
    ]}
    req = parse_responses_request(body)
    kw = responses_engine_kwargs(req)
    names = [t["function"]["name"] for t in kw["tools"]]
    assert names == ["get_weather", "agents__spawn", "jobs__spawn", "wait"]  # shared names are qualified
    assert kw["tools"][1]["function"]["description"] == "Sub-agents. Start one."
    assert kw["messages"][1]["tool_calls"][0]["function"]["name"] == "agents__spawn"  # history in model names
    text = '<tool_call>{"name": "jobs__spawn", "arguments": {}}</tool_call><tool_call>{"name": "wait", "arguments": {}}</tool_call>'
    whole = responses_response(req, result(text, rid="r1"), model="m", created=1)
    calls = [(i["name"], i.get("namespace")) for i in whole["output"] if i["type"] == "function_call"]
    assert calls == [("spawn", "jobs"), ("wait", "jobs")]
    stream = ResponsesStream(req, model="m", created=1, request_id="r1")
    events = stream.start() + feed_all(stream, deltas([text], rid="r1"))
    done = [d["item"] for k, d in events if k == "response.output_item.done" and d["item"]["type"] == "function_call"]
    assert [(i["name"], i["namespace"]) for i in done] == calls
    assert [t["type"] for t in whole["tools"]] == ["function", "namespace", "namespace"]


def test_a_namespace_holds_only_functions():
    with pytest.raises(APIError) as info:
        kwargs({"input": "hi", "tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]})
    assert info.value.status == 400 and "only function tools" in info.value.message
