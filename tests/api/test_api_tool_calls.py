"""The tool-call splitter on its own, and with mlx_lm's real parsers and markers."""

import pytest

from mlx_nb.api import DEFAULT_MARKERS, ToolCallSplitter, split_tool_calls
from mlx_nb.api.tool_calls import anthropic_tool_use, default_parser, openai_tool_call

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def run(splitter, pieces):
    out = []
    for p in pieces:
        out += splitter.feed(p)
    return out + splitter.finish()


def test_default_matches_mlx_lm_json_tools():
    """Fails loudly if mlx_lm changes the convention this layer restates (to stay MLX-free)."""
    from mlx_lm.tool_parsers import json_tools

    assert DEFAULT_MARKERS == (json_tools.tool_call_start, json_tools.tool_call_end)
    assert default_parser(f" {WEATHER}\n") == json_tools.parse_tool_call(f" {WEATHER}\n", None)


def test_text_only_passes_through_unbuffered():
    s = ToolCallSplitter()
    assert s.feed("hello") == [("text", "hello")]
    assert s.feed(" <b>") == [("text", " <b>")]
    assert s.finish() == []


def test_partial_marker_held_until_decided():
    s = ToolCallSplitter()
    assert s.feed("x <tool") == [("text", "x ")]
    assert s.feed("_call>") == []
    assert s.feed(WEATHER) == []
    assert s.feed("</tool_call>after") == [
        ("tool", {"name": "get_weather", "arguments": {"city": "Paris"}}),
        ("text", "after"),
    ]


def test_parameters_key_and_list_results_are_normalised():
    content, calls = split_tool_calls('<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>')
    assert calls == [{"name": "f", "arguments": {"a": 1}}] and content == ""
    content, calls = split_tool_calls(
        '<tool_call>[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]</tool_call>'
    )
    assert [c["name"] for c in calls] == ["f", "g"]


@pytest.mark.parametrize("bad", ['{"arguments": {}}', '"just a string"', "{oops", "[]"])
def test_unparseable_calls_stay_as_text(bad):
    text = f"<tool_call>{bad}</tool_call>"
    assert split_tool_calls(text) == (text, [])


def test_qwen3_coder_parser_with_its_markers():
    from mlx_lm.tool_parsers import qwen3_coder

    tools = [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": {"properties": {"city": {"type": "string"}}}},
        }
    ]
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    s = ToolCallSplitter(qwen3_coder.parse_tool_call, (qwen3_coder.tool_call_start, qwen3_coder.tool_call_end), tools)
    out = run(s, [text[:7], text[7:30], text[30:]])
    assert out == [("tool", {"name": "get_weather", "arguments": {"city": "Paris"}})]


def test_mistral_parser_has_no_end_marker_so_the_call_runs_to_the_end():
    from mlx_lm.tool_parsers import mistral

    s = ToolCallSplitter(mistral.parse_tool_call, (mistral.tool_call_start, mistral.tool_call_end))
    out = run(s, ["Sure. [TOOL_", 'CALLS]get_weather[ARGS]{"city": ', '"Paris"}'])
    assert out == [("text", "Sure. "), ("tool", {"name": "get_weather", "arguments": {"city": "Paris"}})]


def test_call_shapes_for_each_wire_format():
    call = {"name": "f", "arguments": {"a": 1}}
    oa = openai_tool_call(call, index=2)
    assert (
        oa["index"] == 2 and oa["function"] == {"name": "f", "arguments": '{"a": 1}'} and oa["id"].startswith("call_")
    )
    an = anthropic_tool_use(call)
    assert an["type"] == "tool_use" and an["id"].startswith("toolu_") and an["input"] == {"a": 1}
    assert anthropic_tool_use({"name": "f", "arguments": '{"b": 2}'})["input"] == {"b": 2}
    assert openai_tool_call({"name": "f", "arguments": {}, "id": "mine"})["id"] == "mine"
