"""OpenAI Responses (`/v1/responses`): request JSON -> engine kwargs, Result -> `response` JSON.

What Codex CLI and the OpenAI Agents SDK send: `input` as a string or a list of items —
messages (`input_text`, `input_image`, and `output_text` from earlier assistant turns),
`function_call` and `function_call_output` items — plus `instructions` (a leading system message),
function tools (flat: `{"type": "function", "name", "parameters"}`) and `namespace` tools (a
group of function tools the client runs, as Codex sends them), `tool_choice`,
`max_output_tokens` and `text.format` (json_object / json_schema, held to the schema token by token as in
chat, with an instruction saying it). Items are translated into the engine's one (chat) message format.

Refused with a 400, because silently dropping them changes the answer: `previous_response_id`
and `item_reference` (this server stores no responses: send the whole conversation), and files.
Hosted tools (`web_search`, `file_search`, `code_interpreter`, `mcp`, ...) run on OpenAI's side and
this server runs none: they are dropped, and the response's `warnings` (and the log) say so, since
clients such as Codex list them by default; a `tool_choice` that demands one is a 400.
A namespaced function reaches the model under its own name (`ns__name` where two namespaces share
one), and its calls come back as `function_call` items naming the `namespace`, as OpenAI's do.
A thinking model's reasoning comes back as a `reasoning` item (its whole text as `reasoning_text`
content) before the message, streamed as `response.reasoning_text.delta` events; `reasoning.effort`
reaches the chat template as `reasoning_effort`, and `reasoning` items sent back in a conversation
go to the template with their turn. `include: ["message.output_text.logprobs"]` (with
`top_logprobs` alternatives) returns the tokens' logprobs on the output text, as OpenAI does, streamed
with each text delta. `store`, `metadata`, other `include` values and `truncation` are accepted and
ignored. The stream translator is `openai_responses_stream.py`.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any, Iterable, Literal, NamedTuple, Optional, Union

from pydantic import Field, field_validator, model_validator

from mlx_nb.api.errors import invalid_request, server_error
from mlx_nb.api.ids import new_call_id, prefixed_id
from mlx_nb.api.openai_common import chat_logprobs
from mlx_nb.api.openai_chat import ResponseFormat, json_instruction
from mlx_nb.api.request_common import (
    ServerDefaults,
    WireModel,
    constraint_kwargs,
    engine_logprobs,
    parse_request,
    generation_kwargs,
    reasoning_kwargs,
    ReasoningFields,
)
from mlx_nb.api.tool_calls import ToolParser, split_tool_calls
from mlx_nb.engine import Result, Usage

log = logging.getLogger("mlx_nb.api")


class Part(WireModel):
    type: Literal["input_text", "output_text", "text", "input_image", "refusal", "input_file", "reasoning_text",
                  "summary_text"]
    text: Optional[str] = None
    image_url: Optional[str] = None
    file_id: Optional[str] = None
    refusal: Optional[str] = None

    @model_validator(mode="after")
    def _payload(self) -> "Part":
        if self.type == "input_file":
            raise ValueError("input_file parts are not read by this server: send the file's text as input_text")
        if self.type == "input_image" and not self.image_url:
            raise ValueError("an input_image part needs 'image_url' (a data: or http(s) URL); file_id is not supported")
        if self.type in ("input_text", "output_text", "text") and self.text is None:
            raise ValueError(f"an {self.type} part needs 'text'")
        return self


class Item(WireModel):
    """One flat input-item model, so errors name plain paths (`input.2.call_id`)."""

    type: Literal["message", "function_call", "function_call_output", "reasoning", "item_reference"] = "message"
    role: Optional[Literal["user", "assistant", "system", "developer"]] = None
    content: Union[str, list[Part], None] = None
    call_id: Optional[str] = None
    name: Optional[str] = None
    namespace: Optional[str] = None  # a call to a namespace tool's function
    arguments: Optional[str] = None
    output: Union[str, list[Part], None] = None
    summary: Optional[list[Part]] = None  # a reasoning item's summary (its content holds the reasoning text)

    @model_validator(mode="after")
    def _required(self) -> "Item":
        if self.type == "item_reference":
            raise ValueError("item references need stored responses, which this server does not keep: "
                             "send the items themselves")
        need = {"message": ("role", "content"), "function_call": ("call_id", "name", "arguments"),
                "function_call_output": ("call_id", "output")}
        for key in need.get(self.type, ()):
            if getattr(self, key) is None:
                raise ValueError(f"a {self.type} item needs '{key}'")
        return self


class FunctionTool(WireModel):
    type: str
    name: Optional[str] = None
    description: Optional[str] = None
    parameters: Optional[dict] = None
    strict: Optional[bool] = None
    tools: Optional[list["FunctionTool"]] = None  # a namespace's function tools

    @model_validator(mode="after")
    def _named(self) -> "FunctionTool":
        if self.type in ("function", "namespace") and not self.name:
            raise ValueError(f"a {self.type} tool needs 'name'")
        if self.type == "namespace" and any(t.type != "function" for t in self.tools or []):
            raise ValueError(f"namespace {self.name!r}: only function tools can be grouped in a namespace")
        return self

    @property
    def hosted(self) -> bool:
        """A tool OpenAI runs on its side (web_search, file_search, ...): nothing this server can run."""
        return self.type not in ("function", "namespace")

    def chat_tool(self, name: str, namespace: Optional["FunctionTool"] = None) -> dict:
        description = self.description
        if namespace is not None and namespace.description:  # the group's purpose helps the model choose
            description = f"{namespace.description} {description or ''}".strip()
        fn = {"name": name, "description": description, "parameters": self.parameters or {"type": "object"}}
        return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


class Function(NamedTuple):
    """A function tool as the model sees it (`model_name`) and as the client named it."""

    model_name: str
    tool: FunctionTool
    namespace: Optional[FunctionTool] = None


def _functions(tools: list[FunctionTool]) -> list[Function]:
    flat = [(t, None) for t in tools if t.type == "function"]
    flat += [(f, t) for t in tools if t.type == "namespace" for f in t.tools or []]
    counts = Counter(f.name for f, _ in flat)
    return [Function(f.name if counts[f.name] == 1 or ns is None else f"{ns.name}__{f.name}", f, ns)
            for f, ns in flat]


class TextFormat(WireModel):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: Optional[str] = None
    schema_: Optional[dict] = Field(None, alias="schema")


class TextConfig(WireModel):
    format: Optional[TextFormat] = None


class ReasoningConfig(WireModel):
    effort: Optional[Literal["minimal", "low", "medium", "high"]] = None
    summary: Optional[str] = None  # accepted; the reasoning is returned whole, not summarised


class ResponsesRequest(ReasoningFields):
    model: Optional[str] = None
    reasoning: Optional[ReasoningConfig] = None
    input: Union[str, list[Item]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    tools: Optional[list[FunctionTool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], dict, None] = None
    text: Optional[TextConfig] = None
    stream: bool = False
    previous_response_id: Optional[str] = None
    seed: Optional[int] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    include: Optional[list[str]] = None  # "message.output_text.logprobs" asks for the tokens' logprobs

    @field_validator("input", mode="before")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        if v == "" or v == []:
            raise ValueError("input is empty")
        return v

    @field_validator("previous_response_id")
    @classmethod
    def _stateless(cls, v: Optional[str]) -> Optional[str]:
        if v:
            raise ValueError("this server stores no responses: send the whole conversation as input (store: false)")
        return v

    @model_validator(mode="after")
    def _no_demanded_hosted_tool(self) -> "ResponsesRequest":
        choice = self.tool_choice if isinstance(self.tool_choice, dict) else {}
        if choice.get("type") not in (None, "function", "allowed_tools"):
            raise ValueError(f"tool_choice demands the hosted tool {choice['type']!r}, which runs on OpenAI's side; "
                             "this server runs no tools itself: choose a function tool or 'auto'")
        return self

    @property
    def functions(self) -> list[Function]:
        return _functions(self.tools or [])

    def model_name(self, name: str, namespace: Optional[str]) -> str:
        """The name the model knows a client's (namespaced) function by."""
        for f in self.functions:
            if f.tool.name == name and (f.namespace.name if f.namespace else None) == namespace:
                return f.model_name
        return name

    def wire_call(self, call: dict) -> dict:
        """A parsed call with the client's name for its function, and its namespace if it has one."""
        for f in self.functions:
            if f.model_name == call["name"]:
                return {**call, "name": f.tool.name, **({"namespace": f.namespace.name} if f.namespace else {})}
        return call

    @property
    def warnings(self) -> list[str]:
        """What the response says it left out: each hosted tool, dropped."""
        return [f"the hosted tool {t.type!r} was dropped: this server runs no tools itself"
                for t in self.tools or [] if t.hosted]

    @property
    def wants_logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.include or [])

    def wire_logprobs(self, logprobs: list) -> list[dict]:
        """The output text's `logprobs`: the chat shape's entries, alternatives trimmed to `top_logprobs`."""
        if not self.wants_logprobs:
            return []
        return (chat_logprobs(logprobs, self.top_logprobs or 0) or {}).get("content", [])

    @property
    def wants_tools(self) -> bool:
        return bool(self.functions) and self.tool_choice != "none"

    def chat_tools(self) -> Optional[list[dict]]:
        return [f.tool.chat_tool(f.model_name, f.namespace) for f in self.functions] if self.wants_tools else None

    @property
    def text_format(self) -> Optional[ResponseFormat]:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return None
        return ResponseFormat(type=fmt.type, json_schema={"name": fmt.name, "schema": fmt.schema_})


def parse_responses_request(
    body: Union[dict, bytes, str],
    *,
    model_names: Optional[Iterable[str]] = None,
    defaults: ServerDefaults = ServerDefaults(),
) -> ResponsesRequest:
    return parse_request(ResponsesRequest, body, model_names, defaults)


def responses_engine_kwargs(req: ResponsesRequest, defaults: ServerDefaults = ServerDefaults()) -> dict[str, Any]:
    for warning in req.warnings:
        log.warning("mlx_nb: responses request: %s", warning)
    messages: list[dict] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if req.text_format is not None:
        messages.append({"role": "system", "content": json_instruction(req.text_format)})
    items = [Item(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    for item in items:
        _add_item(messages, item, req)
    kwargs: dict[str, Any] = {"messages": _merge_reasoning_turns(messages), "stop": []}
    for name in ("top_p", "temperature", "seed"):
        if (value := getattr(req, name)) is not None:
            kwargs[name] = value
    kwargs.update(constraint_kwargs(req, req.text_format))
    kwargs.update(generation_kwargs(defaults, req.max_output_tokens, kwargs))
    kwargs["logprobs"] = engine_logprobs(req.wants_logprobs, req.top_logprobs)
    kwargs["tools"] = req.chat_tools()
    kwargs.update(reasoning_kwargs(req, effort=req.reasoning.effort if req.reasoning else None))
    return kwargs


def _add_item(messages: list[dict], item: Item, req: ResponsesRequest) -> None:
    if item.type == "message":
        messages.append({"role": item.role, "content": _content(item.content)})
    elif item.type == "function_call":
        name = req.model_name(item.name, item.namespace)
        call = {"id": item.call_id, "type": "function",
                "function": {"name": name, "arguments": _arguments(item.arguments, item.call_id)}}
        prev = messages[-1] if messages else None
        if prev is not None and prev["role"] == "assistant":  # text then calls, or several calls: one turn
            prev.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif item.type == "function_call_output":
        out = item.output if isinstance(item.output, str) else _text(item.output)
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": out})
    elif item.type == "reasoning":  # an earlier turn's reasoning: on the assistant turn it precedes
        parts = item.content if isinstance(item.content, list) else []
        text = _text(parts) or _text(item.summary or [])
        if text:
            messages.append({"role": "assistant", "content": "", "reasoning_content": text})


def _merge_reasoning_turns(messages: list[dict]) -> list[dict]:
    """An assistant turn that holds only reasoning takes the next assistant turn's content and calls
    (the Responses API sends a turn's reasoning, message and calls as separate items)."""
    out: list[dict] = []
    for m in messages:
        prev = out[-1] if out else None
        if (prev is not None and m["role"] == "assistant" and prev["role"] == "assistant"
                and prev.get("reasoning_content") and not prev["content"] and not prev.get("tool_calls")):
            out[-1] = {**m, "reasoning_content": prev["reasoning_content"]}
        else:
            out.append(m)
    return out


def _arguments(raw: str, call_id: str) -> dict:
    try:
        parsed = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise invalid_request(f"function_call {call_id}: arguments are not valid JSON ({exc.msg})", "input") from None
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def _text(parts: list[Part]) -> str:
    return "".join(p.text or p.refusal or "" for p in parts if p.type != "input_image")


def _content(content: Union[str, list[Part]]) -> Union[str, list[dict]]:
    if isinstance(content, str):
        return content
    if not any(p.type == "input_image" for p in content):
        return _text(content)
    return [
        {"type": "image_url", "image_url": {"url": p.image_url}} if p.type == "input_image"
        else {"type": "text", "text": p.text or p.refusal or ""}
        for p in content
    ]


# -- output ---------------------------------------------------------------------------------------
def responses_usage(usage: Optional[Usage]) -> dict:
    u = usage or Usage()
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},  # counted with the output tokens
        "total_tokens": u.total_tokens,
    }


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    """A thinking model's reasoning as a Responses `reasoning` item (whole, not summarised)."""
    content = [{"type": "reasoning_text", "text": text}] if status != "new" else []
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content,
            "status": "in_progress" if status == "new" else status}


def message_item(item_id: str, text: str, status: str = "completed", logprobs: Optional[list[dict]] = None) -> dict:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}] \
        if status != "new" else []
    return {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress" if status == "new"
            else status, "content": content}


def function_call_item(call: dict, status: str = "completed") -> dict:
    args = call["arguments"]
    call_id = call.get("id") or new_call_id()
    return {
        "id": "fc_" + call_id.removeprefix("call_"),
        "type": "function_call",
        "call_id": call_id,
        "name": call["name"],
        **({"namespace": call["namespace"]} if call.get("namespace") else {}),
        "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
        "status": status,
    }


def response_object(
    req: ResponsesRequest,
    *,
    response_id: str,
    model: str,
    created: int,
    output: list[dict],
    status: str,
    usage: Optional[Usage] = None,
) -> dict:
    """The `response` object, as create returns it and as stream events carry it."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": model,
        "output": output,
        "usage": responses_usage(usage) if usage is not None else None,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or [] if not t.hosted],
        "warnings": req.warnings,
        "tool_choice": req.tool_choice or "auto",
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "store": False,
        "text": {"format": {"type": "text"}},
        "metadata": {},
    }


def responses_status(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def responses_response(
    req: ResponsesRequest,
    result: Result,
    *,
    model: str,
    created: int,
    tool_parser: Optional[ToolParser] = None,
    tool_markers: Optional[tuple[str, str]] = None,
) -> dict:
    if result.finish_reason == "error":
        raise server_error(result.error or "generation failed")
    text, calls = result.text, []
    if req.wants_tools:
        text, calls = split_tool_calls(result.text, req.chat_tools(), tool_parser, tool_markers)
    output = [reasoning_item(prefixed_id("rs_", result.request_id), result.reasoning)] if result.reasoning else []
    output += [message_item(prefixed_id("msg_", result.request_id), text, logprobs=req.wire_logprobs(result.logprobs))
               ] if text.strip() or not calls else []
    output += [function_call_item(req.wire_call(c)) for c in calls]
    return response_object(req, response_id=prefixed_id("resp_", result.request_id), model=model, created=created,
                           output=output, status=responses_status(result.finish_reason), usage=result.usage)
