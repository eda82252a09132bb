"""Response pieces the two OpenAI routes share: finish reasons, usage, logprobs, error chunks.

Finish reasons: the engine's "abort" (the caller cancelled, or the client went away) becomes
"stop" — OpenAI has no value for it, the text so far is a valid reply, and SDKs reject unknown
values. "error" never reaches these builders as a finish reason: the route raises/sends an error.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from mlx_nb.api.ids import prefixed_id
from mlx_nb.engine import TokenLogprob, Usage

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "stop"}


def finish_reason(engine_reason: Optional[str], *, tool_calls: bool = False) -> Optional[str]:
    """OpenAI's finish_reason; a reply that ended naturally after a tool call is "tool_calls"."""
    if engine_reason is None:
        return None
    reason = FINISH_REASONS.get(engine_reason, "stop")
    return "tool_calls" if tool_calls and reason == "stop" else reason


def usage_dict(usage: Optional[Usage]) -> dict:
    u = usage or Usage()
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


_ID_PREFIX = {"chat.completion": "chatcmpl-", "text_completion": "cmpl-"}


def choices_body(kind: str, results: list, choices: list[dict], *, model: str, created: int) -> dict:
    """A whole `chat.completion` / `text_completion` body around its choices (one Result each)."""
    return {
        "id": prefixed_id(_ID_PREFIX[kind], results[0].request_id),
        "object": kind,
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_of_choices([r.usage for r in results]),
    }


def usage_of_choices(usages: list[Optional[Usage]]) -> dict:
    """`n` choices of one prompt: the prompt counted once, completion tokens summed."""
    first = usages[0] or Usage()
    total = Usage(first.prompt_tokens, sum(u.completion_tokens for u in usages if u), first.cached_tokens)
    return usage_dict(total)


def choice_requests(kwargs: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """`n` engine requests for `n` choices; a seeded request gets seeds seed, seed+1, ... so the
    choices differ yet each stays reproducible."""
    out = []
    for i in range(n):
        one = dict(kwargs)
        if i and one.get("seed") is not None:
            one["seed"] = one["seed"] + i
        out.append(one)
    return out


def json_error(text: str) -> Optional[str]:
    """None if `text` parses as JSON, else a one-line reason (for response_format json modes)."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return f"content is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    return None


def _entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_logprobs(logprobs: list[TokenLogprob], top: Optional[int] = None) -> Optional[dict]:
    """Chat shape: `{"content": [{token, logprob, bytes, top_logprobs: [...]}]}`; `top` trims the
    alternatives to what the client asked for (None keeps what the engine sent)."""
    if not logprobs:
        return None
    content = []
    for lp in logprobs:
        alts = lp.top if top is None else lp.top[:top]
        content.append({**_entry(lp.token, lp.logprob), "top_logprobs": [_entry(t, p) for t, p in alts]})
    return {"content": content, "refusal": None}


def completion_logprobs(logprobs: list[TokenLogprob], top: Optional[int] = None, offset: int = 0) -> Optional[dict]:
    """Legacy completions shape: parallel lists, alternatives as `{token: logprob}` maps."""
    if not logprobs:
        return None
    offsets, pos = [], offset
    for lp in logprobs:
        offsets.append(pos)
        pos += len(lp.token)
    return {
        "tokens": [lp.token for lp in logprobs],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [dict(lp.top if top is None else lp.top[:top]) for lp in logprobs],
        "text_offset": offsets,
    }


def error_chunk(message: str) -> dict:
    """What a stream sends when the engine fails mid-reply: the openai SDK raises on an `error` key."""
    return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
