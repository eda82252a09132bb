"""ChatPanel: a chat box in a notebook output, streaming replies from the shared engine.

Generation runs on a worker thread and only writes widget state (comm messages go out whatever
cell is running), so the kernel stays free and several panels can stream at once, batched
together by the engine. Replies render as Markdown through an `Output` widget's outputs, escaped
first (`mlx_nb.safe_markdown`): Output widgets render as trusted, so raw HTML in a reply would run.
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any, Optional

import ipywidgets as W

from mlx_nb.safe_markdown import safe_markdown

UPDATE_PERIOD_S = 0.1  # ~10 Hz: every update resends the whole reply


def _markdown(out: W.Output, text: str, note: str = "") -> None:
    """Show model `text` (escaped: see mlx_nb.safe_markdown) followed by our own Markdown `note`."""
    out.outputs = ({"output_type": "display_data",
                    "data": {"text/markdown": safe_markdown(text) + note, "text/plain": text + note},
                    "metadata": {}},)


def _bubble(role: str, text: str) -> W.HTML:
    align = "right" if role == "user" else "left"
    bg = "#e3f2fd" if role == "user" else "#f5f5f5"
    body = html.escape(text).replace("\n", "<br>")
    return W.HTML(f"<div style='text-align:{align}'><span style='display:inline-block;background:{bg};"
                  f"padding:4px 8px;border-radius:8px;max-width:90%;text-align:left'>{body}</span></div>")


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

        self.model = W.Dropdown(options=self._model_options(), description="model", layout=W.Layout(width="320px"))
        self.backend_label = W.Label(f"({self.client.backend})")
        self.temperature = W.FloatSlider(value=temperature, min=0.0, max=2.0, step=0.05, description="temperature",
                                         readout_format=".2f", layout=W.Layout(width="260px"))
        self.max_tokens = W.BoundedIntText(value=max_tokens, min=1, max=1 << 20, description="max tokens",
                                           layout=W.Layout(width="180px"))
        self.speed = W.Label("")
        self.transcript = W.VBox(layout=W.Layout(max_height="480px", overflow="auto"))
        self.input = W.Text(placeholder="Ask something, Enter to send", continuous_update=False,
                            layout=W.Layout(flex="1"))
        self.send_button = W.Button(description="Send", button_style="primary", icon="paper-plane")
        self.stop_button = W.Button(description="Stop", icon="stop", disabled=True)
        self.upload = W.FileUpload(accept="image/*", multiple=False, description="Image")
        self.input.observe(self._on_enter, names="value")
        self.send_button.on_click(lambda _: self._on_enter(None))
        self.stop_button.on_click(lambda _: self.stop())
        header = W.HBox([self.model, self.backend_label, self.temperature, self.max_tokens, self.speed])
        footer = W.HBox([self.input, self.send_button, self.stop_button, self.upload])
        super().__init__([header, self.transcript, footer], **kwargs)

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

    def _on_enter(self, change) -> None:
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
        _markdown(answer, "...")
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
        self.stop()
        self.wait(10)
        self.messages.clear()
        self.transcript.children = ()

    # -- the worker thread --------------------------------------------------------------------
    def _generate(self, history: list[dict], images: list, answer: W.Output) -> None:
        parts: list[str] = []
        try:
            self._stream = stream = self.client.stream(
                history, system=self.system, images=images or None, max_tokens=self.max_tokens.value,
                temperature=self.temperature.value, model=self.model.value)
            if self._stop_requested:
                stream.abort()
            t0, last = time.perf_counter(), 0.0
            for chunk in stream:
                parts.append(chunk)
                now = time.perf_counter()
                if now - last >= UPDATE_PERIOD_S:
                    last = now
                    _markdown(answer, "".join(parts), " ▌")
                    self.speed.value = f"{len(parts)} chunks, {len(parts) / max(now - t0, 1e-6):.1f}/s"
            reply = stream.reply
            self.replies.append(reply)
            text = "".join(parts)
            _markdown(answer, text, "\n\n*[stopped]*" if reply.finish_reason == "abort" else "")
            if text:
                self.messages.append({"role": "assistant", "content": text})
            tps = reply.tokens_per_s
            self.speed.value = f"{reply.usage.get('completion_tokens', 0)} tokens" + (
                f", {tps:.1f} tok/s" if tps else "") + f" ({reply.finish_reason})"
        except Exception as exc:
            text = "".join(parts)
            if not text and self.messages and self.messages[-1] is history[-1]:
                self.messages.pop()  # nothing was answered: don't resend the failed question
            problem = safe_markdown(" ".join(str(exc).split()))  # may quote a server's words
            _markdown(answer, text, ("\n\n" if text else "") + f"**mlx:** {problem}")
            self.speed.value = "error"
        finally:
            self._stream = None
            self.send_button.disabled, self.stop_button.disabled = False, True
            self._idle.set()
