"""A thinking model's reasoning through the route, to the unmodified openai and anthropic SDKs, for
both families of markers: a Qwen3-style model (its template opens `<think>` in the prompt) and a
gpt-oss-style one (harmony channels it writes itself). Both fixtures are taught one reply
(mlx_nb/models/fixture_teaching.py), so every check is on exact text: `message.reasoning_content`
and `delta.reasoning_content`, Anthropic thinking blocks and thinking deltas, a Responses
`reasoning` item and its stream; a thinking budget of 16 keeping exactly the first 16 reasoning
tokens; a JSON schema holding the answer while the reasoning stays free; `enable_thinking: false`
and Anthropic's disabled thinking giving no reasoning."""

import json

import anthropic
import jsonschema
import openai
import pytest

from live_server import serving

from mlx_nb.api.openai_chat import ResponseFormat, json_instruction
from mlx_nb.models.fixture_teaching import ANSWER, REASONING

THINK, HARMONY = "tiny-qwen3-think", "tiny-gpt-oss"
ASK = [{"role": "user", "content": "What is two plus two?"}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


@pytest.fixture(scope="module", params=[THINK, HARMONY])
def live(request, tmp_path_factory):
    with serving(tmp_path_factory.mktemp("reasoning"), request.param) as server:
        server.model = request.param
        yield server


@pytest.fixture(scope="module")
def oa(live):
    return openai.OpenAI(base_url=live.url, api_key=live.key, max_retries=0)


def token_id(live, text: str) -> str:
    (i,) = live.http.post(f"{live.url}/tokenize", json={"content": text}).json()["tokens"]
    return str(i)


def test_reasoning_and_answer_arrive_apart_whole_and_streamed(live, oa):
    body = dict(model=live.model, messages=ASK, max_tokens=120, temperature=0)
    message = oa.chat.completions.create(**body).choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == (REASONING, ANSWER)
    reasoning, content, order = [], [], []
    for chunk in oa.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            if piece := (choice.delta.model_extra or {}).get("reasoning_content"):
                reasoning.append(piece)
                order.append("r")
            if choice.delta.content:
                content.append(choice.delta.content)
                order.append("c")
    assert ("".join(reasoning), "".join(content)) == (REASONING, ANSWER)
    assert order == sorted(order, key=lambda k: k != "r")  # the reasoning streams before the answer


@pytest.mark.parametrize("budget", [4, 16])
def test_a_thinking_budget_keeps_exactly_its_count_of_reasoning_tokens(live, oa, budget):
    r = oa.chat.completions.create(model=live.model, messages=ASK, max_tokens=120, temperature=0,
                                   extra_body={"reasoning_budget": budget})
    # one token per character: the fixture's tokenizer is bytes, and REASONING is ASCII
    assert r.choices[0].message.model_extra["reasoning_content"] == REASONING[:budget]
    assert r.usage.completion_tokens > budget


def test_a_schema_holds_the_answer_only(live, oa):
    fmt = {"type": "json_schema", "json_schema": {"name": "ok", "schema": SCHEMA, "strict": True}}
    for seed in range(3):
        r = oa.chat.completions.create(model=live.model, messages=ASK, max_tokens=160, temperature=1.0, seed=seed,
                                       response_format=fmt)
        message = r.choices[0].message
        jsonschema.validate(json.loads(message.content), SCHEMA)
        assert message.model_extra["reasoning_content"]  # free text, not held to the schema
    r = oa.chat.completions.create(model=live.model, messages=ASK, max_tokens=160, temperature=0, response_format=fmt)
    # greedy, the reasoning is what the same prompt (the route's JSON instruction included) reasons with
    # no schema at all: the schema holds the answer only. (Compared with the taught reply itself, this
    # would ask a fixture taught on the bare question to reason alike after a 250-token instruction.)
    instruction = {"role": "system", "content": json_instruction(ResponseFormat(**fmt))}
    free = oa.chat.completions.create(model=live.model, messages=[instruction, *ASK], max_tokens=160, temperature=0)
    assert free.choices[0].message.content != r.choices[0].message.content
    assert r.choices[0].message.model_extra["reasoning_content"] == free.choices[0].message.model_extra[
        "reasoning_content"]


def test_thinking_off_gives_no_reasoning(live, oa):
    if live.model == HARMONY:
        pytest.skip("NOT APPLICABLE: harmony models always reason (reasoning_effort sets how much)")
    r = oa.chat.completions.create(model=live.model, messages=ASK, max_tokens=40, temperature=0,
                                   logit_bias={token_id(live, "<think>"): -100},  # no block of its own making
                                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = r.choices[0].message  # the fixture is taught to answer at once when its prompt closed the block
    assert not (message.model_extra or {}).get("reasoning_content") and message.content == ANSWER


def test_anthropic_thinking_blocks_whole_and_streamed(live):
    client = anthropic.Anthropic(base_url=live.base + "/mlx", api_key=live.key, max_retries=0)
    body = dict(model=live.model, max_tokens=120, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024},
                extra_body={"temperature": 0})
    whole = client.messages.create(**body)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in whole.content] == [
        ("thinking", REASONING), ("text", ANSWER)]
    deltas = []
    with client.messages.stream(**body) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "thinking_delta":
                deltas.append(event.delta.thinking)
        final = stream.get_final_message()
    assert "".join(deltas) == REASONING
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[1].text == ANSWER
    if live.model == THINK:
        off = client.messages.create(model=live.model, max_tokens=40, messages=ASK, thinking={"type": "disabled"},
                                     extra_body={"temperature": 0})
        assert [(b.type, b.text) for b in off.content] == [("text", ANSWER)]


def test_responses_reasoning_item_whole_and_streamed(live, oa):
    body = dict(model=live.model, input="What is two plus two?", max_output_tokens=120, temperature=0,
                reasoning={"effort": "low"})
    r = oa.responses.create(**body)
    assert [item.type for item in r.output] == ["reasoning", "message"]
    assert (r.output[0].content[0].text, r.output_text) == (REASONING, ANSWER)
    streamed = []
    with oa.responses.stream(**body) as stream:
        for event in stream:
            if event.type == "response.reasoning_text.delta":
                streamed.append(event.delta)
        final = stream.get_final_response()
    assert "".join(streamed) == final.output[0].content[0].text == REASONING
    assert final.output_text == ANSWER
