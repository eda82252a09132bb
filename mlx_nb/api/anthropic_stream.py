"""Engine Deltas -> Anthropic Messages stream events.

Event order: message_start; per content block content_block_start, content_block_delta(s),
content_block_stop (a `ping` after the first block starts, as Anthropic's own server does); a
thinking model's reasoning first, as a `thinking` block (thinking_delta, then a signature_delta);
message_delta (stop_reason, stop_sequence, usage); message_stop. `start(input_tokens)` gives
message_start as soon as the request is admitted, with the prompt's real token count (the cache
split is known only later: message_delta carries the final counts, which the anthropic SDK
takes). Each event is `(event_name, data)`; write it with `sse_event(data, event=event_name)`.
No `[DONE]` sentinel. An engine error mid-stream yields an `error` event, which the SDK raises.
"""

from __future__ import annotations

import json
from typing import Optional

from mlx_nb.api.anthropic_messages import MessagesRequest, anthropic_usage, stop_reason
from mlx_nb.api.ids import prefixed_id
from mlx_nb.api.tool_calls import ToolCallSplitter, ToolParser, anthropic_tool_use
from mlx_nb.engine import Delta, Usage

Event = tuple[str, dict]


def error_event(message: str, kind: str = "api_error") -> Event:
    return ("error", {"type": "error", "error": {"type": kind, "message": message}})


class MessagesStream:
    """`feed(delta, matched_stop=None)` returns the events to send for that delta."""

    def __init__(
        self,
        model: str,
        request_id: str,
        tool_parser: Optional[ToolParser] = None,
        tool_markers: Optional[tuple[str, str]] = None,
        *,
        tools: Optional[list] = None,
        parse_tools: bool = True,
    ):
        self.model = model
        self.id = prefixed_id("msg_", request_id)
        self.splitter = ToolCallSplitter(tool_parser, tool_markers, tools, enabled=parse_tools)
        self.started = False
        self.done = False
        self.index = 0  # index of the next content block
        self.text_open = False
        self.thinking_open = False
        self.pinged = False
        self.tool_used = False

    @classmethod
    def for_request(
        cls,
        req: MessagesRequest,
        *,
        model: str,
        request_id: str,
        tool_parser: Optional[ToolParser] = None,
        tool_markers: Optional[tuple[str, str]] = None,
    ) -> "MessagesStream":
        """A stream configured from a parsed `MessagesRequest` (its tools decide tool parsing)."""
        return cls(model, request_id, tool_parser, tool_markers, tools=req.openai_tools(), parse_tools=req.wants_tools)

    def start(self, input_tokens: Optional[int] = None) -> list[Event]:
        """message_start, once (from the first delta's usage when not called at admission)."""
        if self.started:
            return []
        self.started = True
        return [self._message_start(Usage(prompt_tokens=input_tokens or 0))]

    def feed(self, delta: Delta, matched_stop: Optional[str] = None) -> list[Event]:
        if self.done:
            return []
        out: list[Event] = []
        if not self.started:
            self.started = True
            out.append(self._message_start(delta.usage))
        if delta.error or delta.finish_reason == "error":
            self.done = True
            out.append(error_event(delta.error or "generation failed"))
            return out
        if delta.reasoning:
            out.extend(self._thinking(delta.reasoning))
        pieces = self.splitter.feed(delta.text)
        if delta.finish_reason is not None:
            pieces += self.splitter.finish()
        for kind, value in pieces:
            out.extend(self._close_thinking())
            out.extend(self._text(value) if kind == "text" else self._tool(value))
        if delta.finish_reason is not None:
            out.extend(self._finish(delta, matched_stop))
        return out

    def _message_start(self, usage: Optional[Usage]) -> Event:
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**anthropic_usage(usage), "output_tokens": 0},
        }
        return ("message_start", {"type": "message_start", "message": message})

    def _block_start(self, block: dict) -> list[Event]:
        out = [("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})]
        if not self.pinged:
            self.pinged = True
            out.append(("ping", {"type": "ping"}))
        return out

    def _block_delta(self, delta: dict) -> Event:
        return ("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def _block_stop(self) -> Event:
        event = ("content_block_stop", {"type": "content_block_stop", "index": self.index})
        self.index += 1
        self.text_open = self.thinking_open = False
        return event

    def _thinking(self, text: str) -> list[Event]:
        out: list[Event] = []
        if not self.thinking_open:
            out.extend(self._block_start({"type": "thinking", "thinking": "", "signature": ""}))
            self.thinking_open = True
        out.append(self._block_delta({"type": "thinking_delta", "thinking": text}))
        return out

    def _close_thinking(self) -> list[Event]:
        if not self.thinking_open:
            return []
        return [self._block_delta({"type": "signature_delta", "signature": ""}), self._block_stop()]

    def _text(self, text: str) -> list[Event]:
        out: list[Event] = []
        if not self.text_open:
            out.extend(self._block_start({"type": "text", "text": ""}))
            self.text_open = True
        out.append(self._block_delta({"type": "text_delta", "text": text}))
        return out

    def _tool(self, call: dict) -> list[Event]:
        out: list[Event] = [self._block_stop()] if self.text_open else []
        block = anthropic_tool_use(call)
        self.tool_used = True
        out.extend(self._block_start({**block, "input": {}}))
        out.append(
            self._block_delta(
                {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
            )
        )
        out.append(self._block_stop())
        return out

    def _finish(self, delta: Delta, matched_stop: Optional[str]) -> list[Event]:
        self.done = True
        out: list[Event] = self._close_thinking() + ([self._block_stop()] if self.text_open else [])
        reason = stop_reason(delta.finish_reason, tool_use=self.tool_used, matched_stop=matched_stop)
        out.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": reason,
                        "stop_sequence": matched_stop if reason == "stop_sequence" else None,
                    },
                    "usage": anthropic_usage(delta.usage),
                },
            )
        )
        out.append(("message_stop", {"type": "message_stop"}))
        return out
