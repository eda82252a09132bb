"""Incremental text for one request: UTF-8-safe detokenizing and stop strings cut from the text.

mlx_lm's streaming detokenizer holds back incomplete multi-byte characters. Text that could be the
start of a stop string is held back too, so a stop string straddling two deltas is never sent.
Per token the work is constant: the detokenizer's accumulated text is trimmed as we go.
"""

from __future__ import annotations

from typing import Any, Optional

_TRIM_AT = 4096


class TextStream:
    def __init__(self, tokenizer: Any, stop: list[str]):
        self._detok = tokenizer.detokenizer
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._pending = ""
        self.matched_stop: Optional[str] = None

    def add(self, token: int) -> str:
        """Feed one generated token; returns the text now safe to send ('' if none)."""
        self._detok.add_token(token)
        self._pending += self._detok.last_segment
        self._trim_detokenizer()
        return self._release(final=False)

    def finish(self) -> str:
        """The rest of the text at the end of the request."""
        self._detok.finalize()
        self._pending += self._detok.last_segment
        return self._release(final=True)

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
