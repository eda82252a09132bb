"""Normalize a chat before templating, so strict templates (Qwen 3.5's) accept what clients send.

- `developer` -> `system`; every system message hoisted to the front and merged into one;
- consecutive same-role messages merged (strings joined with a blank line, list parts concatenated
  with images kept where the user put them);
- `tool` messages and assistant `tool_calls` kept in the template's native form, with function
  arguments given as dicts (templates iterate them).
The whole conversation is templated, never only its last user message.
"""

from __future__ import annotations

import json
from typing import Any

from mlx_nb.engine.types import RequestError

ROLE_ALIASES = {"developer": "system"}
ROLES = {"system", "user", "assistant", "tool"}
_PART_TYPES = {"text", "image_url", "image", "input_image"}


def normalize_messages(messages: Any) -> list[dict]:
    """A validated, template-safe copy of `messages` (the input is not modified)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", "messages")
    system_parts: list = []
    turns: list[dict] = []
    for i, raw in enumerate(messages):
        msg = _validate(raw, i)
        if msg["role"] == "system":
            system_parts.append(msg["content"])
            continue
        if turns and _mergeable(turns[-1], msg):
            turns[-1]["content"] = _join(turns[-1]["content"], msg["content"])
        else:
            turns.append(msg)
    if system_parts:
        content = system_parts[0]
        for part in system_parts[1:]:
            content = _join(content, part)
        turns.insert(0, {"role": "system", "content": content})
    return turns


def _validate(raw: Any, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise RequestError(f"{where} must be an object with role and content", where)
    role = raw.get("role")
    role = ROLE_ALIASES.get(role, role)
    if role not in ROLES:
        raise RequestError(
            f"{where}.role {raw.get('role')!r} is not one of system, developer, user, assistant, tool",
            f"{where}.role",
        )
    content = raw.get("content")
    if content is None:
        if not (role == "assistant" and raw.get("tool_calls")):
            raise RequestError(f"{where}.content is missing: give a string or a list of parts", f"{where}.content")
        content = ""
    elif isinstance(content, list):
        content = [_validate_part(p, f"{where}.content[{j}]") for j, p in enumerate(content)]
    elif not isinstance(content, str):
        raise RequestError(
            f"{where}.content must be a string or a list of parts, not {type(content).__name__}",
            f"{where}.content",
        )
    msg = {"role": role, "content": content}
    if role == "assistant":  # a thinking model's earlier reasoning, under the names templates read
        reasoning = next((raw[k] for k in ("reasoning_content", "reasoning", "thinking") if isinstance(raw.get(k), str)),
                         None)
        if reasoning:
            msg["reasoning_content"] = msg["thinking"] = reasoning
    if role == "assistant" and raw.get("tool_calls"):
        msg["tool_calls"] = [_tool_call(tc, f"{where}.tool_calls[{j}]") for j, tc in enumerate(raw["tool_calls"])]
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if raw.get(key) is not None:
                msg[key] = raw[key]
        if isinstance(content, list):
            msg["content"] = "".join(p.get("text", "") for p in content)
    return msg


def _validate_part(part: Any, where: str) -> dict:
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if not isinstance(part, dict) or part.get("type") not in _PART_TYPES:
        raise RequestError(f"{where} must be a text or image part ({{'type': 'text', 'text': ...}})", where)
    if part["type"] == "text" and not isinstance(part.get("text"), str):
        raise RequestError(f"{where}.text must be a string", f"{where}.text")
    return dict(part)


def _tool_call(tc: Any, where: str) -> dict:
    if not isinstance(tc, dict) or not isinstance(tc.get("function"), dict):
        raise RequestError(f"{where} must be {{'type': 'function', 'function': {{name, arguments}}}}", where)
    fn = dict(tc["function"])
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            raise RequestError(f"{where}.function.arguments is not valid JSON: {exc.msg}", where) from exc
    fn["arguments"] = args
    out = {"type": "function", "function": fn}
    if tc.get("id"):
        out["id"] = tc["id"]
    return out


def _mergeable(prev: dict, msg: dict) -> bool:
    # Tool results and tool-calling turns keep their own messages: templates render them natively.
    return (
        prev["role"] == msg["role"]
        and msg["role"] in ("user", "assistant")
        and "tool_calls" not in prev
        and "tool_calls" not in msg
        and "reasoning_content" not in prev
        and "reasoning_content" not in msg
    )


def _join(a: Any, b: Any) -> Any:
    if isinstance(a, str) and isinstance(b, str):
        return f"{a}\n\n{b}" if a and b else a or b
    return _as_parts(a) + [{"type": "text", "text": "\n\n"}] + _as_parts(b)


def _as_parts(content: Any) -> list:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def has_images(messages: list[dict]) -> bool:
    return any(
        isinstance(m["content"], list) and any(p["type"] != "text" for p in m["content"]) for m in messages
    )
