"""Incremental text for one request: UTF-8-safe detokenizing, a thinking model's reasoning split
from its answer, and stop strings cut from the answer.

mlx_lm's streaming detokenizer holds back incomplete multi-byte characters. A `ReasoningSplit`
(engine/text/reasoning.py) takes the reasoning out; stop strings apply to the answer only. Text that
could be the start of a stop string is held back too, so a stop string straddling two deltas is
never sent. Per token the work is constant: the detokenizer's accumulated text is trimmed as we go.
"""

from __future__ import annotations

from typing import Any, Optional

from mlx_nb.engine.text.reasoning import ReasoningSplit

_TRIM_AT = 4096


class TextStream:
    def __init__(self, tokenizer: Any, stop: list[str], split: Optional[ReasoningSplit] = None):
        self._detok = tokenizer.detokenizer
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._pending = ""
        self.split = split
        self.matched_stop: Optional[str] = None

    def add(self, token: int) -> tuple[str, str]:
        """Feed one generated token; returns the (answer, reasoning) text now safe to send."""
        self._detok.add_token(token)
        reasoning = self._take(self._detok.last_segment, final=False)
        self._trim_detokenizer()
        return self._release(final=False), reasoning

    def finish(self) -> tuple[str, str]:
        """The rest of the (answer, reasoning) text at the end of the request."""
        self._detok.finalize()
        reasoning = self._take(self._detok.last_segment, final=True)
        return self._release(final=True), reasoning

    def _take(self, text: str, final: bool) -> str:
        """The answer part of `text` onto the pending answer; returns the reasoning part."""
        if self.split is None:
            self._pending += text
            return ""
        answer, reasoning = self.split.feed(text, final)
        self._pending += answer
        return "" if self.matched_stop is not None else reasoning

    @property
    def stopped(self) -> bool:
        return self.matched_stop is not None

    def _release(self, final: bool) -> str:
        if self.matched_stop is not None:
            return ""
        if self._stop:
            hits = [(self._pending.find(s), s) for s in self._stop]
            hits = [(i, s) for i, s in hits if i >= 0]
            if hits:
                i, s = min(hits)
                self.matched_stop = s
                out, self._pending = self._pending[:i], ""
                return out
        if final or not self._hold:
            out, self._pending = self._pending, ""
            return out
        cut = max(0, len(self._pending) - self._hold)
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out

    def _trim_detokenizer(self) -> None:
        # BPE/SPM detokenizers keep all text so far in a plain attribute; keep one char so their
        # leading-space logic holds. (The naive one recomputes text per line and needs no trim.)
        det = self._detok
        if "text" in vars(det) and len(det.text) > _TRIM_AT and det.offset == len(det.text):
            det.text = det.text[-1:]
            det.offset = len(det.text)
