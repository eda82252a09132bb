"""ChatPanel: a chat box in a notebook output, streaming replies from the shared engine.

Generation runs on a worker thread and only writes widget state (comm messages go out whatever
cell is running), so the kernel stays free and several panels can stream at once, batched
together by the engine. Replies render as Markdown through an `Output` widget's outputs, escaped
first (`mlx_nb.safe_markdown`): Output widgets render as trusted, so raw HTML in a reply would run.

Layout: settings (model, temperature, max tokens) wrap onto a second line in narrow outputs; the
question box stretches while its buttons keep their size; the running counts sit on a line of
their own, so nothing shifts while a reply streams. Colours come from the JupyterLab theme.
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any, Optional
from urllib.parse import urlsplit

import ipywidgets as W

from mlx_nb.safe_markdown import markdown_bundle, safe_markdown
from mlx_nb.widgets.lifecycle import adopt

UPDATE_PERIOD_S = 0.1  # ~10 Hz: every update resends the whole reply
RATE_AFTER_S = 0.3  # a tokens/s readout needs this much decoding behind it to mean anything


def _markdown(out: W.Output, text: str, note: str = "", reasoning: str = "", done: bool = True) -> None:
    """Show model `text` (escaped: see mlx_nb.safe_markdown) followed by our own Markdown `note`;
    a thinking model's `reasoning` folded above it ("Thinking", open while it streams)."""
    bundle = markdown_bundle(text, reasoning, done)
    out.outputs = ({"output_type": "display_data",
                    "data": {"text/markdown": bundle["text/markdown"] + note, "text/plain": bundle["text/plain"] + note},
                    "metadata": {}},)


def _bubble(role: str, text: str) -> W.HTML:
    align = "right" if role == "user" else "left"
    tint = "22%" if role == "user" else "8%"
    bg = f"color-mix(in srgb, var(--jp-brand-color1, #1976d2) {tint}, var(--jp-layout-color1, #fff))"
    body = html.escape(text).replace("\n", "<br>")
    return W.HTML(f"<div style='text-align:{align}'><span style='display:inline-block;background:{bg};"
                  f"color:var(--jp-content-font-color1, #111);"
                  f"padding:4px 8px;border-radius:8px;max-width:90%;text-align:left'>{body}</span></div>")


# Copies the hidden textarea next to it: the clipboard API where the page is a secure context
# (https, localhost), a selected textarea and execCommand elsewhere. The text is escaped into the
# textarea; the script is constant, so no reply text ever becomes code.
_COPY_JS = ("const t=this.nextElementSibling.value;const b=this;"
            "const done=()=>{b.textContent='Copied';setTimeout(()=>{b.textContent='Copy'},1500)};"
            "if(navigator.clipboard&&window.isSecureContext){navigator.clipboard.writeText(t).then(done)}"
            "else{const a=document.createElement('textarea');a.value=t;document.body.appendChild(a);"
            "a.select();document.execCommand('copy');a.remove();done()}")


def copy_button(text: str) -> str:
    disabled = "" if text else " disabled"
    return (f'<button class="jupyter-button mlx-copy" title="Copy the last reply"{disabled} '
            f'onclick="{html.escape(_COPY_JS)}">Copy</button><textarea hidden>{html.escape(text)}</textarea>')


def counts(tokens: int, seconds: Optional[float], rate: Optional[float], estimated: bool = False) -> str:
    """`12 tokens · 35.1 tok/s · 0.8 s` (what is known so far)."""
    parts = [f"{'≈' if estimated else ''}{tokens} token{'s' if tokens != 1 else ''}"]
    if rate:
        parts.append(f"{rate:.1f} tok/s")
    if seconds is not None:
        parts.append(f"{seconds:.1f} s")
    return " · ".join(parts)


class ChatPanel(W.VBox):
    """`ChatPanel()` then type and press Enter; `.send(text)` does the same from code."""

    def __init__(self, client: Any = None, *, engine: Any = None, system: Optional[str] = None,
                 max_tokens: int = 512, temperature: float = 0.0, **kwargs):
        from mlx_nb.client import Client

        self.client = client or Client(engine=engine)
        self.system = system
        self.messages: list[dict] = []  # the conversation sent with each question (text only)
        self.replies: list = []  # ChatReply per answer
        self._stream = None
        self._stop_requested = False
        self._worker: Optional[threading.Thread] = None
        self._idle = threading.Event()
        self._idle.set()

        wide = {"description_width": "initial"}
        backend = self.client.backend
        # index=0 given: ipywidgets otherwise leaves a None-valued first option unselected on some runs
        self.model = W.Dropdown(options=self._model_options(), index=0, description="model", style=wide,
                                tooltip=f"served by {backend}",
                                layout=W.Layout(flex="1 1 220px", min_width="180px", max_width="380px"))
        where = "embedded" if self.client.embedded else f"server {urlsplit(backend).netloc or backend}"
        self.backend_label = W.Label(where, tooltip=backend, layout=W.Layout(width="auto", max_width="160px"))
        self.temperature = W.FloatSlider(value=temperature, min=0.0, max=2.0, step=0.05, description="temperature",
                                         readout_format=".2f", style=wide,
                                         layout=W.Layout(flex="0 1 260px", min_width="210px"))
        self.max_tokens = W.BoundedIntText(value=max_tokens, min=1, max=1 << 20, description="max tokens",
                                           style=wide, layout=W.Layout(width="150px"))
        self.transcript = W.VBox(layout=W.Layout(max_height="480px", overflow="auto"))
        # Enter sends (the text box's "submit" message); leaving the box sends nothing.
        self.input = W.Text(placeholder="Ask something, Enter to send", continuous_update=True,
                            layout=W.Layout(flex="1 1 auto", min_width="120px", width="auto"))
        self.input.on_msg(self._on_input_msg)
        self.send_button = W.Button(description="Send", button_style="primary", icon="paper-plane",
                                    layout=W.Layout(width="auto", flex="0 0 auto"))
        self.stop_button = W.Button(description="Stop", icon="stop", disabled=True,
                                    layout=W.Layout(width="auto", flex="0 0 auto"))
        self.upload = W.FileUpload(accept="image/*", multiple=False, description="Image",
                                   layout=W.Layout(width="auto", flex="0 0 auto"))
        self.speed = W.Label("", layout=W.Layout(flex="1 1 auto", min_width="0", overflow="hidden"))
        self.copy = W.HTML(copy_button(""), layout=W.Layout(flex="0 0 auto"))
        self.clear_button = W.Button(description="Clear", icon="eraser", tooltip="Forget the conversation",
                                     layout=W.Layout(width="auto", flex="0 0 auto"))
        self.send_button.on_click(lambda _: self._on_enter())
        self.stop_button.on_click(lambda _: self.stop())
        self.clear_button.on_click(lambda _: self.clear())
        row = dict(align_items="center", width="100%")
        header = W.HBox([self.model, self.backend_label, self.temperature, self.max_tokens],
                        layout=W.Layout(flex_flow="row wrap", **row))
        footer = W.HBox([self.input, self.send_button, self.stop_button, self.upload],
                        layout=W.Layout(flex_flow="row wrap", **row))
        status = W.HBox([self.speed, self.copy, self.clear_button], layout=W.Layout(**row))
        super().__init__([header, self.transcript, footer, status], **kwargs)
        adopt(self)

    def _model_options(self) -> list:
        """The client's model first, then every other model it can serve (a server's list, or the
        models available offline). A server we cannot reach yet offers "?", which sends no model
        name: the first send says what is wrong."""
        try:
            current = self.client.model_name()  # a server's default model is asked of the server
            others = [m for m in self.client.models() if m != current]
        except Exception:
            return [("?", None)]
        return [current, *others]

    # -- actions ------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    def _on_input_msg(self, _widget, content, _buffers) -> None:
        if isinstance(content, dict) and content.get("event") == "submit":
            self._on_enter()

    def _on_enter(self) -> None:
        text = self.input.value.strip()
        if text and not self.busy:
            self.input.value = ""
            self.send(text)

    def send(self, text: str, images: Any = None) -> Optional[threading.Thread]:
        """Ask `text` (plus attached images); returns the worker thread, or None if one is running."""
        if self.busy:
            return None
        images = list(images or []) + self._take_upload()
        self._idle.clear()
        self._stop_requested = False
        self.send_button.disabled, self.stop_button.disabled = True, False
        self.messages.append({"role": "user", "content": text})
        note = f"  [+{len(images)} image]" if images else ""
        answer = W.Output()
        self.transcript.children = (*self.transcript.children, _bubble("user", text + note), answer)
        _markdown(answer, "⏳ …")
        self.speed.value = "waiting for the first token"
        history = list(self.messages)
        self._worker = threading.Thread(target=self._generate, args=(history, images, answer), daemon=True,
                                        name="mlx-nb-chatpanel")
        self._worker.start()
        return self._worker

    def _take_upload(self) -> list[bytes]:
        files = [bytes(f["content"]) for f in (self.upload.value or ())]
        if files:
            self.upload.value = ()
        return files

    def stop(self) -> None:
        """Abort the running reply (the engine drops the request at its next step)."""
        self._stop_requested = True
        if self._stream is not None:
            self._stream.abort()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the current reply has ended (for scripts and tests)."""
        return self._idle.wait(timeout)

    def clear(self) -> None:
        """Stop any reply and forget the conversation."""
        self.stop()
        self.wait(10)
        self.messages.clear()
        self.transcript.children = ()
        self.speed.value = ""
        self.copy.value = copy_button("")

    def close(self) -> None:
        self.stop()
        super().close()

    # -- the worker thread --------------------------------------------------------------------
    def _loading(self, answer: W.Output):
        from mlx_nb.models.progress import describe

        def show(status: dict) -> None:
            _markdown(answer, f"⏳ {describe(status)}")
            self.speed.value = "waiting for the model to load"

        return show

    def _generate(self, history: list[dict], images: list, answer: W.Output) -> None:
        parts: list[str] = []
        try:
            self._stream = stream = self.client.stream(
                history, system=self.system, images=images or None, max_tokens=self.max_tokens.value,
                temperature=self.temperature.value, model=self.model.value, progress=self._loading(answer))
            if self._stop_requested:
                stream.abort()
            first, last = None, 0.0
            for chunk in stream:
                parts.append(chunk)
                now = time.perf_counter()
                first = first or now
                if now - last >= UPDATE_PERIOD_S:
                    last = now
                    _markdown(answer, "".join(parts), " ▌", stream.reasoning, done=False)
                    decoding = now - first
                    rate = (len(parts) - 1) / decoding if decoding >= RATE_AFTER_S else None
                    self.speed.value = counts(len(parts), None, rate, estimated=True)
            reply = stream.reply
            self.replies.append(reply)
            text = "".join(parts)
            _markdown(answer, text, "\n\n*[stopped]*" if reply.finish_reason == "abort" else "", stream.reasoning)
            if text:
                self.messages.append({"role": "assistant", "content": text})
                self.copy.value = copy_button(text)
            usage = reply.usage
            why = {"abort": "stopped", "length": "max tokens"}.get(reply.finish_reason, reply.finish_reason)
            self.speed.value = counts(usage.get("completion_tokens") or 0, reply.elapsed_s, reply.tokens_per_s,
                                      estimated=bool(usage.get("estimated"))) + f" · {why}"
        except Exception as exc:
            text = "".join(parts)
            if not text and self.messages and self.messages[-1] is history[-1]:
                self.messages.pop()  # nothing was answered: don't resend the failed question
            problem = safe_markdown(" ".join(str(exc).split()))  # may quote a server's words
            stream = self._stream
            _markdown(answer, text, ("\n\n" if text else "") + f"**mlx:** {problem}",
                      stream.reasoning if stream is not None else "")
            self.speed.value = "error"
        finally:
            self._stream = None
            self.send_button.disabled, self.stop_button.disabled = False, True
            self._idle.set()
