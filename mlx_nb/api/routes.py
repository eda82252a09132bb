"""The generating routes as data: parse -> engine requests -> one body, or SSE bytes per delta.

Every POST route that generates has the same skeleton (parse the body, submit one request per
choice, answer whole or as a stream that opens at admission); only these pieces differ, so an
HTTP handler runs any `Route` the same way and holds no wire detail. `Serving` is what the server
knows when a request arrives: its model, its defaults, the tokenizer's tool-call markup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from mlx_nb.api.forced_tools import Forced, forced_tool_kwargs
from mlx_nb.api.anthropic_messages import messages_engine_kwargs, messages_response, parse_messages_request
from mlx_nb.api.anthropic_stream import MessagesStream
from mlx_nb.api.openai_chat import chat_engine_requests, chat_response, parse_chat_request
from mlx_nb.api.openai_chat_stream import ChatStream
from mlx_nb.api.openai_common import usage_of_choices
from mlx_nb.api.openai_completions import (
    CompletionStream,
    completion_engine_requests,
    completion_response,
    parse_completion_request,
)
from mlx_nb.api.openai_responses import parse_responses_request, responses_engine_kwargs, responses_response
from mlx_nb.api.openai_responses_stream import ResponsesStream
from mlx_nb.api.request_common import ServerDefaults
from mlx_nb.api.sse import sse_done, sse_event
from mlx_nb.engine import Delta, Result, Usage


@dataclass
class Serving:
    model: str
    defaults: ServerDefaults = ServerDefaults()
    tool_parser: Any = None
    tool_markers: Optional[tuple[str, str]] = None
    tool_format: Optional[str] = None  # "template" or "generic" (mlx_nb.engine.inputs.generic_tools); None: not known

    @property
    def tools(self) -> dict:
        return {"tool_parser": self.tool_parser, "tool_markers": self.tool_markers}


def serving_for(engine, name: str, defaults: ServerDefaults) -> Serving:
    """What a route needs to know of a ready local `engine` serving under `name`: its defaults and
    how its tool calls are written (the chat template's markup, or the generic one)."""
    from mlx_nb.api.tool_calls import DEFAULT_MARKERS
    from mlx_nb.engine import GENERIC_TOOLS as GENERIC

    fmt = engine.tool_format()
    if fmt == GENERIC:  # tools were inlined in the generic markup: calls come back in it
        return Serving(name, defaults, None, DEFAULT_MARKERS, fmt)
    tok = engine.loaded.tokenizer
    start, end = getattr(tok, "tool_call_start", None), getattr(tok, "tool_call_end", None)
    return Serving(name, defaults, getattr(tok, "tool_parser", None), (start, end) if start and end else None, fmt)


@dataclass
class Admitted:
    """What the engine said when it took a request: its id, prompt length and granted budget."""

    request_id: str
    prompt_tokens: Optional[int] = None
    max_tokens: Optional[int] = None


class Route:
    anthropic = False  # error bodies in Anthropic's shape
    passthrough: Optional[str] = None  # the path an OpenAI-compatible backend serves this route at, as is

    def requested_budget(self, req: Any) -> Optional[int]:
        """The budget the client asked for (None: it left it to the server)."""
        return getattr(req, "max_tokens", None)

    def parse(self, body: bytes, serving: Serving) -> Any:
        raise NotImplementedError

    def engine_requests(self, req: Any, serving: Serving) -> list[dict]:
        raise NotImplementedError

    def forced_tool(self, req: Any) -> Forced:
        """A call the request's tool_choice demands: True (any tool), a tool's name, or None."""
        return None

    def held(self, req: Any, serving: Serving, requests: list[dict]) -> list[dict]:
        """`requests` with a demanded tool call held to its schema (api/forced_tools.py)."""
        extra = forced_tool_kwargs(requests[0], self.forced_tool(req), serving)
        return [{**kw, **extra} for kw in requests]

    def response(self, req: Any, results: list[Result], serving: Serving, created: int) -> dict:
        raise NotImplementedError

    def stream(self, req: Any, admitted: list[Admitted], serving: Serving, created: int) -> "Stream":
        raise NotImplementedError


class Stream:
    """SSE bytes: `start()` at admission, `feed(i, delta)` per delta of choice i, `close()` at the end."""

    def start(self) -> bytes:
        return b""

    def feed(self, index: int, delta: Delta) -> bytes:
        raise NotImplementedError

    def close(self) -> bytes:
        return b""


class ChoicesStream(Stream):
    """OpenAI chunks for `n` choices (one translator each), one usage chunk at the end, `[DONE]`."""

    def __init__(self, choices: list, include_usage: bool, envelope: dict):
        self.choices, self.include_usage, self.envelope = choices, include_usage, envelope
        self.usages: list[Optional[Usage]] = [None] * len(choices)

    def start(self) -> bytes:
        return b"".join(sse_event(c) for s in self.choices for c in s.start())

    def feed(self, index: int, delta: Delta) -> bytes:
        if delta.finish_reason is not None:
            self.usages[index] = delta.usage
        return b"".join(sse_event(c) for c in self.choices[index].feed(delta))

    def close(self) -> bytes:
        out = b""
        if self.include_usage and all(u is not None for u in self.usages):
            out = sse_event({**self.envelope, "choices": [], "usage": usage_of_choices(self.usages)})
        return out + sse_done()


class ChatRoute(Route):
    passthrough = "chat/completions"

    def requested_budget(self, req):
        return req.budget

    def parse(self, body, serving):
        return parse_chat_request(body, model_names=[serving.model], defaults=serving.defaults)

    def engine_requests(self, req, serving):
        return self.held(req, serving, chat_engine_requests(req, serving.defaults))

    def forced_tool(self, req):
        choice = req.tool_choice
        if isinstance(choice, dict):
            return (choice.get("function") or {}).get("name") or None
        return True if choice == "required" else None

    def response(self, req, results, serving, created):
        return chat_response(req, results, model=serving.model, created=created, **serving.tools)

    def stream(self, req, admitted, serving, created):
        rid = admitted[0].request_id
        choices = [ChatStream.for_request(req, model=serving.model, created=created, request_id=rid, index=i,
                                          include_usage=False, **serving.tools) for i in range(len(admitted))]
        return ChoicesStream(choices, req.include_usage, choices[0].envelope())


class CompletionsRoute(Route):
    passthrough = "completions"

    def parse(self, body, serving):
        return parse_completion_request(body, model_names=[serving.model], defaults=serving.defaults)

    def engine_requests(self, req, serving):
        return completion_engine_requests(req, serving.defaults)

    def response(self, req, results, serving, created):
        return completion_response(results, model=serving.model, created=created, top_logprobs=req.logprobs)

    def stream(self, req, admitted, serving, created):
        rid = admitted[0].request_id
        choices = [CompletionStream.for_request(req, model=serving.model, created=created, request_id=rid, index=i,
                                                include_usage=False) for i in range(len(admitted))]
        return ChoicesStream(choices, req.include_usage, choices[0].envelope())


class NamedEventStream(Stream):
    """Streams whose events are named (`event: <type>`): Anthropic Messages, OpenAI Responses."""

    def __init__(self, translator, opening: list):
        self.translator, self.opening = translator, opening

    def start(self) -> bytes:
        return b"".join(sse_event(data, event=name) for name, data in self.opening)

    def feed(self, index: int, delta: Delta) -> bytes:
        events = self.translator.feed(delta, **self.feed_kwargs(delta))
        return b"".join(sse_event(data, event=name) for name, data in events)

    def feed_kwargs(self, delta: Delta) -> dict:
        return {}


class MessagesEvents(NamedEventStream):
    def feed_kwargs(self, delta: Delta) -> dict:
        return {"matched_stop": delta.matched_stop}


class MessagesRoute(Route):
    """Anthropic Messages: errors in Anthropic's shape, named SSE events, no `[DONE]`."""

    anthropic = True

    def parse(self, body, serving):
        return parse_messages_request(body, model_names=[serving.model], defaults=serving.defaults)

    def engine_requests(self, req, serving):
        return self.held(req, serving, [messages_engine_kwargs(req, serving.defaults)])

    def forced_tool(self, req):
        choice = req.tool_choice
        if choice is None or choice.type not in ("any", "tool"):
            return None
        return choice.name if choice.type == "tool" else True

    def response(self, req, results, serving, created):
        (result,) = results
        return messages_response(req, result, model=serving.model, matched_stop=result.matched_stop, **serving.tools)

    def stream(self, req, admitted, serving, created):
        msgs = MessagesStream.for_request(req, model=serving.model, request_id=admitted[0].request_id,
                                          **serving.tools)
        return MessagesEvents(msgs, msgs.start(admitted[0].prompt_tokens))


class ResponsesRoute(Route):
    def requested_budget(self, req):
        return req.max_output_tokens

    def parse(self, body, serving):
        return parse_responses_request(body, model_names=[serving.model], defaults=serving.defaults)

    def engine_requests(self, req, serving):
        return self.held(req, serving, [responses_engine_kwargs(req, serving.defaults)])

    def forced_tool(self, req):
        choice = req.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "function":
            return req.model_name(choice.get("name", ""), choice.get("namespace"))
        return True if choice == "required" else None

    def response(self, req, results, serving, created):
        (result,) = results
        return responses_response(req, result, model=serving.model, created=created, **serving.tools)

    def stream(self, req, admitted, serving, created):
        events = ResponsesStream(req, model=serving.model, created=created, request_id=admitted[0].request_id,
                                 **serving.tools)
        return NamedEventStream(events, events.start())


CHAT, COMPLETIONS, MESSAGES, RESPONSES = ChatRoute(), CompletionsRoute(), MessagesRoute(), ResponsesRoute()
