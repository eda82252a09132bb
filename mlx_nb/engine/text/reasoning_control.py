"""A thinking model's reasoning, seen from the logits processors: where the reply is (reasoning or
answer) read from its token ids, a constraint held to the answer only, and a thinking budget.

Logits processors run before the text stream has read the token they follow (the decode step is
pipelined), so they keep their own account of the reply from the token ids they are given: the
markers of `reasoning.ReasoningFormat` as the tokenizer encodes them.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from mlx_nb.engine.text.reasoning import ReasoningFormat


class MarkerIds:
    """A format's markers as token ids (once per request; encoding is cheap next to a step)."""

    def __init__(self, fmt: ReasoningFormat, tokenizer: Any):
        encode = lambda s: tuple(tokenizer.encode(s, add_special_tokens=False)) if s else ()  # noqa: E731
        self.start, self.end = encode(fmt.start), encode(fmt.end)
        self.answer = encode(fmt.answer) if fmt.answer else ()
        self.close = encode(fmt.closing)


class ReplyTracker:
    """Where a reply is, from its token ids: `before` (it may still open reasoning), `reasoning`,
    `between` (harmony: the reasoning ended, the answer's channel not yet open), `answer`."""

    def __init__(self, ids: MarkerIds, inside: bool):
        self.ids = ids
        self.state = "reasoning" if inside else "before"
        self.start: Optional[int] = None  # the prompt's length
        self.seen = 0  # reply tokens read
        self.reasoning_tokens = 0
        self.answer_from: Optional[int] = None  # index (in the token list) where the answer begins
        self._recent: list[int] = []
        self._keep = max(len(ids.start), len(ids.end), len(ids.answer), 1)  # the longest marker

    def update(self, tokens) -> list[int]:
        """Read the reply tokens not read yet; returns them."""
        if self.start is None:
            self.start = len(tokens)
            if self.state == "before" and not self.ids.start:
                self.state = "answer"
        fresh = [int(t) for t in tokens[self.start + self.seen:]]
        for i, t in enumerate(fresh):
            self._step(t, self.start + self.seen + i + 1)
        self.seen += len(fresh)
        return fresh

    def _step(self, token: int, after: int) -> None:
        self._recent = (self._recent + [token])[-self._keep:]
        if self.state == "reasoning":
            self.reasoning_tokens += 1
            if self._ends_with(self.ids.end):
                self.state = "between" if self.ids.answer else "answer"
                if self.state == "answer":
                    self.answer_from = after
        elif self.state == "before":
            if self._ends_with(self.ids.start):
                self.state = "reasoning"
            elif not self._could_begin(self.ids.start):  # the reply opened without reasoning: all answer
                self.state, self.answer_from = "answer", self.start
        elif self.state == "between" and self._ends_with(self.ids.answer):
            self.state, self.answer_from = "answer", after

    def _ends_with(self, seq: tuple) -> bool:
        return bool(seq) and tuple(self._recent[-len(seq):]) == seq

    def next_of(self, seq: tuple) -> int:
        """The token of `seq` that comes next: after the longest start of it that the reply ends with."""
        for k in range(len(seq) - 1, 0, -1):
            if self._ends_with(seq[:k]):
                return seq[k]
        return seq[0]

    def _could_begin(self, seq: tuple) -> bool:
        """Whether the reply so far (all of it still `before`) is a prefix of `seq`."""
        n = len(self._recent)
        return n < len(seq) and tuple(self._recent) == seq[:n]


class AnswerOnly:
    """A logits processor (a constraint's) applied to the answer only: during the reasoning the
    logits pass unchanged, and the processor starts when the answer does, as if the answer were
    the whole reply. Before the reply shows whether it reasons, the first token may be the
    reasoning's start marker or one the constraint allows. A first token the constraint does not
    allow opens the reasoning: the rest of its start marker follows (harmony's `<|channel|>` must go
    on as `analysis<|message|>`), since an answer that began with it could never match.
    A reply may not end inside its reasoning either (it would have no answer to hold): the odds of
    ending (`stops`, the end-of-sequence tokens) go to the next token of the marker that ends the
    reasoning, or for harmony, between the channels, of the one that opens the answer."""

    def __init__(self, make: Callable[[], Callable], ids: MarkerIds, inside: bool, stops: tuple = ()):
        self.make, self.tracker = make, ReplyTracker(ids, inside)
        self.inner: Optional[Callable] = None
        self.probe: Optional[Callable] = None  # the processor that judged the first token
        self.opening = False  # the first token was the start marker's, which the constraint does not allow
        self.stops = tuple(stops)
        self._is_stop = self._stop_ids = self._vocab = None  # made once, on the first step that needs them

    def __call__(self, tokens, logits):
        import mlx.core as mx

        t = self.tracker
        t.update(tokens)
        if t.state == "answer":
            if self.inner is None:
                self.inner = self.probe if self.probe is not None and t.answer_from == t.start else self.make()
                if self.inner is not self.probe:
                    self.inner(tokens[:t.answer_from], logits)  # its start: where the answer begins
            return self.inner(tokens, logits)
        if t.state == "before" and t.seen == 0:
            self.probe = self.make()
            allowed = self.probe(tokens, logits)
            first = t.ids.start[0]
            self.opening = not (allowed[..., first] > -float("inf")).all().item()
            return mx.where(mx.arange(logits.shape[-1]) == first, logits, allowed)
        if t.state == "before" and self.opening:  # the start marker so far: its next token follows
            target = t.ids.start[t.seen]
            return mx.where(mx.arange(logits.shape[-1]) == target, logits, mx.array(-float("inf"), dtype=logits.dtype))
        self.probe = None
        if t.state in ("reasoning", "between") and self.stops:
            marker = t.ids.end if t.state == "reasoning" else t.ids.answer
            return self._closing_instead_of_ending(logits, t.next_of(marker))
        return logits

    def _closing_instead_of_ending(self, logits, target: int):
        import mlx.core as mx

        if self._vocab is None:  # end-of-sequence ids past the logits (a padded tokenizer) cannot be drawn
            width = logits.shape[-1]
            self.stops = tuple(i for i in self.stops if i < width)
            self._vocab = mx.arange(width)
            if self.stops:
                self._is_stop = mx.array(np.isin(np.arange(width), self.stops))
                self._stop_ids = mx.array(self.stops)
        if not self.stops or target in self.stops:
            return logits
        ending = mx.logsumexp(logits[..., self._stop_ids], axis=-1, keepdims=True)
        closing = mx.logaddexp(logits[..., target:target + 1], ending)
        logits = mx.where(self._vocab == target, closing, logits)
        return mx.where(self._is_stop, mx.array(-float("inf"), dtype=logits.dtype), logits)


class ThinkingBudget:
    """Closes the reasoning after `budget` tokens, as llama-server's reasoning budget does: from
    then on the next tokens are the format's closing marker (for harmony, the answer's channel too)."""

    def __init__(self, budget: int, ids: MarkerIds, inside: bool):
        self.budget, self.tracker = budget, ReplyTracker(ids, inside)
        self.forcing: Optional[int] = None  # how much of the closing marker has been written

    def __call__(self, tokens, logits):
        import mlx.core as mx

        t = self.tracker
        fresh = t.update(tokens)
        close = t.ids.close
        if self.forcing is not None:
            self.forcing += len(fresh)
            if self.forcing >= len(close):
                return logits
        elif t.state == "reasoning" and t.reasoning_tokens >= self.budget:
            self.forcing = 0
        else:
            return logits
        target = close[self.forcing]
        return mx.where(mx.arange(logits.shape[-1]) == target, logits, mx.array(-float("inf"), dtype=logits.dtype))
