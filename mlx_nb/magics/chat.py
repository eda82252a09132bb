"""The pieces of `%%mlx chat`: `{var}` interpolation, the conversation, live rendering, the cell value.

Rendering has three modes: `live` (one Markdown display updated at a throttled rate: Jupyter),
`final` (one display at the end: nbval ignores update_display_data, MLX_NB_NO_STREAM=1) and
`terminal` (plain text deltas printed as they come: terminal IPython prints every update in full).
Markdown is always `mlx_nb.safe_markdown`'s: the model's HTML shows as text, never runs.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any, Optional

from mlx_nb.safe_markdown import markdown_bundle

# `{name}`, `{name.attr}`, `{Out[3]}`; `{{...}}` is left alone.
_FIELD = re.compile(r"(?<!\{)\{([A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[-?\d+\])*)\}(?!\})")
_STEP = re.compile(r"\.([A-Za-z_]\w*)|\[(-?\d+)\]")
_MISSING = object()


def _resolve(expr: str, namespace: dict) -> Any:
    head = re.match(r"[A-Za-z_]\w*", expr).group(0)
    value = namespace.get(head, _MISSING)
    for attr, index in _STEP.findall(expr[len(head):]):
        if value is _MISSING:
            break
        try:
            value = getattr(value, attr) if attr else value[int(index)]
        except (AttributeError, LookupError, TypeError):
            return _MISSING
    return value


def interpolate(text: str, namespace: dict) -> str:
    """Replace `{name}` / `{name.attr}` / `{name[i]}` found in `namespace`; leave the rest as written."""

    def sub(m: re.Match) -> str:
        value = _resolve(m.group(1), namespace)
        return m.group(0) if value is _MISSING else str(value)

    return _FIELD.sub(sub, text)


class Conversation:
    """One notebook's chat: the system prompt and the last `max_turns` (user, assistant) pairs.

    Only text is kept: an image goes with its own turn, so history never resends megabytes.
    """

    def __init__(self, max_turns: int = 20):
        self.max_turns = max_turns
        self.system: Optional[str] = None
        self.turns: list[tuple[str, str]] = []

    def messages(self, prompt: str) -> list[dict]:
        out = [{"role": "system", "content": self.system}] if self.system else []
        for user, assistant in self.turns:
            out += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        return out + [{"role": "user", "content": prompt}]

    def add(self, prompt: str, answer: str) -> None:
        self.turns.append((prompt, answer))
        del self.turns[: max(0, len(self.turns) - self.max_turns)]

    def clear(self) -> None:
        self.system = None
        self.turns.clear()

    def __len__(self) -> int:
        return len(self.turns)


class ChatAnswer(str):
    """The cell's value: the answer text (a str), not displayed again by the cell that streamed it.

    IPython's displayhook asks `_ipython_display_` first; in the producing cell (same execution
    count) it does nothing, so the answer shows once (the streamed display) yet lands in `_` and
    `Out[n]`. Shown later (`Out[3]`, `answer`), it renders as (escaped) Markdown with a text/plain fallback.
    """

    reply: Any = None
    cell: Optional[int] = None

    def __new__(cls, text: str, reply: Any = None, cell: Optional[int] = None):
        obj = super().__new__(cls, text)
        obj.reply, obj.cell = reply, cell
        return obj

    def __repr__(self) -> str:
        return str(self)

    def _ipython_display_(self) -> None:
        from IPython import get_ipython
        from IPython.display import display

        ip = get_ipython()
        if ip is not None and self.cell is not None and ip.execution_count == self.cell:
            return
        display(markdown_bundle(str(self)), raw=True)


def render(stream, mode: str, hz: float = 10.0) -> str:
    """Show the chunks of `stream` as they arrive; returns the whole text."""
    parts: list[str] = []
    if mode == "terminal":
        try:
            for chunk in stream:
                parts.append(chunk)
                sys.stdout.write(chunk)
                sys.stdout.flush()
        finally:
            sys.stdout.write("\n")
        return "".join(parts)
    if mode == "final":
        try:
            for chunk in stream:
                parts.append(chunk)
        finally:
            _display_markdown("".join(parts))
        return "".join(parts)
    from IPython.display import display

    handle = display(markdown_bundle(""), raw=True, display_id=True)
    period, last = 1.0 / hz, time.monotonic()
    try:
        for chunk in stream:
            parts.append(chunk)
            now = time.monotonic()
            if now - last >= period:
                handle.update(markdown_bundle("".join(parts)), raw=True)
                last = now
    finally:  # the last update holds the whole text, also after an interrupt or an error
        handle.update(markdown_bundle("".join(parts)), raw=True)
    return "".join(parts)


def _display_markdown(text: str) -> None:
    from IPython.display import display

    display(markdown_bundle(text), raw=True)
