"""The pieces of `%%mlx chat`: `{var}` interpolation, the conversation, live rendering, the cell value.

Rendering has three modes: `live` (one display, a waiting line until the first token, then the
Markdown answer updated at a throttled rate: Jupyter), `final` (one display at the end: nbval
ignores update_display_data, MLX_NB_NO_STREAM=1) and `terminal` (plain text deltas printed as
they come: terminal IPython prints every update in full). All end with a one-line footer.
Markdown is always `mlx_nb.safe_markdown`'s: the model's HTML shows as text, never runs.
"""

from __future__ import annotations

import html
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


class ChatView:
    """How one `%%mlx chat` answer is shown: a waiting line (with load progress) until the first
    token, the streamed answer, then a footer (model · tokens · tok/s · seconds)."""

    def __init__(self, mode: str, hz: float = 10.0):
        self.mode, self.period = mode, 1.0 / hz
        self.handle = None
        self._last_line = ""

    def waiting(self, line: str) -> None:
        """Show (or replace) the line that stands where the answer will appear."""
        if self.mode == "live":
            from IPython.display import display

            if self.handle is None:
                self.handle = display(_status_bundle(line), raw=True, display_id=True)
            else:
                self.handle.update(_status_bundle(line), raw=True)
        elif self.mode == "terminal" and line != self._last_line:
            print(line, file=sys.stderr, flush=True)
        self._last_line = line

    def loading(self, status: dict) -> None:
        """A `progress` callback for the Client: the load's phase in the waiting line."""
        from mlx_nb.models.progress import describe

        self.waiting(f"⏳ {describe(status)}")

    def withdraw(self) -> None:
        """The request failed before any answer: take the waiting line away."""
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)

    def render(self, stream) -> str:
        """Show the chunks of `stream` as they arrive; returns the whole text."""
        parts: list[str] = []
        if self.mode == "terminal":
            try:
                for chunk in stream:
                    parts.append(chunk)
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
            finally:
                sys.stdout.write("\n")
            return "".join(parts)
        if self.mode == "final":
            try:
                for chunk in stream:
                    parts.append(chunk)
            finally:
                from IPython.display import display

                display(markdown_bundle("".join(parts), _reasoning(stream), done=True), raw=True)
            return "".join(parts)
        if self.handle is None:
            self.waiting("⏳ waiting for the first token")
        last = time.monotonic()
        try:
            for chunk in stream:
                parts.append(chunk)
                now = time.monotonic()
                if now - last >= self.period:
                    self.handle.update(markdown_bundle("".join(parts), _reasoning(stream)), raw=True)
                    last = now
        finally:  # the last update holds the whole text, also after an interrupt or an error
            self.handle.update(markdown_bundle("".join(parts), _reasoning(stream), done=True), raw=True)
        return "".join(parts)

    def footer(self, reply) -> None:
        """model · tokens · tok/s · seconds, under the answer."""
        if reply is None:
            return
        line = footer_line(reply)
        if self.mode == "terminal":
            print(line, file=sys.stderr, flush=True)
            return
        from IPython.display import display

        display({"text/html": f"<div class='mlx-nb-footer' style='opacity:.65;font-size:85%'>{html.escape(line)}</div>",
                 "text/plain": line}, raw=True)


def _reasoning(stream) -> str:
    return getattr(stream, "reasoning", "") or ""


def footer_line(reply) -> str:
    """`smollm2-135m-instruct · 12 tokens · 34.5 tok/s · 0.8 s` (and why it stopped, unless it just ended)."""
    tokens = reply.usage.get("completion_tokens") or 0
    about = "≈" if reply.usage.get("estimated") else ""
    parts = [reply.model or "?", f"{about}{tokens} token{'s' if tokens != 1 else ''}"]
    if reply.tokens_per_s:
        parts.append(f"{reply.tokens_per_s:.1f} tok/s")
    parts.append(f"{reply.elapsed_s or 0:.1f} s")
    if reply.finish_reason not in ("stop", None):
        parts.append({"length": "stopped at max tokens", "abort": "stopped"}.get(reply.finish_reason,
                                                                                 reply.finish_reason))
    return " · ".join(parts)


def _status_bundle(line: str) -> dict:
    """Our own status line (not model output): dimmed HTML, with a plain-text twin."""
    return {"text/html": f"<div class='mlx-nb-waiting' style='opacity:.65'>{html.escape(line)}</div>",
            "text/plain": line}
