"""Engine Deltas -> OpenAI Responses stream events (`event: <type>` + data with `sequence_number`).

Order: response.created and response.in_progress at admission (`start()`); for text, one message
item (output_item.added, content_part.added, output_text.delta..., output_text.done,
content_part.done, output_item.done); each tool call as a function_call item (output_item.added,
function_call_arguments.delta / .done, output_item.done) once its end marker arrives; then
response.completed, or response.incomplete when max_output_tokens ran out (as OpenAI does).
An engine error mid-stream yields an `error` event, which the openai SDK raises.
"""

from __future__ import annotations

from typing import Optional

from mlx_nb.api.ids import prefixed_id
from mlx_nb.api.openai_responses import (
    ResponsesRequest,
    function_call_item,
    message_item,
    reasoning_item,
    response_object,
    responses_status,
)
from mlx_nb.api.tool_calls import ToolCallSplitter, ToolParser
from mlx_nb.engine import Delta

Event = tuple[str, dict]


class ResponsesStream:
    """`start()` once, then `feed(delta)`: each returns `(event_type, data)` pairs."""

    def __init__(
        self,
        req: ResponsesRequest,
        *,
        model: str,
        created: int,
        request_id: str,
        tool_parser: Optional[ToolParser] = None,
        tool_markers: Optional[tuple[str, str]] = None,
    ):
        self.req, self.model, self.created = req, model, created
        self.id = prefixed_id("resp_", request_id)
        self.message_id = prefixed_id("msg_", request_id)
        self.reasoning_id = prefixed_id("rs_", request_id)
        self.reasoning: Optional[str] = None  # the open reasoning item's text (None: none open)
        self.splitter = ToolCallSplitter(tool_parser, tool_markers, req.chat_tools(), enabled=req.wants_tools)
        self.output: list[dict] = []  # finished items, for the final response object
        self.text: Optional[str] = None  # the open message's text (None: no message open)
        self.logprobs: list = []  # the engine's logprobs not yet sent with a text delta
        self.text_logprobs: list[dict] = []  # the open message's, as sent
        self.seq = 0
        self.started = False
        self.done = False

    def _event(self, kind: str, **data) -> Event:
        event = (kind, {"type": kind, "sequence_number": self.seq, **data})
        self.seq += 1
        return event

    def _response(self, status: str, usage=None) -> dict:
        return response_object(self.req, response_id=self.id, model=self.model, created=self.created,
                               output=list(self.output), status=status, usage=usage)

    def start(self) -> list[Event]:
        if self.started:
            return []
        self.started = True
        snapshot = self._response("in_progress")
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def feed(self, delta: Delta) -> list[Event]:
        if self.done:
            return []
        out = self.start()
        if delta.error or delta.finish_reason == "error":
            self.done = True
            out.append(self._event("error", code="server_error", message=delta.error or "generation failed",
                                   param=None))
            return out
        self.logprobs.extend(delta.logprobs)
        if delta.reasoning:
            out.extend(self._reasoning(delta.reasoning))
        pieces = self.splitter.feed(delta.text)
        if delta.finish_reason is not None:
            pieces += self.splitter.finish()
        for kind, value in pieces:
            out.extend(self._close_reasoning())
            out.extend(self._text(value) if kind == "text" else self._call(value))
        if delta.finish_reason is not None:
            self.done = True
            out.extend(self._close_reasoning())
            out.extend(self._close_message())
            status = responses_status(delta.finish_reason)
            out.append(self._event(f"response.{status}", response=self._response(status, delta.usage)))
        return out

    @property
    def _index(self) -> int:
        return len(self.output)

    def _reasoning(self, text: str) -> list[Event]:
        """A thinking model's reasoning: a `reasoning` item whose text streams as reasoning_text deltas."""
        out: list[Event] = []
        if self.reasoning is None:
            self.reasoning = ""
            out.append(self._event("response.output_item.added", output_index=self._index,
                                   item=reasoning_item(self.reasoning_id, "", status="new")))
        self.reasoning += text
        out.append(self._event("response.reasoning_text.delta", output_index=self._index, content_index=0,
                               item_id=self.reasoning_id, delta=text))
        return out

    def _close_reasoning(self) -> list[Event]:
        if self.reasoning is None:
            return []
        text, self.reasoning = self.reasoning, None
        item = reasoning_item(self.reasoning_id, text)
        out = [self._event("response.reasoning_text.done", output_index=self._index, content_index=0,
                           item_id=self.reasoning_id, text=text),
               self._event("response.output_item.done", output_index=self._index, item=item)]
        self.output.append(item)
        return out

    def _text(self, text: str) -> list[Event]:
        out: list[Event] = []
        if self.text is None:
            self.text = ""
            out.append(self._event("response.output_item.added", output_index=self._index,
                                   item=message_item(self.message_id, "", status="new")))
            out.append(self._event("response.content_part.added", output_index=self._index, content_index=0,
                                   item_id=self.message_id, part=_text_part("")))
        self.text += text
        logprobs, self.logprobs = self.req.wire_logprobs(self.logprobs), []
        self.text_logprobs += logprobs
        out.append(self._event("response.output_text.delta", output_index=self._index, content_index=0,
                               item_id=self.message_id, delta=text, logprobs=logprobs))
        return out

    def _close_message(self) -> list[Event]:
        if self.text is None:
            return []
        text, self.text = self.text, None
        logprobs, self.text_logprobs = self.text_logprobs, []
        where = dict(output_index=self._index, content_index=0, item_id=self.message_id)
        item = message_item(self.message_id, text, logprobs=logprobs)
        out = [self._event("response.output_text.done", **where, text=text, logprobs=logprobs),
               self._event("response.content_part.done", **where, part=_text_part(text, logprobs)),
               self._event("response.output_item.done", output_index=self._index, item=item)]
        self.output.append(item)
        return out

    def _call(self, call: dict) -> list[Event]:
        out = self._close_message()
        item = function_call_item(self.req.wire_call(call))
        where = dict(output_index=self._index, item_id=item["id"])
        out.append(self._event("response.output_item.added", output_index=self._index,
                               item={**item, "arguments": "", "status": "in_progress"}))
        out.append(self._event("response.function_call_arguments.delta", **where, delta=item["arguments"]))
        out.append(self._event("response.function_call_arguments.done", **where, name=item["name"],
                               arguments=item["arguments"]))
        out.append(self._event("response.output_item.done", output_index=self._index, item=item))
        self.output.append(item)
        return out


def _text_part(text: str, logprobs: Optional[list[dict]] = None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
