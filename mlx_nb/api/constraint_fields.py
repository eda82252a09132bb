"""The wire's names for an output constraint, read into the engine's `Constraint`.

OpenAI's `response_format` (json_object / json_schema, `strict` closing every object), llama.cpp's
`json_schema` and `grammar` (GBNF) and vLLM's `guided_json`, `guided_regex` and `guided_grammar`
(Lark) all say the same thing in different words; the routes, the Client and the magics read them
here, and the engine sees only the `Constraint` (engine/sampling/constrained.py). `wire_fields` is the way
back, for a route that relays a request to another OpenAI-compatible server.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from mlx_nb.engine import Constraint, closed
from mlx_nb.engine import RequestError

ANY_JSON_OBJECT = {"type": "object"}  # response_format json_object: any object


def constraint_of(response_format: Optional[dict] = None, **extensions: Any) -> Optional[Constraint]:
    """The constraint a request asks for: OpenAI's `response_format` (json_object / json_schema),
    or one of the extension fields servers of this kind take (llama.cpp's `json_schema` and `grammar`
    (GBNF), vLLM's `guided_json`, `guided_regex` and `guided_grammar` (Lark)); None for none.
    At most one may be given."""
    given = {k: v for k, v in extensions.items() if v is not None}
    fmt = response_format or {}
    if not isinstance(fmt, dict) or fmt.get("type", "text") not in ("text", "json_object", "json_schema"):
        raise RequestError("response_format: type must be text, json_object or json_schema", "response_format")
    if fmt.get("type") in ("json_object", "json_schema"):
        given["response_format"] = fmt
    if len(given) > 1:
        raise RequestError(f"give one output constraint, not {', '.join(sorted(given))}", sorted(given)[1])
    if not given:
        return None
    (name, value), = given.items()
    if name == "response_format":
        if value["type"] == "json_object":
            return Constraint("json_schema", ANY_JSON_OBJECT, name)
        spec = value.get("json_schema") or {}
        schema = _schema(spec["schema"] if spec.get("schema") is not None else ANY_JSON_OBJECT, name)
        return Constraint("json_schema", closed(schema) if spec.get("strict") else schema, name)
    if name in ("json_schema", "guided_json"):
        return Constraint("json_schema", _schema(value, name), name)
    if name == "guided_regex":
        return Constraint("regex", _text(value, name), name)
    if name == "guided_grammar":
        return Constraint("lark", _text(value, name), name)
    if name == "grammar":
        return Constraint("gbnf", _text(value, name), name)
    raise RequestError(f"unknown output constraint {name!r}", name)


def wire_fields(constraint: Constraint) -> dict:
    """The request fields that ask an OpenAI-compatible backend for the same constraint."""
    if constraint.kind == "tool_call":
        return {}  # the request's own tool_choice says it
    if constraint.kind == "json_schema":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "output", "schema": constraint.value, "strict": True}}}
    return {{"regex": "guided_regex", "lark": "guided_grammar", "gbnf": "grammar"}[constraint.kind]: constraint.value}


def _schema(value: Any, field: str) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise RequestError(f"{field}: not a JSON schema (the string is not JSON)", field) from None
    if not isinstance(value, dict):
        raise RequestError(f"{field}: a JSON schema is an object, not {type(value).__name__}", field)
    return value


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RequestError(f"{field}: give the pattern or grammar as a non-empty string", field)
    return value
