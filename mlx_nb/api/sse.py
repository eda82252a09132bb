"""Server-sent-events framing, the one wire detail every streaming route shares.

Returns bytes so a handler can write them as they are; JSON is compact and keeps non-ASCII text
as UTF-8 (smaller, and what the OpenAI and Anthropic servers send).
"""

from __future__ import annotations

import json
from typing import Optional, Union

DONE = b"data: [DONE]\n\n"


def sse_event(data: Union[dict, list, str], event: Optional[str] = None) -> bytes:
    """One event: an optional `event: <name>` line, then `data:` line(s), then a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    # A newline inside the payload would end the data field early: each line gets its own prefix.
    body = "".join(f"data: {line}\n" for line in text.split("\n"))
    return f"{head}{body}\n".encode("utf-8")


def sse_done() -> bytes:
    """The OpenAI end-of-stream sentinel (`data: [DONE]`); Anthropic streams end with message_stop."""
    return DONE


def sse_comment(text: str = "") -> bytes:
    """A comment line (`: ...`); clients ignore it, proxies see traffic. Use as a keep-alive."""
    return f": {text}\n\n".encode("utf-8")
