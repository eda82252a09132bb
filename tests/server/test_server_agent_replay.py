"""What Claude Code and Codex really send (recorded from the unmodified CLIs by
tests/agents/record_requests.py), replayed against the routes on the tiny model.

The recorded prompts (system prompt, ~20 tool definitions) are longer than tiny-llama's context, so
a generating route must take the whole body and answer with its API's own overflow error (the one
the agent recognises and compacts on), never a validation error; count_tokens counts every tool
definition the model would read (its template renders none: the generic format)."""

import json
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from mlx_nb.api.openai_responses import parse_responses_request

RECORDED = Path(__file__).parents[1] / "agents" / "recorded"


def recorded(agent: str) -> dict:
    return json.loads((RECORDED / f"{agent}.json").read_text())


async def post(jp_fetch, parts, body: dict, headers: dict):
    try:
        r = await jp_fetch("mlx", *parts, method="POST", body=json.dumps(body).encode(), headers=headers)
        return r.code, json.loads(r.body) if r.body and r.body[:1] == b"{" else r.body
    except HTTPClientError as err:
        return err.code, json.loads(err.response.body)


def forwarded(headers: dict) -> dict:
    """The recorded headers a route may read (versions, betas), without transport ones."""
    return {k: v for k, v in headers.items() if k.startswith(("anthropic-", "openai-", "x-stainless", "user-agent"))}


async def test_claude_codes_request_reaches_the_model_and_overflows_in_anthropics_convention(jp_fetch, mlx_ready):
    rec = recorded("claude")
    body, headers = rec["body"], forwarded(rec["headers"])
    assert rec["path"].endswith("/v1/messages") and body["tools"] and body.get("stream")
    code, reply = await post(jp_fetch, ("v1", "messages"), body, headers)
    assert code == 400 and reply["type"] == "error", reply
    assert reply["error"]["type"] == "invalid_request_error"
    message = reply["error"]["message"]
    assert message.startswith("prompt is too long: ") and "system prompt and tools" in message

    counting = {k: v for k, v in body.items() if k in ("model", "messages", "system", "tools", "tool_choice", "thinking")}
    code, counted = await post(jp_fetch, ("v1", "messages", "count_tokens"), counting, headers)
    assert code == 200, counted
    code, bare = await post(jp_fetch, ("v1", "messages", "count_tokens"), {**counting, "tools": []}, headers)
    tool_bytes = sum(len(json.dumps(t.get("input_schema", {}))) + len(t.get("description", "")) for t in body["tools"])
    assert counted["input_tokens"] - bare["input_tokens"] > tool_bytes // 2  # byte tokens: the definitions are read
    assert f"{counted['input_tokens']} tokens" in message


async def test_codexs_request_reaches_the_model_and_overflows_in_openais_convention(jp_fetch, mlx_ready):
    rec = recorded("codex")
    body, headers = rec["body"], forwarded(rec["headers"])
    assert rec["path"].endswith("/v1/responses")
    kinds = {t["type"] for t in body["tools"]}
    assert "namespace" in kinds or "web_search" in kinds  # what made the route refuse Codex before

    req = parse_responses_request(body)
    functions = [t for t in body["tools"] if t["type"] == "function"]
    nested = [f for t in body["tools"] if t["type"] == "namespace" for f in t["tools"]]
    assert len(req.chat_tools()) == len(functions) + len(nested)
    assert ("web_search" not in kinds) or any("web_search" in w for w in req.warnings)

    code, reply = await post(jp_fetch, ("v1", "responses"), body, headers)
    assert code == 400, reply
    err = reply["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "input" and err["type"] == "invalid_request_error"
    assert "system prompt and tools" in err["message"]


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_recordings_carry_no_credentials(agent):
    rec = recorded(agent)
    assert not {"authorization", "x-api-key", "cookie"} & set(rec["headers"])
    assert "recording" not in json.dumps(rec["headers"])
