"""Find tool calls in generated text, whole or streamed piece by piece, with mlx_lm's parsers.

A model calls a tool by writing markup between two markers (Qwen/Hermes: `<tool_call>{json}
</tool_call>`). mlx_lm ships one parser per markup family (`mlx_lm.tool_parsers.*`, each a
`parse_tool_call(text, tools)` plus `tool_call_start` / `tool_call_end`) and the tokenizer wrapper
picks one per model; the HTTP layer passes that parser and those markers in. Without them the
`json_tools` convention applies: `<tool_call>` markers around `{"name", "arguments"}` JSON. Its
parser is one line and is restated here, because importing `mlx_lm` loads MLX and transformers and
this layer stays free of both (a test checks the two agree).

The splitter is the single place that buffers: text that might be the start of a marker is held
back, text inside markers never reaches the client as content, and a call that cannot be parsed
(e.g. cut off by max_tokens) comes back as plain text rather than vanishing.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from mlx_nb.api.ids import new_call_id
from mlx_nb.engine import TOOL_MARKERS as MARKERS

ToolParser = Callable[[str, Any], Any]
DEFAULT_MARKERS = MARKERS  # mlx_lm.tool_parsers.json_tools' markers, which the generic format uses too


def default_parser(text: str, tools: Any = None) -> Any:
    """mlx_lm.tool_parsers.json_tools.parse_tool_call."""
    return json.loads(text.strip())


class ToolCallSplitter:
    """Feed text pieces; get back `("text", str)` and `("tool", {"name", "arguments": dict, "id"?})`."""

    def __init__(
        self,
        parser: Optional[ToolParser] = None,
        markers: Optional[tuple[str, str]] = None,
        tools: Optional[list] = None,
        enabled: bool = True,
    ):
        self.parser = parser or default_parser
        self.start, self.end = markers or DEFAULT_MARKERS
        self.tools = tools
        self.enabled = enabled and bool(self.start)
        self.buffer = ""
        self.in_call = False
        self.calls = 0

    def feed(self, text: str) -> list[tuple[str, Any]]:
        if not self.enabled:
            return [("text", text)] if text else []
        self.buffer += text
        out: list[tuple[str, Any]] = []
        while True:
            if not self.in_call:
                at = self.buffer.find(self.start)
                if at < 0:
                    keep = _partial_suffix(self.buffer, self.start)
                    _emit_text(out, self.buffer[: len(self.buffer) - keep])
                    self.buffer = self.buffer[len(self.buffer) - keep :]
                    return out
                _emit_text(out, self.buffer[:at])
                self.buffer = self.buffer[at + len(self.start) :]
                self.in_call = True
            else:
                at = self.buffer.find(self.end) if self.end else -1
                if at < 0:
                    return out  # keep buffering the call until its end marker (or the end of the reply)
                out.extend(self._parse(self.buffer[:at]))
                self.buffer = self.buffer[at + len(self.end) :]
                self.in_call = False

    def finish(self) -> list[tuple[str, Any]]:
        """The reply ended: flush a held-back partial marker, or try to parse an unclosed call."""
        out: list[tuple[str, Any]] = []
        if self.in_call:
            out.extend(self._parse(self.buffer, closed=False))
        else:
            _emit_text(out, self.buffer)
        self.buffer, self.in_call = "", False
        return out

    def _parse(self, body: str, closed: bool = True) -> list[tuple[str, Any]]:
        try:
            parsed = self.parser(body, self.tools)
            calls = [_neutral(c) for c in (parsed if isinstance(parsed, list) else [parsed])]
            if not calls:
                raise ValueError("no tool call in the markup")
        except (ValueError, TypeError, KeyError, SyntaxError, AttributeError):
            raw = self.start + body + (self.end if closed else "")
            return [("text", raw)]
        self.calls += len(calls)
        return [("tool", c) for c in calls]


def split_tool_calls(
    text: str,
    tools: Optional[list] = None,
    parser: Optional[ToolParser] = None,
    markers: Optional[tuple[str, str]] = None,
) -> tuple[str, list[dict]]:
    """The non-stream path: (text with the calls removed, calls in order)."""
    splitter = ToolCallSplitter(parser, markers, tools)
    content, calls = [], []
    for kind, value in splitter.feed(text) + splitter.finish():
        (content if kind == "text" else calls).append(value)
    return "".join(content), calls


def openai_tool_call(call: dict, index: Optional[int] = None) -> dict:
    """`{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}` (+ index in streams)."""
    args = call["arguments"]
    out = {
        "id": call.get("id") or new_call_id(),
        "type": "function",
        "function": {
            "name": call["name"],
            "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
        },
    }
    return {"index": index, **out} if index is not None else out


def anthropic_tool_use(call: dict) -> dict:
    """`{"type": "tool_use", "id": "toolu_…", "name", "input": {...}}`."""
    args = call["arguments"]
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            args = {"_raw": args}
    call_id = call.get("id")
    return {
        "type": "tool_use",
        "id": call_id if call_id and call_id.startswith("toolu_") else new_call_id("toolu_"),
        "name": call["name"],
        "input": args if isinstance(args, dict) else {"value": args},
    }


def _neutral(call: Any) -> dict:
    """Parsers return `{"name", "arguments"}`; Hermes-style models sometimes say "parameters"."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError(f"not a tool call: {call!r}")
    args = call.get("arguments", call.get("parameters", {}))
    out = {"name": call["name"], "arguments": {} if args is None else args}
    if call.get("id"):
        out["id"] = str(call["id"])
    return out


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker` (hold it back)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _emit_text(out: list, text: str) -> None:
    if text:
        out.append(("text", text))
