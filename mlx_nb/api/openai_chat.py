"""OpenAI Chat Completions: request JSON -> engine kwargs, engine Result -> response JSON.

The streaming translator lives in `openai_chat_stream.py`, which imports this module (never the
reverse). Decisions:
- Messages reach the engine as plain dicts; the engine normalizes roles (developer -> system,
  merging). Assistant `tool_calls[].function.arguments` JSON strings become dicts at validation
  (chat templates iterate them), so malformed arguments are a 400 from `parse_chat_request`.
- `max_tokens` / `max_completion_tokens` left out means the server's default budget (by default
  the rest of the context, as OpenAI does); more than fits is clamped by the engine, not refused.
- `n` > 1 asks for n choices: n engine requests (seeds `seed + i` when seeded), decoded as n rows
  of the shared batch, returned as choices 0..n-1 with the completion tokens summed in `usage`.
- `tool_choice: "none"` withholds the tools from the prompt and skips tool-call parsing;
  "required" and a named function hold the reply to one call, its arguments to the function's
  schema, where the tool markup is JSON between markers (api/forced_tools.py); otherwise "auto".
- `response_format` json_object / json_schema (strict or not: both are enforced) holds the reply to
  the schema token by token (engine/sampling/constrained.py); the format is also said in a system
  instruction (with the schema), so the model writes content, not just syntax. A reply cut short
  by the budget can still fail to parse: the choice then carries a non-standard `json_error`
  string saying why. llama.cpp's and vLLM's extension fields (`json_schema`, `grammar`,
  `guided_json`, `guided_regex`, `guided_grammar`) constrain the same way.
- `logit_bias`, `presence_penalty` and `frequency_penalty` are honoured (mlx_lm's logits
  processors); `user` / `metadata` etc. are accepted and ignored; the pre-`tools` `functions` field is
  rejected, since silently ignoring it changes results.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from mlx_nb.api.errors import server_error
from mlx_nb.api.openai_common import (
    chat_logprobs,
    choice_requests,
    choices_body,
    finish_reason,
    json_error,
)
from mlx_nb.api.request_common import (
    ReasoningFields,
    SamplingFields,
    constraint_kwargs,
    reasoning_kwargs,
    ServerDefaults,
    WireModel,
    parse_request,
    engine_logprobs,
    generation_kwargs,
    sampling_kwargs,
)
from mlx_nb.api.tool_calls import ToolParser, openai_tool_call, split_tool_calls
from mlx_nb.engine import Result

__all__ = [
    "ChatRequest",
    "chat_completion",
    "chat_engine_kwargs",
    "chat_engine_requests",
    "chat_response",
    "parse_chat_request",
    "parse_tool_calls",
]


class ImageURL(WireModel):
    url: str
    detail: Optional[str] = None


class ContentPart(WireModel):
    """One flat model rather than a tagged union, so a bad part gets a plain error path."""

    type: Literal["text", "image_url"]
    text: Optional[str] = None
    image_url: Optional[ImageURL] = None

    @field_validator("image_url", mode="before")
    @classmethod
    def _url_string(cls, v: Any) -> Any:
        return {"url": v} if isinstance(v, str) else v  # some clients send the bare URL

    @model_validator(mode="after")
    def _has_payload(self) -> "ContentPart":
        if self.type == "text" and self.text is None:
            raise ValueError("a text part needs a 'text' string")
        if self.type == "image_url" and self.image_url is None:
            raise ValueError("an image_url part needs 'image_url': {'url': ...}")
        return self


class FunctionCall(WireModel):
    name: str
    arguments: Union[dict, str] = {}

    @field_validator("arguments")
    @classmethod
    def _as_dict(cls, v: Union[dict, str]) -> dict:
        """Clients send a JSON string; chat templates iterate a dict. Bad JSON is the client's 400."""
        if isinstance(v, dict):
            return v
        try:
            parsed = json.loads(v) if v.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc.msg})") from None
        if not isinstance(parsed, dict):
            raise ValueError("must be a JSON object")
        return parsed


class ToolCall(WireModel):
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(WireModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None  # an earlier turn's reasoning (what this route answers with)
    reasoning: Optional[str] = None  # the same, as some clients name it

    @model_validator(mode="after")
    def _content_present(self) -> "Message":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content (a string or a list of parts)")
        return self


class FunctionDef(WireModel):
    name: str
    description: Optional[str] = None
    parameters: Optional[dict] = None
    strict: Optional[bool] = None


class Tool(WireModel):
    type: Literal["function"] = "function"
    function: FunctionDef


class ResponseFormat(WireModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[dict] = None


class StreamOptions(WireModel):
    include_usage: bool = False


class ChatRequest(SamplingFields, ReasoningFields):
    model: Optional[str] = None
    messages: list[Message]
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    stream_options: Optional[StreamOptions] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], dict, None] = None
    response_format: Optional[ResponseFormat] = None
    functions: Optional[list] = None

    @field_validator("messages", mode="before")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("messages must hold at least one message")
        return v

    @field_validator("functions")
    @classmethod
    def _no_functions(cls, v: Optional[list]) -> Optional[list]:
        if v:
            raise ValueError("the deprecated 'functions' field is not supported: send 'tools' instead")
        return v

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> "ChatRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs: true")
        return self

    @property
    def budget(self) -> Optional[int]:
        """The completion budget; the newer `max_completion_tokens` wins over `max_tokens`."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def wants_tools(self) -> bool:
        """Tools were offered and not switched off: parse tool-call markup in the reply."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def json_mode(self) -> bool:
        return self.response_format is not None and self.response_format.type != "text"


def parse_chat_request(
    body: Union[dict, bytes, str],
    *,
    model_names: Optional[Iterable[str]] = None,
    defaults: ServerDefaults = ServerDefaults(),
) -> ChatRequest:
    """Validate a request body; every problem is an `APIError` (400, or 404 for an unknown model)."""
    return parse_request(ChatRequest, body, model_names, defaults)


def chat_engine_kwargs(req: ChatRequest, defaults: ServerDefaults = ServerDefaults()) -> dict[str, Any]:
    """Keyword arguments for `engine.submit(...)` (one choice)."""
    messages = [_message_dict(m) for m in req.messages]
    if req.json_mode:
        lead = next((i for i, m in enumerate(messages) if m["role"] not in ("system", "developer")), len(messages))
        messages.insert(lead, {"role": "system", "content": json_instruction(req.response_format)})
    kwargs: dict[str, Any] = {"messages": messages, **sampling_kwargs(req)}
    kwargs.update(constraint_kwargs(req, req.response_format))
    kwargs.update(generation_kwargs(defaults, req.budget, kwargs))
    kwargs["logprobs"] = engine_logprobs(bool(req.logprobs), req.top_logprobs)
    kwargs["tools"] = [t.model_dump(exclude_none=True) for t in req.tools] if req.wants_tools else None
    kwargs.update(reasoning_kwargs(req))
    return kwargs


def chat_engine_requests(req: ChatRequest, defaults: ServerDefaults = ServerDefaults()) -> list[dict[str, Any]]:
    """One `engine.submit` kwargs per choice (`n` of them)."""
    return choice_requests(chat_engine_kwargs(req, defaults), req.n)


def parse_tool_calls(
    text: str,
    tools: Optional[list] = None,
    parser: Optional[ToolParser] = None,
    markers: Optional[tuple[str, str]] = None,
) -> tuple[str, list[dict]]:
    """(content with the tool-call markup removed, OpenAI `tool_calls` entries)."""
    content, calls = split_tool_calls(text, tools, parser, markers)
    return content, [openai_tool_call(c) for c in calls]


def chat_completion(
    result: Result,
    *,
    model: str,
    created: int,
    tool_calls: Optional[list[dict]] = None,
    content: Optional[str] = None,
    top_logprobs: Optional[int] = None,
    json_mode: bool = False,
) -> dict:
    """The `chat.completion` body. `content` overrides `result.text` (e.g. with tool markup removed)."""
    choice = _choice(result, 0, tool_calls, content, top_logprobs, json_mode)
    return choices_body("chat.completion", [result], [choice], model=model, created=created)


def _choice(
    result: Result,
    index: int,
    tool_calls: Optional[list[dict]],
    content: Optional[str],
    top_logprobs: Optional[int],
    json_mode: bool,
) -> dict:
    if result.finish_reason == "error":
        raise server_error(result.error or "generation failed")
    text = result.text if content is None else content
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if result.reasoning:  # a thinking model's reasoning, apart from the answer (as vLLM and llama-server)
        message["reasoning_content"] = result.reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
        if not text.strip():
            message["content"] = None
    choice: dict[str, Any] = {
        "index": index,
        "message": message,
        "finish_reason": finish_reason(result.finish_reason, tool_calls=bool(tool_calls)),
        "logprobs": chat_logprobs(result.logprobs, top_logprobs),
    }
    if json_mode and (problem := json_error(text)):
        choice["json_error"] = problem
    return choice


def chat_response(
    req: ChatRequest,
    result: Union[Result, list[Result]],
    *,
    model: str,
    created: int,
    tool_parser: Optional[ToolParser] = None,
    tool_markers: Optional[tuple[str, str]] = None,
) -> dict:
    """The whole non-stream path for a parsed request (one Result per choice): tool calls, logprob
    trimming, JSON check."""
    results = result if isinstance(result, list) else [result]
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    top = (req.top_logprobs or 0) if req.logprobs else None
    choices = []
    for i, r in enumerate(results):
        content, calls = r.text, []
        if req.wants_tools:
            content, calls = parse_tool_calls(r.text, tools, tool_parser, tool_markers)
        choices.append(_choice(r, i, calls or None, content, top, req.json_mode))
    return choices_body("chat.completion", results, choices, model=model, created=created)


def _message_dict(m: Message) -> dict:
    out = m.model_dump(exclude_none=True)
    if m.content is None:
        out["content"] = ""  # an assistant turn that only calls tools
    return out


def json_instruction(fmt: ResponseFormat) -> str:
    text = "Respond with one valid JSON object and nothing else: no prose, no markdown code fences."
    schema = (fmt.json_schema or {}).get("schema") if fmt.type == "json_schema" else None
    if schema:
        text += " The object must conform to this JSON schema:\n" + json.dumps(schema, ensure_ascii=False)
    return text
