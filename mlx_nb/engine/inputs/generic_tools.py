"""Tools for models whose chat template renders none.

Many chat templates (the default model's among them) ignore the `tools` they are given, so the
tool definitions would vanish from the prompt and the model could never call one. For those
templates the definitions go into the system prompt in one generic format, and the conversation's
earlier calls and results are written in the same markup, so the model reads them:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The HTTP layer parses calls back with the same markers (`api.tool_calls`, its `json_tools`
default). `docs/tools.md` documents the format.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

MARKERS = ("<tool_call>", "</tool_call>")  # mlx_lm.tool_parsers.json_tools' markers
RESULT_MARKERS = ("<tool_response>", "</tool_response>")
TEMPLATE, GENERIC = "template", "generic"

_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_7f3a", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}
_renders: dict[str, bool] = {}


def tool_format(render: Callable[..., str], template: Optional[str]) -> str:
    """TEMPLATE when the chat template writes tools it is given into the prompt, else GENERIC.

    `render(messages, tools)` applies the template; the answer is kept per template text."""
    if template is None:
        return GENERIC
    if template not in _renders:
        hello = [{"role": "user", "content": "hello"}]
        try:
            _renders[template] = "probe_tool_7f3a" in render(hello, [_PROBE_TOOL])
        except Exception:  # a template that fails on tools cannot use them either
            _renders[template] = False
    return TEMPLATE if _renders[template] else GENERIC


def _example(tool: dict) -> str:
    fn = tool.get("function", tool)
    params = (fn.get("parameters") or {}).get("properties") or {}
    args = {name: "..." for name in list(params)[:2]}
    return json.dumps({"name": fn.get("name", "tool_name"), "arguments": args})


def system_prompt(tools: list) -> str:
    """The tool definitions and the calling convention, as a system prompt section."""
    start, end = MARKERS
    lines = [
        "# Tools",
        "",
        "You can call the tools below. To call one, reply with a JSON object holding its name and its "
        f"arguments between {start} and {end}, for example:",
        start,
        _example(tools[0]),
        end,
        f"Each result comes back in a later message between {RESULT_MARKERS[0]} and {RESULT_MARKERS[1]}.",
        "",
        "Available tools (JSON schema):",
    ]
    lines += [json.dumps(t, ensure_ascii=False) for t in tools]
    return "\n".join(lines)


def _call_text(call: dict) -> str:
    fn = call.get("function", {})
    body = json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments", {})}, ensure_ascii=False)
    return f"{MARKERS[0]}\n{body}\n{MARKERS[1]}"


def inline_tools(messages: list[dict], tools: Optional[list]) -> list[dict]:
    """The normalized conversation with the tool definitions in its system message, assistant
    tool calls as text in the generic markup and tool results as user turns; consecutive turns of
    one role merged again (strict templates want them alternating)."""
    from mlx_nb.engine.inputs.messages import normalize_messages

    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool":
            out.append({"role": "user", "content": f"{RESULT_MARKERS[0]}\n{m['content']}\n{RESULT_MARKERS[1]}"})
        elif m.get("tool_calls"):
            calls = "\n".join(_call_text(c) for c in m["tool_calls"])
            content = m["content"]
            if isinstance(content, list):
                out.append({"role": "assistant", "content": [*content, {"type": "text", "text": "\n" + calls}]})
            else:
                out.append({"role": "assistant", "content": f"{content}\n{calls}" if content else calls})
        else:
            out.append(m)
    if tools:  # hoisted after the caller's own system prompt
        out.append({"role": "system", "content": system_prompt(tools)})
    return normalize_messages(out)


def with_tools(render: Callable[..., Any], template: Optional[str], messages: list[dict],
               tools: Optional[list]) -> Any:
    """`render(messages, tools)` for any template: natively when it renders tools, else with the
    tools inlined in the generic format."""
    uses_tools = tools or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
    if uses_tools and tool_format(render, template) == GENERIC:
        return render(inline_tools(messages, tools), None)
    return render(messages, tools)
