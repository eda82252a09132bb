"""Anthropic Messages (`/v1/messages`): request JSON -> engine kwargs, Result -> `message` JSON.

The engine speaks one (OpenAI-style) message format, so Anthropic's is translated into it:
`system` becomes a leading system message; assistant `tool_use` blocks become `tool_calls`;
user `tool_result` blocks become `role: "tool"` messages (placed before the rest of that user
turn, as Anthropic requires them first; `is_error` results are prefixed "Error: "); images become
`image_url` parts with a `data:` URL; tools become OpenAI function tools. `thinking` blocks are
dropped. `max_tokens` is required, as in Anthropic's API. `tool_choice` "none" withholds the tools;
"any" / "tool" cannot be enforced without constrained decoding and act as "auto".
The stream translator lives in `anthropic_stream.py` (re-exported here).
"""

from __future__ import annotations

from typing import Any, Iterable, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from mlx_nb.api.anthropic_stream import MessagesStream, anthropic_usage, stop_reason
from mlx_nb.api.errors import server_error
from mlx_nb.api.ids import prefixed_id
from mlx_nb.api.request_common import (
    WireModel,
    check_max_tokens,
    check_model,
    load_body,
    stop_list,
    validate,
)
from mlx_nb.api.tool_calls import ToolParser, anthropic_tool_use, split_tool_calls
from mlx_nb.engine.types import Result

__all__ = [
    "MessagesRequest",
    "MessagesStream",
    "anthropic_message",
    "messages_engine_kwargs",
    "messages_response",
    "parse_messages_request",
]


class Source(WireModel):
    type: Literal["base64", "url"]
    media_type: Optional[str] = None
    data: Optional[str] = None
    url: Optional[str] = None

    def as_url(self) -> str:
        if self.type == "url":
            if not self.url:
                raise ValueError("a url image source needs 'url'")
            return self.url
        if not (self.media_type and self.data):
            raise ValueError("a base64 image source needs 'media_type' and 'data'")
        return f"data:{self.media_type};base64,{self.data}"


class Block(WireModel):
    """One flat content-block model (not a tagged union), so errors name plain paths."""

    type: Literal["text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"]
    text: Optional[str] = None
    source: Optional[Source] = None
    id: Optional[str] = None
    name: Optional[str] = None
    input: Optional[dict] = None
    tool_use_id: Optional[str] = None
    content: Union[str, list["Block"], None] = None
    is_error: Optional[bool] = None

    @model_validator(mode="after")
    def _required(self) -> "Block":
        need = {"text": ("text",), "image": ("source",), "tool_use": ("id", "name"), "tool_result": ("tool_use_id",)}
        for key in need.get(self.type, ()):
            if getattr(self, key) is None:
                raise ValueError(f"a {self.type} block needs '{key}'")
        if self.type == "image":
            self.source.as_url()  # raises with a clear message when incomplete
        return self


class AnthropicMessage(WireModel):
    role: Literal["user", "assistant"]
    content: Union[str, list[Block]]


class AnthropicTool(WireModel):
    name: str
    description: Optional[str] = None
    input_schema: dict


class ToolChoice(WireModel):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = None


class MessagesRequest(WireModel):
    model: Optional[str] = None
    max_tokens: int = Field(ge=1)
    messages: list[AnthropicMessage]
    system: Union[str, list[Block], None] = None
    stop_sequences: Optional[list[str]] = None
    temperature: Optional[float] = Field(None, ge=0.0, le=1.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=0)
    stream: bool = False
    tools: Optional[list[AnthropicTool]] = None
    tool_choice: Optional[ToolChoice] = None

    @field_validator("messages", mode="before")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("messages must hold at least one message")
        return v

    @property
    def wants_tools(self) -> bool:
        return bool(self.tools) and not (self.tool_choice and self.tool_choice.type == "none")

    def openai_tools(self) -> Optional[list[dict]]:
        """The tools as OpenAI function tools: the one format the engine's templates get."""
        if not self.wants_tools:
            return None
        return [
            {
                "type": "function",
                "function": {
                    k: v
                    for k, v in {"name": t.name, "description": t.description, "parameters": t.input_schema}.items()
                    if v is not None
                },
            }
            for t in self.tools
        ]


def parse_messages_request(
    body: Union[dict, bytes, str],
    *,
    model_names: Optional[Iterable[str]] = None,
    context_length: Optional[int] = None,
) -> MessagesRequest:
    """Validate a request body; errors are `APIError`s (render with `.to_anthropic_dict()`)."""
    req = validate(MessagesRequest, load_body(body))
    check_model(req.model, model_names)
    check_max_tokens(req.max_tokens, context_length)
    return req


def messages_engine_kwargs(req: MessagesRequest) -> dict[str, Any]:
    messages: list[dict] = []
    if req.system:
        messages.append({"role": "system", "content": _text_of(req.system)})
    for m in req.messages:
        messages.extend(_user_turn(m.content) if m.role == "user" else [_assistant_turn(m.content)])
    kwargs: dict[str, Any] = {"messages": messages, "max_tokens": req.max_tokens, "stop": stop_list(req.stop_sequences)}
    for name in ("temperature", "top_p", "top_k"):
        if (value := getattr(req, name)) is not None:
            kwargs[name] = value
    kwargs["logprobs"] = 0
    kwargs["tools"] = req.openai_tools()
    return kwargs


def anthropic_message(
    result: Result,
    *,
    model: str,
    content: Optional[str] = None,
    tool_calls: Optional[list[dict]] = None,
    matched_stop: Optional[str] = None,
) -> dict:
    """The `message` body. `tool_calls` are parsed calls (`{"name", "arguments"}`); `matched_stop` is
    the stop sequence that ended the reply, when the caller knows it (the Result does not say)."""
    if result.finish_reason == "error":
        raise server_error(result.error or "generation failed")
    text = result.text if content is None else content
    blocks: list[dict] = [{"type": "text", "text": text}] if text.strip() or not tool_calls else []
    blocks += [anthropic_tool_use(c) for c in tool_calls or []]
    reason = stop_reason(result.finish_reason, tool_use=bool(tool_calls), matched_stop=matched_stop)
    return {
        "id": prefixed_id("msg_", result.request_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": matched_stop if reason == "stop_sequence" else None,
        "usage": anthropic_usage(result.usage),
    }


def messages_response(
    req: MessagesRequest,
    result: Result,
    *,
    model: str,
    matched_stop: Optional[str] = None,
    tool_parser: Optional[ToolParser] = None,
    tool_markers: Optional[tuple[str, str]] = None,
) -> dict:
    """The whole non-stream path for a parsed request (tool-call parsing when tools were offered)."""
    content, calls = result.text, []
    if req.wants_tools:
        content, calls = split_tool_calls(result.text, req.openai_tools(), tool_parser, tool_markers)
    return anthropic_message(result, model=model, content=content, tool_calls=calls, matched_stop=matched_stop)


def _text_of(content: Union[str, list[Block], None]) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "\n\n".join(b.text for b in content if b.type == "text" and b.text)


def _user_turn(content: Union[str, list[Block]]) -> list[dict]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_msgs, parts = [], []
    for b in content:
        if b.type == "tool_result":
            text = _text_of(b.content)
            tool_msgs.append(
                {"role": "tool", "tool_call_id": b.tool_use_id, "content": f"Error: {text}" if b.is_error else text}
            )
        elif b.type == "text":
            parts.append({"type": "text", "text": b.text})
        elif b.type == "image":
            parts.append({"type": "image_url", "image_url": {"url": b.source.as_url()}})
    if not parts:
        return tool_msgs
    single_text = len(parts) == 1 and parts[0]["type"] == "text"
    return tool_msgs + [{"role": "user", "content": parts[0]["text"] if single_text else parts}]


def _assistant_turn(content: Union[str, list[Block]]) -> dict:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(b.text for b in content if b.type == "text")}
    calls = [
        {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input or {}}}
        for b in content
        if b.type == "tool_use"
    ]
    if calls:
        msg["tool_calls"] = calls
    return msg
