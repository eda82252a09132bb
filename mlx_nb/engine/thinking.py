"""One request's view of a thinking model: whether its reply starts inside the reasoning, and the
pieces that act on the reasoning (the text split, a constraint on the answer only, a budget).
`Engine.submit` builds one per request for a model with reasoning markers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from mlx_nb.engine.reasoning import ReasoningFormat, ReasoningSplit, starts_inside
from mlx_nb.engine.reasoning_control import AnswerOnly, MarkerIds, ThinkingBudget


@dataclass
class Thinking:
    fmt: ReasoningFormat
    ids: MarkerIds
    inside: bool  # the prompt left the reply inside an open reasoning block

    @classmethod
    def of(cls, fmt: Optional[ReasoningFormat], tokenizer: Any, prompt_tokens: list[int]) -> Optional["Thinking"]:
        if fmt is None:
            return None
        tail = tokenizer.decode(prompt_tokens[-64:])  # the end of the prompt is enough to see an open block
        return cls(fmt, MarkerIds(fmt, tokenizer), starts_inside(fmt, tail))

    def split(self) -> ReasoningSplit:
        return ReasoningSplit(self.fmt, self.inside)

    def budget(self, tokens: int) -> ThinkingBudget:
        return ThinkingBudget(tokens, self.ids, self.inside)

    def answer_only(self, make: Callable[[], Callable], first: Callable, stops: tuple = ()) -> AnswerOnly:
        """`first` (already compiled) serves the first use; `make` builds more as needed; `stops`
        (end-of-sequence ids) may not end the reply before its answer."""
        made = iter([first])
        return AnswerOnly(lambda: next(made, None) or make(), self.ids, self.inside, stops)
