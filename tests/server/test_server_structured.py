"""Structured outputs through the route, used by unmodified clients as their docs say: the openai
SDK's `chat.completions.parse` and `responses.parse` with a pydantic model, langchain-openai's
`with_structured_output` (JSON schema and function calling), a required or named tool call on the
OpenAI and Anthropic routes, llama.cpp/vLLM extension fields, and a clear 400 for a schema that
cannot compile. The tiny model samples at the server's default temperature (1.0): only the
constraint makes its output parse. The server runs in this test's event loop: the clients are
their async forms."""

import json
import os
import re
from typing import Annotated, Literal, Optional

import anthropic
import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from server_helpers import MODEL

from jupyter_ext.keys import KEY_FILE

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "Tell me about a person."}]


class Address(BaseModel):
    city: str = Field(max_length=20)
    zip: Optional[int] = Field(None, ge=0, le=99999)


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=130)
    role: Literal["admin", "user", "guest"]
    address: Address
    tags: list[Annotated[str, Field(max_length=10)]] = Field(max_length=3)  # bounded: a random model never ends a string


@pytest.fixture
def server(jp_serverapp, jp_runtime_dir, http_server, mlx_ready):
    url = os.environ["MLX_NB_URL"]
    return url, url.removesuffix("/v1"), (jp_runtime_dir / KEY_FILE).read_text().strip()


async def test_openai_sdk_parse_returns_the_pydantic_model(server):
    url, _, key = server
    client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
    for seed in range(3):
        completion = await client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Person, seed=seed,
                                                   max_tokens=400)
        assert completion.choices[0].finish_reason == "stop"
        assert isinstance(completion.choices[0].message.parsed, Person)
    response = await client.responses.parse(model=MODEL, input="Tell me about a person.", text_format=Person,
                                      max_output_tokens=400)
    assert isinstance(response.output_parsed, Person)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
async def test_langchain_with_structured_output(server, method):
    from langchain_openai import ChatOpenAI

    url, _, key = server
    llm = ChatOpenAI(model=MODEL, base_url=url, api_key=key, max_retries=0, max_tokens=400)
    structured = llm.with_structured_output(Person, method=method, strict=True)  # objects closed to their keys
    for _ in range(2):
        assert isinstance(await structured.ainvoke("Tell me about a person."), Person)


async def test_a_required_or_named_tool_call_is_held_to_its_schema(server):
    url, _, key = server
    client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        for seed in range(3):
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                tool_choice=choice, seed=seed, max_tokens=300)
            assert raw.headers["x-mlx-tool-choice"] == "enforced"
            message = raw.parse().choices[0]
            assert message.finish_reason == "tool_calls", message
            (call,) = message.message.tool_calls
            if isinstance(choice, dict):
                assert call.function.name == "get_weather"
            schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.function.name)
            jsonschema.validate(json.loads(call.function.arguments), schema)


async def test_anthropic_tool_choice_any_and_tool(server):
    _, base, key = server
    client = anthropic.AsyncAnthropic(base_url=base, api_key=key, max_retries=0)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_time"}):
        message = await client.messages.create(model=MODEL, max_tokens=300, tools=tools, tool_choice=choice,
                                         messages=[{"role": "user", "content": "What time is it?"}])
        assert message.stop_reason == "tool_use"
        (use,) = [b for b in message.content if b.type == "tool_use"]
        if choice["type"] == "tool":
            assert use.name == "get_time"
        jsonschema.validate(use.input, next(t["input_schema"] for t in tools if t["name"] == use.name))


async def test_extension_fields_and_completions(server):
    url, _, key = server
    client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
    text = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=50,
                                          extra_body={"guided_regex": "[a-z]{3,8}@[a-z]{3,8}\\.(com|org)"})
    assert re.fullmatch(r"[a-z]{3,8}@[a-z]{3,8}\.(com|org)", text.choices[0].message.content)
    gbnf = await client.completions.create(model=MODEL, prompt="Answer:", max_tokens=20,
                                     extra_body={"grammar": 'root ::= ("yes" | "no") "."'})
    assert gbnf.choices[0].text in ("yes.", "no.")
    point = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}}
    for seed in range(3):  # strict: the object is closed to its keys (else a random model invents some)
        schema = await client.completions.create(model=MODEL, prompt="JSON:", max_tokens=200, seed=seed, extra_body={
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": point, "strict": True}}})
        assert set(json.loads(schema.choices[0].text)) <= {"x"}


async def test_a_schema_that_cannot_compile_is_a_clear_400(server):
    url, _, key = server
    client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
        "a": {"type": "strnig"}}}}}
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model=MODEL, messages=ASK, response_format=bad)
    message = err.value.body["message"]
    assert "response_format" in message and "strnig" in message and "\n" not in message
    with pytest.raises(openai.BadRequestError, match="give one output constraint"):
        await client.chat.completions.create(model=MODEL, messages=ASK, response_format={"type": "json_object"},
                                       extra_body={"guided_regex": "a+"})
    with pytest.raises(openai.BadRequestError, match="not one of the tools"):
        await client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(f"{url}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                            json={"model": MODEL, "messages": ASK, "max_tokens": 2})
    assert r.status_code == 200  # and it goes on serving
