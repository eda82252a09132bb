"""Real client libraries from the package registry, unmodified and used as their docs say, against
the real in-process server and holding its scoped mlx API key: langchain-openai, litellm (openai and
anthropic providers), the openai SDK's Responses API and the anthropic SDK's count_tokens.

None of these clients sends a budget unless told to, so each answer must come back whole: the
engine is made to write a known reply longer than the old 256-token default (a forcing logits
processor added to its submits: a random model never ends on its own), and each test asserts the
whole text and a natural finish ("stop" / end_turn / completed), never a silent cut.
"""

import json
import os

import pytest
from forcing import forced
from server_helpers import MODEL

from jupyter_ext.keys import KEY_FILE

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm's documented offline switch

ANSWER = "The answer is forty-two. " * 14  # 350 byte tokens: longer than any 256-token default
WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
HI = [{"role": "user", "content": "What is the answer?"}]


@pytest.fixture
def say(mlx_ready, monkeypatch):
    """`say(text)`: from now on every request's reply is exactly `text`, then end of turn."""
    engine = mlx_ready.engine
    tok = engine.loaded.tokenizer
    submit = engine.submit_requests
    ids: list[int] = []
    monkeypatch.setattr(engine, "submit_requests", lambda reqs: submit([forced(req, ids) for req in reqs]))

    def set_reply(text: str) -> None:
        ids[:] = tok.encode(text, add_special_tokens=False) + [sorted(tok.eos_token_ids)[0]]

    set_reply(ANSWER)
    return set_reply


@pytest.fixture
def server(jp_serverapp, jp_runtime_dir, http_server, mlx_ready):
    """(OpenAI-style base URL, Anthropic-style base URL, key) of the test server: the scoped mlx API
    key the server generated, what a user hands these clients (never the Jupyter token)."""
    url = os.environ["MLX_NB_URL"]
    return url, url.removesuffix("/v1"), (jp_runtime_dir / KEY_FILE).read_text().strip()


async def test_langchain_openai_invoke_stream_and_tools(server, say):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    url, _, key = server
    llm = ChatOpenAI(model="gpt-4o-mini", base_url=url, api_key=key, max_retries=0)
    reply = await llm.ainvoke("What is the answer?")
    assert reply.content == ANSWER and reply.response_metadata["finish_reason"] == "stop"
    assert reply.response_metadata["model_name"] == MODEL

    chunks = [chunk async for chunk in llm.astream("What is the answer?")]
    assert "".join(c.content for c in chunks) == ANSWER
    assert chunks[-1].response_metadata.get("finish_reason") == "stop" or any(
        c.response_metadata.get("finish_reason") == "stop" for c in chunks)

    @tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        return "sunny"

    say(CALL)
    called = await llm.bind_tools([get_weather]).ainvoke("Weather in Paris?")
    assert called.tool_calls and called.tool_calls[0]["name"] == "get_weather"
    assert called.tool_calls[0]["args"] == {"city": "Paris"}
    assert called.response_metadata["finish_reason"] == "tool_calls"


async def test_litellm_openai_and_anthropic_providers(server, say):
    import litellm

    url, anthropic_base, key = server
    reply = await litellm.acompletion(model="openai/local-model", api_base=url, api_key=key, messages=HI)
    assert reply.choices[0].message.content == ANSWER and reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == len(ANSWER) + 1  # every byte, and the end of turn

    stream = await litellm.acompletion(model="openai/local-model", api_base=url, api_key=key, messages=HI,
                                       stream=True)
    text, reasons = "", []
    async for chunk in stream:
        text += chunk.choices[0].delta.content or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert text == ANSWER and "stop" in reasons

    claude = dict(model="anthropic/claude-sonnet-4-5", api_base=anthropic_base, api_key=key, messages=HI)
    reply = await litellm.acompletion(**claude)
    assert reply.choices[0].message.content == ANSWER and reply.choices[0].finish_reason == "stop"
    stream = await litellm.acompletion(**claude, stream=True)
    text, reasons = "", []
    async for chunk in stream:
        text += chunk.choices[0].delta.content or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert text == ANSWER and "stop" in reasons


async def test_openai_responses_api(server, say):
    import openai

    url, _, key = server
    client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
    made = await client.responses.create(model="gpt-4.1-mini", instructions="Answer.", input="What is the answer?")
    assert made.status == "completed" and made.output_text == ANSWER and made.model == MODEL
    assert made.usage.output_tokens == len(ANSWER) + 1

    deltas = []
    async with client.responses.stream(model="gpt-4.1-mini", input=HI) as stream:
        async for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = await stream.get_final_response()
    assert "".join(deltas) == ANSWER == final.output_text and final.status == "completed"

    say(CALL)
    tool = {"type": "function", **WEATHER}
    asked = await client.responses.create(model="gpt-4.1-mini", input="Weather in Paris?", tools=[tool])
    (call,) = [item for item in asked.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    say("It is sunny in Paris.")
    answered = await client.responses.create(
        model="gpt-4.1-mini", tools=[tool],
        input=[{"role": "user", "content": "Weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert answered.output_text == "It is sunny in Paris."


async def test_anthropic_count_tokens_and_a_whole_answer(server, say):
    import anthropic

    _, base, key = server
    client = anthropic.AsyncAnthropic(base_url=base, api_key=key, max_retries=0)
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}]
    ask = dict(model="claude-team-default", system="Be exact.", messages=HI, tools=tools)
    counted = await client.messages.count_tokens(**ask)
    message = await client.messages.create(**ask, max_tokens=16000)  # beyond the context: clamped, not refused
    assert message.content[0].text == ANSWER and message.stop_reason == "end_turn"
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens
    async with client.messages.stream(**ask, max_tokens=32000) as stream:  # what Claude Code sends
        start = None
        async for event in stream:
            start = start or event
        final = await stream.get_final_message()
    assert start.type == "message_start" and start.message.usage.input_tokens == counted.input_tokens
    assert final.content[0].text == ANSWER and final.stop_reason == "end_turn"


async def test_context_overflow_is_recognised_by_each_sdk(server):
    """A prompt past the context ends in each API's own overflow error, which the official SDKs
    raise as a bad request and coding agents recognise (to compact the conversation)."""
    import anthropic
    import openai

    url, anthropic_url, key = server
    system = {"role": "system", "content": "You are a careful assistant. " * 10}
    long = {"role": "user", "content": "x" * 5000}
    oa = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        await oa.chat.completions.create(model=MODEL, messages=[system, long], max_tokens=4)
    err = info.value
    assert err.code == "context_length_exceeded" and err.param == "messages"
    assert "maximum context length is 4096 tokens" in err.message and "system prompt and tools" in err.message
    with pytest.raises(openai.BadRequestError) as info:
        await oa.responses.create(model=MODEL, input="x" * 5000, instructions="Be brief.", max_output_tokens=4)
    assert info.value.code == "context_length_exceeded" and info.value.param == "input"
    assert "your input resulted in" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        await oa.completions.create(model=MODEL, prompt="x" * 5000, max_tokens=4)
    assert info.value.code == "context_length_exceeded" and info.value.param == "prompt"
    an = anthropic.AsyncAnthropic(base_url=anthropic_url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as info:
        await an.messages.create(model=MODEL, max_tokens=4, system="Be brief. " * 20,
                                 messages=[{"role": "user", "content": "x" * 5000}])
    body = info.value.body
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("prompt is too long: ") and "> 4095 maximum" in body["error"]["message"]


async def test_a_tool_round_trip_on_every_route_of_a_model_without_template_tools(server, say, mlx_ready):
    """tiny-llama's template renders no tools: each route inlines them in the generic format (the
    prompt grows by the definitions, a header says so), the model's call comes back as each API's
    tool call, whole and streamed, and the next turn carrying the result is read."""
    import anthropic
    import openai

    url, base, key = server
    assert mlx_ready.engine.tool_format() == "generic"
    oa = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
    an = anthropic.AsyncAnthropic(base_url=base, api_key=key, max_retries=0)
    chat_tools = [{"type": "function", "function": WEATHER}]
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    say(CALL)

    raw = await oa.chat.completions.with_raw_response.create(model=MODEL, messages=ask, tools=chat_tools)
    assert raw.headers["x-mlx-tool-format"] == "generic"
    called = raw.parse()
    (made,) = called.choices[0].message.tool_calls
    assert made.function.name == "get_weather" and json.loads(made.function.arguments) == {"city": "Paris"}
    plain = await oa.chat.completions.create(model=MODEL, messages=ask)
    grown = called.usage.prompt_tokens - plain.usage.prompt_tokens
    assert grown > len(json.dumps(WEATHER))  # byte tokens: the whole definition was read

    tools = [{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}]
    counted = await an.messages.count_tokens(model=MODEL, messages=ask, tools=tools)
    assert counted.input_tokens - (await an.messages.count_tokens(model=MODEL, messages=ask)).input_tokens > 100
    raw = await an.messages.with_raw_response.create(model=MODEL, max_tokens=200, messages=ask, tools=tools)
    assert raw.headers["x-mlx-tool-format"] == "generic"
    message = await raw.parse()
    (use,) = [b for b in message.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and message.stop_reason == "tool_use"
    async with an.messages.stream(model=MODEL, max_tokens=200, messages=ask, tools=tools) as stream:
        final = await stream.get_final_message()
    assert [b.input for b in final.content if b.type == "tool_use"] == [{"city": "Paris"}]
    say("It is sunny in Paris.")
    answered = await an.messages.create(model=MODEL, max_tokens=200, tools=tools, messages=[
        *ask, {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}])
    assert answered.content[0].text == "It is sunny in Paris."
    assert answered.usage.input_tokens > message.usage.input_tokens  # the call and its result were read

    say(CALL)
    tool = {"type": "function", **WEATHER}
    events = []
    async with oa.responses.stream(model=MODEL, input="Weather in Paris?", tools=[tool]) as stream:
        async for event in stream:
            events.append(event.type)
        final = await stream.get_final_response()
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {"city": "Paris"} and "response.function_call_arguments.done" in events
