"""Response and tool-call ids. Built from the engine's request id where there is one, so a
`chatcmpl-…` / `msg_…` id in a client log can be matched to the engine's events and `abort`."""

from __future__ import annotations

import uuid
from typing import Optional


def prefixed_id(prefix: str, request_id: Optional[str]) -> str:
    """`chatcmpl-<engine id>`; a random id when the engine gave none."""
    if not request_id:
        return prefix + uuid.uuid4().hex[:24]
    return request_id if request_id.startswith(prefix) else prefix + request_id


def new_call_id(prefix: str = "call_") -> str:
    """A fresh tool-call id (`call_…` for OpenAI, `toolu_…` for Anthropic)."""
    return prefix + uuid.uuid4().hex[:24]
