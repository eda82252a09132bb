"""Anthropic Messages (`/v1/messages`): request JSON -> engine kwargs, Result -> `message` JSON.

The engine speaks one (OpenAI-style) message format, so Anthropic's is translated into it:
`system` becomes a leading system message; assistant `tool_use` blocks become `tool_calls`;
user `tool_result` blocks become `role: "tool"` messages (placed before the rest of that user
turn, as Anthropic requires them first; `is_error` results are prefixed "Error: "); images become
`image_url` parts with a `data:` URL (images inside a `tool_result` join the user turn that follows
the tool messages, since chat templates render tool messages as text); `document` (text or
content sources) and `search_result` blocks become text parts headed by their title; tools become
OpenAI function tools. `thinking` blocks are dropped. `system` messages inside `messages` (current
Claude Code sends them) are normalized like the top-level `system`: hoisted and merged. Fields this
server has no use for (`thinking`, `context_management`, `output_config`, `metadata`, ...) and
`anthropic-beta` headers are accepted and ignored. `max_tokens` is required, as in Anthropic's
API (above what fits, the engine clamps it). `tool_choice` "none" withholds the tools; "any" /
"tool" cannot be enforced without constrained decoding and act as "auto".

Anthropic-defined tools (`web_search_20250305`, `bash_…`, `code_execution_…`, …: a `type` and no
`input_schema`) are refused with a 400 naming the tool: this server runs no tool itself, and
accepting one silently would let the model answer as if it had searched or run code.
`count_tokens` bodies are the same request without `max_tokens`.
The stream translator lives in `anthropic_stream.py`, which imports this module (not the reverse).
"""

from __future__ import annotations

from typing import Any, Iterable, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from mlx_nb.api.errors import server_error
from mlx_nb.api.ids import prefixed_id
from mlx_nb.api.request_common import (
    ServerDefaults,
    WireModel,
    parse_request,
    generation_kwargs,
    reasoning_kwargs,
    stop_list,
)
from mlx_nb.api.tool_calls import ToolParser, anthropic_tool_use, split_tool_calls
from mlx_nb.engine import Result, Usage

__all__ = [
    "CountTokensRequest",
    "MessagesRequest",
    "anthropic_message",
    "anthropic_usage",
    "count_tokens_kwargs",
    "messages_engine_kwargs",
    "messages_response",
    "parse_count_tokens_request",
    "parse_messages_request",
    "stop_reason",
]


def stop_reason(engine_reason: str, *, tool_use: bool = False, matched_stop: Optional[str] = None) -> str:
    """length -> max_tokens; a tool call -> tool_use; a known stop string -> stop_sequence; else
    end_turn (an abort included: the text so far is a complete, if short, turn)."""
    if engine_reason == "length":
        return "max_tokens"
    if tool_use:
        return "tool_use"
    if matched_stop:
        return "stop_sequence"
    return "end_turn"


def anthropic_usage(usage: Optional[Usage]) -> dict:
    """Anthropic counts cache reads apart from `input_tokens` (total = input + cache reads)."""
    u = usage or Usage()
    return {
        "input_tokens": max(u.prompt_tokens - u.cached_tokens, 0),
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


class Source(WireModel):
    type: Literal["base64", "url", "text", "content", "file"]
    media_type: Optional[str] = None
    data: Optional[str] = None
    url: Optional[str] = None
    content: Union[str, list["Block"], None] = None

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

    type: Literal[
        "text", "image", "document", "search_result", "tool_use", "tool_result", "thinking", "redacted_thinking"
    ]
    text: Optional[str] = None
    source: Union[Source, str, None] = None  # a search_result's source is its URL
    title: Optional[str] = None
    context: Optional[str] = None
    id: Optional[str] = None
    name: Optional[str] = None
    input: Optional[dict] = None
    tool_use_id: Optional[str] = None
    content: Union[str, list["Block"], None] = None
    is_error: Optional[bool] = None
    thinking: Optional[str] = None  # a thinking block's reasoning (sent back in a conversation's history)
    signature: Optional[str] = None

    @model_validator(mode="after")
    def _required(self) -> "Block":
        need = {"text": ("text",), "image": ("source",), "tool_use": ("id", "name"), "tool_result": ("tool_use_id",),
                "document": ("source",), "search_result": ("content",)}
        for key in need.get(self.type, ()):
            if getattr(self, key) is None:
                raise ValueError(f"a {self.type} block needs '{key}'")
        if self.type == "image":
            if not isinstance(self.source, Source):
                raise ValueError("an image block's source is {'type': 'base64' | 'url', ...}")
            self.source.as_url()  # raises with a clear message when incomplete
        if self.type == "document":
            if not isinstance(self.source, Source) or self.source.type not in ("text", "content"):
                kind = self.source.type if isinstance(self.source, Source) else type(self.source).__name__
                raise ValueError(
                    f"only text documents are read here (source type 'text' or 'content'), not {kind!r}: "
                    "extract the text (e.g. of a PDF) and send it as a text document"
                )
        return self

    def as_text(self) -> str:
        """The text a model reads for a text, document or search_result block ("" for others)."""
        if self.type == "text":
            return self.text or ""
        if self.type == "document":
            src = self.source
            body = src.data if src.type == "text" else _text_of(src.content)
            return "\n\n".join(x for x in (self.title, self.context, body or "") if x)
        if self.type == "search_result":
            head = " ".join(x for x in (self.title, f"({self.source})" if isinstance(self.source, str) else "") if x)
            return "\n\n".join(x for x in (head, _text_of(self.content)) if x)
        return ""


class AnthropicMessage(WireModel):
    # "system" inside messages: what current Claude Code sends (its mid-conversation system beta);
    # normalized like every system message (hoisted and merged before templating)
    role: Literal["user", "assistant", "system"]
    content: Union[str, list[Block]]


class AnthropicTool(WireModel):
    type: Optional[str] = None  # None or "custom": a client tool; anything else is Anthropic-defined
    name: str
    description: Optional[str] = None
    input_schema: Optional[dict] = None

    @model_validator(mode="after")
    def _client_tool(self) -> "AnthropicTool":
        if self.type not in (None, "custom"):
            raise ValueError(
                f"{self.type!r} is an Anthropic-defined tool ({self.name}) that runs on Anthropic's side; this "
                "server runs no tools itself: remove it, or define a client tool with name, description and "
                "input_schema and run it yourself"
            )
        if self.input_schema is None:
            raise ValueError(f"tool {self.name!r} needs an input_schema")
        return self


class ToolChoice(WireModel):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = None


class CountTokensRequest(WireModel):
    """`/v1/messages/count_tokens`: a Messages request without a budget."""

    model: Optional[str] = None
    messages: list[AnthropicMessage]
    system: Union[str, list[Block], None] = None
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


class Thinking(WireModel):
    """Extended thinking: `{"type": "enabled", "budget_tokens": N}` closes the reasoning after N
    tokens; `{"type": "disabled"}` asks the template for none (`enable_thinking=False`)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Optional[int] = Field(None, ge=0)


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: Optional[list[str]] = None
    temperature: Optional[float] = Field(None, ge=0.0, le=1.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=0)
    stream: bool = False
    thinking: Optional[Thinking] = None


def parse_messages_request(
    body: Union[dict, bytes, str],
    *,
    model_names: Optional[Iterable[str]] = None,
    defaults: ServerDefaults = ServerDefaults(),
) -> MessagesRequest:
    """Validate a request body; errors are `APIError`s (render with `.to_anthropic_dict()`)."""
    return parse_request(MessagesRequest, body, model_names, defaults)


def parse_count_tokens_request(
    body: Union[dict, bytes, str],
    *,
    model_names: Optional[Iterable[str]] = None,
    defaults: ServerDefaults = ServerDefaults(),
) -> CountTokensRequest:
    return parse_request(CountTokensRequest, body, model_names, defaults)


def count_tokens_kwargs(req: CountTokensRequest) -> dict[str, Any]:
    """What `engine.count_tokens(...)` needs: the prompt exactly as a Messages request renders it."""
    return {"messages": _engine_messages(req), "tools": req.openai_tools()}


def messages_engine_kwargs(req: MessagesRequest, defaults: ServerDefaults = ServerDefaults()) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"messages": _engine_messages(req), "stop": stop_list(req.stop_sequences)}
    for name in ("top_p", "top_k", "temperature"):
        if (value := getattr(req, name)) is not None:
            kwargs[name] = value
    kwargs.update(generation_kwargs(defaults, req.max_tokens, kwargs))
    kwargs["logprobs"] = 0
    kwargs["tools"] = req.openai_tools()
    if req.thinking is not None:
        enabled = req.thinking.type != "disabled"
        kwargs.update(reasoning_kwargs(req, budget=req.thinking.budget_tokens if enabled else None, enabled=enabled))
    return kwargs


def _engine_messages(req: CountTokensRequest) -> list[dict]:
    messages: list[dict] = []
    if req.system:
        messages.append({"role": "system", "content": _text_of(req.system)})
    for m in req.messages:
        if m.role == "system":
            messages.append({"role": "system", "content": _text_of(m.content)})
        else:
            messages.extend(_user_turn(m.content) if m.role == "user" else [_assistant_turn(m.content)])
    return messages


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
    blocks: list[dict] = [thinking_block(result.reasoning)] if result.reasoning else []
    blocks += [{"type": "text", "text": text}] if text.strip() or not tool_calls else []
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
    return "\n\n".join(t for b in content if (t := b.as_text()))


def _image_part(b: Block) -> dict:
    return {"type": "image_url", "image_url": {"url": b.source.as_url()}}


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
            if isinstance(b.content, list):
                parts.extend(_image_part(i) for i in b.content if i.type == "image")
        elif b.type in ("text", "document", "search_result"):
            parts.append({"type": "text", "text": b.as_text()})
        elif b.type == "image":
            parts.append(_image_part(b))
    if not parts:
        return tool_msgs
    single_text = len(parts) == 1 and parts[0]["type"] == "text"
    return tool_msgs + [{"role": "user", "content": parts[0]["text"] if single_text else parts}]


def thinking_block(reasoning: str) -> dict:
    """A thinking model's reasoning as Anthropic's thinking block. Its `signature` vouches for
    nothing (Anthropic's servers sign their own); clients only send it back."""
    return {"type": "thinking", "thinking": reasoning, "signature": ""}


def _assistant_turn(content: Union[str, list[Block]]) -> dict:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(b.text for b in content if b.type == "text")}
    thinking = "".join(b.thinking or "" for b in content if b.type == "thinking")
    if thinking:
        msg["reasoning_content"] = thinking
    calls = [
        {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input or {}}}
        for b in content
        if b.type == "tool_use"
    ]
    if calls:
        msg["tool_calls"] = calls
    return msg
