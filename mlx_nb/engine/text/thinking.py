"""One request's view of a thinking model: whether its reply starts inside the reasoning, and the
pieces that act on the reasoning (the text split, a constraint on the answer only, a budget).
`Engine.submit` builds one per request for a model with reasoning markers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from mlx_nb.engine.text.reasoning import ReasoningFormat, ReasoningSplit, starts_inside
from mlx_nb.engine.text.reasoning_control import AnswerOnly, MarkerIds, ThinkingBudget


@dataclass
class Thinking:
    fmt: ReasoningFormat
    ids: MarkerIds
    inside: bool  # the prompt left the reply inside an open reasoning block
    stops: tuple = ()  # the tokenizer's end-of-sequence ids: a reply held to a constraint may not end unanswered

    @classmethod
    def of(cls, fmt: Optional[ReasoningFormat], tokenizer: Any, prompt_tokens: list[int]) -> Optional["Thinking"]:
        if fmt is None:
            return None
        tail = tokenizer.decode(prompt_tokens[-64:])  # the end of the prompt is enough to see an open block
        return cls(fmt, MarkerIds(fmt, tokenizer), starts_inside(fmt, tail),
                   tuple(getattr(tokenizer, "eos_token_ids", None) or ()))

    def split(self) -> ReasoningSplit:
        return ReasoningSplit(self.fmt, self.inside)

    def budget(self, tokens: int) -> ThinkingBudget:
        return ThinkingBudget(tokens, self.ids, self.inside)

    def answer_only(self, make: Callable[[], Callable], first: Callable) -> AnswerOnly:
        """`first` (already compiled) serves the first use; `make` builds more as needed."""
        made = iter([first])
        return AnswerOnly(lambda: next(made, None) or make(), self.ids, self.inside, self.stops)
