"""Errors a wire request can end in, rendered in the OpenAI or the Anthropic error shape.

One exception type for the whole API layer, so the HTTP handlers have a single `except` and a
single place that picks the status code. Every message is one line that names the bad field,
because SDKs show `message` to the user verbatim.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import ValidationError

from mlx_nb.engine import ContextOverflowError, RequestError, TooLargeError

# OpenAI puts the kind of error in `type`; Anthropic has its own vocabulary, chosen by status.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class APIError(Exception):
    """A request that ends in an HTTP error; carries everything both wire shapes need."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: Optional[str] = None,
        code: Optional[str] = None,
        anthropic_message: Optional[str] = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.anthropic_message = anthropic_message  # where Anthropic's API words it differently

    def to_dict(self) -> dict:
        """The OpenAI body: `{"error": {"message", "type", "param", "code"}}`."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def to_anthropic_dict(self) -> dict:
        """The Anthropic body: `{"type": "error", "error": {"type", "message"}}`."""
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.anthropic_message or self.message}}

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.message!r}, param={self.param!r})"


def invalid_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def model_not_found(name: str, available: Optional[list[str]] = None) -> APIError:
    hint = f"; available: {', '.join(available)}" if available else ""
    return APIError(
        404, f"The model {name!r} does not exist{hint}", "invalid_request_error", "model", "model_not_found"
    )


def not_found(message: str) -> APIError:
    return APIError(404, message, "not_found_error", None, "not_found")


def request_too_large(size: int, limit: int) -> APIError:
    return APIError(
        413, f"request body is {size} bytes; the limit is {limit}", "invalid_request_error", None, "request_too_large"
    )


def model_loading(name: str = "the model") -> APIError:
    """503 while weights load: clients should retry, so this is not a 4xx."""
    return APIError(503, f"{name} is still loading; retry shortly", "service_unavailable", None, "model_loading")


def server_error(message: str) -> APIError:
    return APIError(500, message, "server_error", None, None)


def context_overflow(exc: ContextOverflowError, param: Optional[str] = None) -> APIError:
    """A prompt longer than the context, worded as each API words it, so clients recognise it and
    compact the conversation: OpenAI's `context_length_exceeded` ("maximum context length is N
    tokens"), Anthropic's "prompt is too long: N tokens > M maximum"."""
    field = param or exc.field or "messages"
    share = f" ({exc.system_tokens} of them in the system prompt and tools)" if exc.system_tokens else ""
    message = (f"This model's maximum context length is {exc.context} tokens. However, your {field} resulted in "
               f"{exc.prompt_tokens} tokens{share}. Please reduce the length of the {field}.")
    anthropic = f"prompt is too long: {exc.prompt_tokens} tokens > {exc.context - 1} maximum{share}"
    return APIError(400, message, "invalid_request_error", field, "context_length_exceeded", anthropic)


def from_request_error(exc: RequestError, fields: Optional[dict] = None) -> APIError:
    """The engine refused the request at submit time (bad role, image to a text model, ...);
    a part over a size limit (an image too big) is a 413, like a body over the limit. `fields`
    maps the engine's field names to the route's own (the Responses API's `input`)."""
    field = (fields or {}).get(exc.field, exc.field)
    if isinstance(exc, ContextOverflowError):
        return context_overflow(exc, field)
    if isinstance(exc, TooLargeError):
        return APIError(413, str(exc), "invalid_request_error", field, "request_too_large")
    return invalid_request(str(exc), field)


def from_validation_error(exc: ValidationError, data: Any = None) -> APIError:
    """A 400 naming the bad field by its dotted path, e.g. `messages.0.role: Input should be ...`.

    `data` is the validated input: pydantic puts union/type tags into error locations, and walking
    the real input tells real keys from tags. The deepest error wins (a list with one bad part
    should blame the part, not say "Input should be a valid string"); a union failing on every
    branch at the same place has its messages merged.
    """
    errors = [(_dotted(e, data), _clean(e["msg"])) for e in exc.errors(include_url=False)]
    path = max((p for p, _ in errors), key=lambda p: p.count(".") + bool(p))
    msgs: list[str] = []
    for p, msg in errors:
        if p == path and msg not in msgs:
            msgs.append(msg)
    text = "; or ".join(msgs)
    return invalid_request(f"{path}: {text}" if path else text, path or None)


def _clean(msg: str) -> str:
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def _dotted(err: dict, data: Any) -> str:
    """Keep loc segments that exist in the input (plus a missing field); drop pydantic's tags."""
    loc = err["loc"]
    if data is None:
        return ".".join(map(str, loc))
    kept: list[str] = []
    node = data
    for i, seg in enumerate(loc):
        if isinstance(node, dict) and seg in node:
            node = node[seg]
        elif isinstance(node, list) and isinstance(seg, int) and 0 <= seg < len(node):
            node = node[seg]
        elif not (i == len(loc) - 1 and err["type"] == "missing"):
            continue  # a tag such as 'str', 'list[...]' or a model name
        kept.append(str(seg))
    return ".".join(kept)
