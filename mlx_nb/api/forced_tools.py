"""A `tool_choice` that demands a call ("required", Anthropic's "any", or one named function): the
reply is held to one call of an allowed function, its arguments to that function's JSON schema,
in the tool-call markup the server parses back (engine/sampling/constrained.py: `tool_call`).

Only a markup whose call is JSON between two markers can be held this way: the generic format
(engine/inputs/generic_tools.py) and mlx_lm's `json_tools` parser (Qwen, Hermes and others). For any other
markup the choice acts as "auto", and `enforced` says so (the routes' `X-MLX-Tool-Choice` header).
"""

from __future__ import annotations

from typing import Any, Optional, Union

from mlx_nb.api.tool_calls import DEFAULT_MARKERS
from mlx_nb.engine import closed, tool_call
from mlx_nb.engine import RequestError

Forced = Union[bool, str, None]  # True: any of the tools; a name: that one; None: no call demanded


def json_call_markers(serving: Any) -> Optional[tuple[str, str]]:
    """The markers around a JSON call in this server's tool markup, or None if it is another markup."""
    if serving.tool_format == "generic":
        return DEFAULT_MARKERS
    parser = serving.tool_parser
    if serving.tool_markers and (parser is None or getattr(parser, "__module__", "").endswith("json_tools")):
        return tuple(serving.tool_markers)
    return None


def forced_tool_kwargs(kwargs: dict, forced: Forced, serving: Any) -> dict:
    """`{"constraint": ...}` holding the reply to the demanded call, for engine kwargs whose `tools`
    are OpenAI function tools; {} when no call is demanded or the markup cannot be held."""
    tools = kwargs.get("tools") or []
    if not forced or not tools:
        return {}
    # a strict function's schema is closed to its listed properties, as OpenAI's strict mode requires
    functions = [(t["function"]["name"], closed(t["function"].get("parameters")) if t["function"].get("strict")
                  else t["function"].get("parameters")) for t in tools]
    if isinstance(forced, str):
        functions = [f for f in functions if f[0] == forced]
        if not functions:
            raise RequestError(f"tool_choice names {forced!r}, which is not one of the tools", "tool_choice")
    markers = json_call_markers(serving)
    return {"constraint": tool_call(functions, markers)} if markers else {}


def enforced(forced: Forced, serving: Any) -> Optional[str]:
    """The X-MLX-Tool-Choice header value: whether a demanded call is held to its schema."""
    if not forced:
        return None
    return "enforced" if json_call_markers(serving) else "not enforced: this model's tool markup is not JSON"
