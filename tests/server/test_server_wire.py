"""What the clients people point at a local server need from the wire, through the real in-process
server on a tiny model: streams that open at admission and stay alive through a long prefill,
budgets that are clamped (and said so) rather than refused, `n` choices as rows of one batch,
Anthropic's count_tokens and document blocks, and the OpenAI Responses route.

Order, not timing, is asserted: which event comes before which in the bytes a client reads.
"""

import json

import pytest
from server_helpers import HELLO, MODEL, body, server_config
from sse_order import sse_items
from tornado.httpclient import HTTPClientError

LONG = "lorem ipsum dolor sit amet " * 110  # ~3000 byte tokens: ~190 prefill chunks of 16


@pytest.fixture
def jp_server_config():
    # small prefill chunks make a long prompt take many engine steps; a short keep-alive interval
    # makes "no delta for a while" happen during those steps
    return server_config(prefill_step_size=16, stream_keepalive_s=0.005)


async def post(jp_fetch, *path, request: dict, stream_into: list = None):
    kwargs = {"streaming_callback": stream_into.append} if stream_into is not None else {}
    return await jp_fetch("mlx", "v1", *path, method="POST", body=body(request), **kwargs)


def prefill_steps(engine, since: int, request_id: str) -> int:
    return sum(1 for e in engine.events(since) if e["kind"] == "prefill" and request_id in e["requests"])


async def test_chat_stream_opens_at_admission_and_keeps_alive_during_a_long_prefill(jp_fetch, mlx_ready):
    engine = mlx_ready.engine
    since = engine.events()[-1]["seq"] if engine.events() else 0
    pieces: list[bytes] = []
    ask = {"messages": [{"role": "user", "content": LONG}], "max_tokens": 3, "stream": True}
    await post(jp_fetch, "chat", "completions", request=ask, stream_into=pieces)
    items = sse_items(b"".join(pieces))
    first_content = next(i for i, it in enumerate(items) if it[0] == "event" and it[2] != "[DONE]"
                         and it[2]["choices"] and it[2]["choices"][0]["delta"].get("content"))
    role_at = next(i for i, it in enumerate(items) if it[0] == "event")
    assert items[role_at][2]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role_at < first_content
    keepalives = [i for i, it in enumerate(items[:first_content]) if it == ("comment", "keep-alive", None)]
    assert keepalives and role_at < keepalives[0], items[:first_content + 1]
    request_id = items[role_at][2]["id"].removeprefix("chatcmpl-")
    assert prefill_steps(engine, since, request_id) > 10  # it really was a long prefill


async def test_message_start_carries_the_real_prompt_size_before_any_text(jp_fetch, mlx_ready):
    pieces: list[bytes] = []
    ask = {"max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": LONG}]}
    await post(jp_fetch, "messages", request=ask, stream_into=pieces)
    items = [it for it in sse_items(b"".join(pieces))]
    events = [it for it in items if it[0] == "event"]
    assert events[0][1] == "message_start"
    counted = json.loads((await post(jp_fetch, "messages", "count_tokens", request=ask)).body)["input_tokens"]
    assert events[0][2]["message"]["usage"]["input_tokens"] == counted > 2900
    first_delta = items.index(next(it for it in items if it[1] == "content_block_delta"))
    assert ("comment", "keep-alive", None) in items[items.index(events[0]):first_delta]
    final = events[-2][2]["usage"]  # message_delta: the final split (cache reads counted apart)
    assert final["input_tokens"] + final["cache_read_input_tokens"] == counted


async def test_budgets_beyond_the_context_are_clamped_and_said_so(jp_fetch, mlx_ready):
    ask = {**HELLO, "max_tokens": 32000}
    mlx_ready.max_tokens_cap = 5
    r = await post(jp_fetch, "chat", "completions", request=ask)
    usage = json.loads(r.body)["usage"]
    assert usage["max_tokens_clamped"] == {"requested": 32000, "granted": 5} and usage["completion_tokens"] <= 5
    assert r.headers["X-MLX-Max-Tokens-Clamped"] == "32000" and r.headers["X-MLX-Max-Tokens"] == "5"
    mlx_ready.max_tokens_cap = None
    handle_budget = mlx_ready.engine.loaded.context_length - usage["prompt_tokens"]
    r = await post(jp_fetch, "messages", request={**ask, "stream": True, "max_tokens": 32000}, stream_into=[])
    assert r.headers["X-MLX-Max-Tokens"] == str(handle_budget)  # the whole rest of the context
    r = await post(jp_fetch, "chat", "completions", request={**HELLO, "max_tokens": 2})
    assert "X-MLX-Max-Tokens-Clamped" not in r.headers and "max_tokens_clamped" not in json.loads(r.body)["usage"]


async def test_n_choices_decode_in_the_same_batch_steps(jp_fetch, mlx_ready):
    engine = mlx_ready.engine
    since = engine.events()[-1]["seq"] if engine.events() else 0
    r = await post(jp_fetch, "chat", "completions", request={**HELLO, "n": 4, "max_tokens": 6})
    reply = json.loads(r.body)
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2, 3]
    assert 4 <= reply["usage"]["completion_tokens"] <= 4 * 6  # the four choices' tokens, summed
    ours = {rid for e in engine.events(since) if e["kind"] == "insert" for rid in e["requests"]}
    assert len(ours) == 4
    shared = [e for e in engine.events(since) if e["kind"] == "step" and ours <= set(e["requests"])]
    assert shared, "the four choices never decoded in one step"

    pieces: list[bytes] = []
    ask = {**HELLO, "n": 4, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    await post(jp_fetch, "chat", "completions", request=ask, stream_into=pieces)
    chunks = [it[2] for it in sse_items(b"".join(pieces)) if it[0] == "event" and it[2] != "[DONE]"]
    finished = {c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]}
    assert finished == {0, 1, 2, 3} and len({c["id"] for c in chunks}) == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] <= 16


async def test_count_tokens_matches_what_messages_reads(jp_fetch, mlx_ready):
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}]
    ask = {"system": "Be brief.", "tools": tools, "messages": [{"role": "user", "content": "hi there"}]}
    counted = json.loads((await post(jp_fetch, "messages", "count_tokens", request=ask)).body)
    reply = json.loads((await post(jp_fetch, "messages", request={**ask, "max_tokens": 1})).body)
    u = reply["usage"]
    assert counted == {"input_tokens": u["input_tokens"] + u["cache_read_input_tokens"]}
    with pytest.raises(HTTPClientError) as err:
        await post(jp_fetch, "messages", "count_tokens", request={"messages": []})
    assert err.value.code == 400 and json.loads(err.value.response.body)["type"] == "error"


async def test_documents_search_results_and_tool_result_images_reach_the_prompt(jp_fetch, mlx_ready):
    """Each block's text is read (the prompt grows by it); a tool_result image goes to the model,
    so this text-only model refuses it with a clear 400 instead of dropping it."""
    plain = {"messages": [{"role": "user", "content": "Summarise."}]}
    doc = {"type": "document", "title": "Notes", "source": {"type": "text", "media_type": "text/plain",
                                                            "data": "The meeting moved to Friday."}}
    found = {"type": "search_result", "source": "https://example.org/a", "title": "A",
             "content": [{"type": "text", "text": "Paris is the capital of France."}]}
    with_blocks = {"messages": [{"role": "user", "content": [doc, found, {"type": "text", "text": "Summarise."}]}]}
    sizes = [json.loads((await post(jp_fetch, "messages", "count_tokens", request=r)).body)["input_tokens"]
             for r in (plain, with_blocks)]
    extra = len("The meeting moved to Friday.") + len("Paris is the capital of France.")
    assert sizes[1] - sizes[0] > extra  # byte tokens: every character of both texts is in the prompt
    reply = await post(jp_fetch, "messages", request={**with_blocks, "max_tokens": 2})
    assert json.loads(reply.body)["type"] == "message"

    pixel = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    turn = [{"role": "user", "content": "Look."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "here"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": pixel}}]}]}]
    with pytest.raises(HTTPClientError) as err:
        await post(jp_fetch, "messages", request={"max_tokens": 2, "messages": turn})
    assert err.value.code == 400 and "image" in json.loads(err.value.response.body)["error"]["message"]


async def test_responses_route_create_and_stream(jp_fetch, mlx_ready):
    ask = {"model": "gpt-4.1", "instructions": "Be brief.", "max_output_tokens": 5, "temperature": 0,
           "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}
    whole = json.loads((await post(jp_fetch, "responses", request=ask)).body)
    assert whole["object"] == "response" and whole["model"] == MODEL
    assert whole["status"] in ("completed", "incomplete") and whole["usage"]["output_tokens"] <= 5
    text = whole["output"][0]["content"][0]["text"]
    pieces: list[bytes] = []
    await post(jp_fetch, "responses", request={**ask, "stream": True}, stream_into=pieces)
    events = [it for it in sse_items(b"".join(pieces)) if it[0] == "event"]
    kinds = [e[1] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == f"response.{whole['status']}"
    assert [e[2]["sequence_number"] for e in events] == list(range(len(events)))
    assert "".join(e[2]["delta"] for e in events if e[1] == "response.output_text.delta") == text
    with pytest.raises(HTTPClientError) as err:
        await post(jp_fetch, "responses", request={**ask, "previous_response_id": "resp_1"})
    assert err.value.code == 400 and "whole conversation" in json.loads(err.value.response.body)["error"]["message"]
    with pytest.raises(HTTPClientError) as err:
        await post(jp_fetch, "responses", request={**ask, "tools": [{"type": "web_search"}],
                                                    "tool_choice": {"type": "web_search"}})
    assert err.value.code == 400 and "runs no tools itself" in json.loads(err.value.response.body)["error"]["message"]
    dropped = json.loads((await post(jp_fetch, "responses", request={**ask, "tools": [{"type": "web_search"}]})).body)
    assert dropped["status"] in ("completed", "incomplete") and "'web_search' was dropped" in dropped["warnings"][0]
