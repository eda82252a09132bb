"""Tools reach every model: natively where the chat template renders them, inlined in the generic
format (mlx_nb.engine.inputs.generic_tools) where it does not; count_tokens counts what the model reads."""

import json

import pytest
from mlx_lm.utils import load_tokenizer

from mlx_nb.api.openai_chat import parse_tool_calls
from mlx_nb.engine.inputs.messages import normalize_messages
from mlx_nb.engine.inputs.prompts import chat_tool_format, encode_prompt, render_chat
from mlx_nb.models.fixtures import tiny_names
from mlx_nb.models.sources import resolve

TOOLS = [
    {"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Tool number {i}",
        "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}}}
    for i in range(25)
]
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Use a tool."}]
HISTORY = ASK + [
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "tool_3", "arguments": '{"arg": "x"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "the result 0451"},
    {"role": "user", "content": "And now?"},
]
NAMES = [*tiny_names(), "smollm2-135m-instruct"]


@pytest.fixture(scope="module", params=NAMES)
def tokenizer(request):
    return request.param, load_tokenizer(resolve(request.param))


def native(tok, messages, tools):
    return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)


def test_tools_are_in_the_prompt_whatever_the_template(tokenizer):
    name, tok = tokenizer
    fmt = chat_tool_format(tok)
    messages = normalize_messages(ASK)
    with_tools = render_chat(tok, messages, TOOLS)
    assert all(f'"tool_{i}"' in with_tools for i in range(25)), f"{name}: a tool is missing from the prompt"
    assert "Be brief." in with_tools and "Use a tool." in with_tools
    if fmt == "template":  # the template's own rendering, untouched
        assert with_tools == native(tok, messages, TOOLS)
    else:
        assert native(tok, messages, TOOLS) == native(tok, messages, None), f"{name} renders tools after all"
        assert "<tool_call>" in with_tools and with_tools.index("Be brief.") < with_tools.index('"tool_0"')
    plain = len(encode_prompt(tok, render_chat(tok, messages), chat=True))
    assert len(encode_prompt(tok, with_tools, chat=True)) > plain + 25 * 10  # every definition is read


def test_a_tool_history_renders_on_every_template(tokenizer):
    """Earlier calls and results reach the model in the markup it was told to use, with the turns
    still alternating for strict templates."""
    name, tok = tokenizer
    text = render_chat(tok, normalize_messages(HISTORY), TOOLS)
    assert "the result 0451" in text and "And now?" in text and "tool_3" in text
    if chat_tool_format(tok) == "generic":
        assert '<tool_call>\n{"name": "tool_3", "arguments": {"arg": "x"}}\n</tool_call>' in text
        assert "<tool_response>\nthe result 0451\n</tool_response>" in text


def test_the_generic_example_is_parsed_back_by_the_route_parser():
    """What the generic prompt tells the model to write is what the routes parse as a call."""
    tok = load_tokenizer(resolve("tiny-llama"))
    assert chat_tool_format(tok) == "generic"
    prompt = render_chat(tok, normalize_messages(ASK), TOOLS[:1])
    start = prompt.index("<tool_call>\n")
    example = prompt[start:prompt.index("\n</tool_call>", start) + len("\n</tool_call>")]
    content, calls = parse_tool_calls(f"Calling it.\n{example}", TOOLS[:1], None, None)
    assert content.strip() == "Calling it." and len(calls) == 1
    assert calls[0]["function"]["name"] == "tool_0" and json.loads(calls[0]["function"]["arguments"]) == {"arg": "..."}


def test_the_default_model_gets_tools_in_the_generic_format():
    assert chat_tool_format(load_tokenizer(resolve("smollm2-135m-instruct"))) == "generic"
    assert chat_tool_format(load_tokenizer(resolve("tiny-qwen3.5"))) == "template"
