"""Engine Deltas -> OpenAI `chat.completion.chunk` dicts, one translator object per stream.

Sequence: a first chunk with `role: "assistant"` (sent by `start()` as soon as the request is
admitted, before the prompt is read, or else with the first delta); a thinking model's reasoning as
`delta.reasoning_content` chunks; content chunks; tool calls as whole
`delta.tool_calls` entries (index, id, type, function{name, arguments}) once their end marker
arrives — markup is never sent as content; a last chunk with `finish_reason` (and an empty
delta); with `include_usage`, one more chunk with `choices: []` and `usage`.
An engine error mid-stream yields `{"error": {...}}`, which the openai SDK raises as an APIError.
"""

from __future__ import annotations

from typing import Any, Optional

from mlx_nb.api.ids import prefixed_id
from mlx_nb.api.openai_chat import ChatRequest
from mlx_nb.api.openai_common import (
    chat_logprobs,
    error_chunk,
    finish_reason,
    json_error,
    usage_dict,
)
from mlx_nb.api.tool_calls import ToolCallSplitter, ToolParser, openai_tool_call
from mlx_nb.engine import Delta, TokenLogprob


class ChatStream:
    """`feed(delta)` returns the chunks to send for that delta (possibly none, while buffering)."""

    def __init__(
        self,
        model: str,
        created: int,
        request_id: str,
        include_usage: bool = False,
        tool_parser: Optional[ToolParser] = None,
        tool_markers: Optional[tuple[str, str]] = None,
        *,
        tools: Optional[list] = None,
        parse_tools: bool = True,
        top_logprobs: Optional[int] = None,
        json_mode: bool = False,
        index: int = 0,
    ):
        self.index = index  # the choice this stream writes (`n` > 1: one stream per choice)
        self.model = model
        self.created = created
        self.id = prefixed_id("chatcmpl-", request_id)
        self.include_usage = include_usage
        self.top_logprobs = top_logprobs
        self.json_mode = json_mode
        self.splitter = ToolCallSplitter(tool_parser, tool_markers, tools, enabled=parse_tools)
        self.started = False
        self.done = False
        self.tool_calls = 0
        self.content: list[str] = []  # kept only for the JSON check
        self.logprobs: list[TokenLogprob] = []  # not yet sent (their text may be held back)

    @classmethod
    def for_request(
        cls,
        req: ChatRequest,
        *,
        model: str,
        created: int,
        request_id: str,
        tool_parser: Optional[ToolParser] = None,
        tool_markers: Optional[tuple[str, str]] = None,
        index: int = 0,
        include_usage: Optional[bool] = None,
    ) -> "ChatStream":
        """A stream configured from a parsed request (usage, tools, logprobs, JSON mode)."""
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        return cls(
            model,
            created,
            request_id,
            req.include_usage if include_usage is None else include_usage,
            tool_parser,
            tool_markers,
            tools=tools,
            parse_tools=req.wants_tools,
            top_logprobs=(req.top_logprobs or 0) if req.logprobs else None,
            json_mode=req.json_mode,
            index=index,
        )

    def start(self) -> list[dict]:
        """The role chunk, once: what a client sees the moment its request is admitted."""
        if self.started:
            return []
        self.started = True
        return [self._chunk({"role": "assistant", "content": ""})]

    def feed(self, delta: Delta) -> list[dict]:
        if self.done:
            return []
        out: list[dict] = self.start()
        if delta.error or delta.finish_reason == "error":
            self.done = True
            out.append(error_chunk(delta.error or "generation failed"))
            return out
        self.logprobs.extend(delta.logprobs)
        if delta.reasoning:  # a thinking model's reasoning streams as its own field, before the answer
            out.append(self._chunk({"reasoning_content": delta.reasoning}))
        pieces = self.splitter.feed(delta.text)
        if delta.finish_reason is not None:
            pieces += self.splitter.finish()
        out.extend(self._pieces(pieces))
        if delta.finish_reason is not None:
            out.extend(self._finish(delta))
        return out

    def _pieces(self, pieces: list[tuple[str, Any]]) -> list[dict]:
        out: list[dict] = []
        text = ""
        for kind, value in pieces + [("end", None)]:
            if kind == "text":
                text += value
                continue
            if text:
                if self.json_mode:
                    self.content.append(text)
                out.append(self._chunk({"content": text}, logprobs=self._take_logprobs()))
                text = ""
            if kind == "tool":
                call = openai_tool_call(value, index=self.tool_calls)
                self.tool_calls += 1
                out.append(self._chunk({"tool_calls": [call]}))
        return out

    def _finish(self, delta: Delta) -> list[dict]:
        self.done = True
        reason = finish_reason(delta.finish_reason, tool_calls=self.tool_calls > 0)
        last = self._chunk({}, finish=reason, logprobs=self._take_logprobs())
        if self.json_mode and (problem := json_error("".join(self.content))):
            last["choices"][0]["json_error"] = problem
        out = [last]
        if self.include_usage:
            out.append({**self.envelope(), "choices": [], "usage": usage_dict(delta.usage)})
        return out

    def _take_logprobs(self) -> Optional[dict]:
        taken, self.logprobs = self.logprobs, []
        return chat_logprobs(taken, self.top_logprobs)

    def envelope(self) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model}

    def _chunk(self, delta: dict, finish: Optional[str] = None, logprobs: Optional[dict] = None) -> dict:
        choice = {"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {**self.envelope(), "choices": [choice]}
