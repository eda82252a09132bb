"""A thinking model's reasoning, kept apart from its answer.

Thinking models write their reasoning first, between markers, then the answer:
- `<think> ... </think>`: Qwen3, QwQ, DeepSeek-R1 distills, GLM-4.5 (mlx_lm's tokenizer names the
  pair it finds in the vocabulary); many templates open the block in the prompt, so the reply starts
  inside it;
- `[THINK] ... [/THINK]`: Magistral;
- gpt-oss's harmony channels: `<|channel|>analysis<|message|> ... <|end|>` is reasoning, and
  `<|start|>assistant<|channel|>final<|message|> ...` the answer.

`reasoning_format(tokenizer)` picks the family from the vocabulary (and the chat template for
harmony); `status()` names it. Per request, `ReasoningSplit` reads the reply's text as it streams
and hands back `(answer, reasoning)` pieces, the markers themselves removed and text that could be
the start of a marker held back until it is known, so a marker split across two tokens never leaks.
Stop strings, constraints and tool-call parsing then see the answer only (textstream.py,
constrained.py); `budget.py` closes the reasoning after a number of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class ReasoningFormat:
    """How a family marks its reasoning. `close` is what a thinking budget writes to end it
    (the end marker, and for harmony the start of the answer's channel)."""

    name: str
    start: str
    end: str
    answer: str = ""  # harmony: what opens the answer after the reasoning's end
    close: str = ""

    @property
    def closing(self) -> str:
        return self.close or self.end


THINK = ReasoningFormat("think", "<think>", "</think>")
MAGISTRAL = ReasoningFormat("magistral", "[THINK]", "[/THINK]")
HARMONY = ReasoningFormat("harmony", "<|channel|>analysis<|message|>", "<|end|>",
                          answer="<|start|>assistant<|channel|>final<|message|>",
                          close="<|end|><|start|>assistant<|channel|>final<|message|>")


def _vocab(tokenizer: Any) -> dict:
    try:
        return tokenizer.get_vocab()
    except Exception:  # a tokenizer without a vocabulary to show: no reasoning markers known
        return {}


def reasoning_format(tokenizer: Any) -> Optional[ReasoningFormat]:
    """The family of a model's reasoning markers, or None for a model that does not think: the
    markers must be in the vocabulary *and* the chat template must write them (a thinking model's
    template opens, closes or drops the reasoning of its turns; a vocabulary alone, as the tiny
    fixtures' shared one, proves nothing)."""
    vocab = _vocab(tokenizer)
    template = str(getattr(tokenizer, "chat_template", "") or "")
    if "<|channel|>" in vocab and "<|message|>" in vocab and "<|channel|>" in template and "analysis" in template:
        return HARMONY
    start, end = getattr(tokenizer, "think_start", None), getattr(tokenizer, "think_end", None)
    if start and end and end in template:
        return THINK if (start, end) == (THINK.start, THINK.end) else ReasoningFormat("think", start, end)
    if MAGISTRAL.start in vocab and MAGISTRAL.end in vocab and MAGISTRAL.end in template:
        return MAGISTRAL
    return None


def starts_inside(fmt: Optional[ReasoningFormat], prompt_text: str) -> bool:
    """Whether the prompt leaves the reply inside an open reasoning block (a template that writes
    `<think>\\n` at the start of the assistant turn)."""
    if fmt is None or fmt.name == "harmony":
        return False
    return prompt_text.rfind(fmt.start) > prompt_text.rfind(fmt.end)


class ReasoningSplit:
    """One reply's text, split as it streams into answer and reasoning (see the module docstring).

    States: `before` (the reply may open with reasoning; text before a start marker is answer),
    `reasoning`, `answer`. Harmony replies open a channel first; until one does, text is held."""

    def __init__(self, fmt: ReasoningFormat, inside: bool = False):
        self.fmt = fmt
        self.state = "reasoning" if inside else "before"
        self._pending = ""
        self.reasoning_tokens = 0  # tokens fed while in reasoning (for a thinking budget)
        self._strip = inside  # the start of a part: its leading newlines are dropped
        self._held_newlines = ""  # reasoning's newlines held back: dropped if the reasoning ends there

    @property
    def in_reasoning(self) -> bool:
        return self.state == "reasoning"

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """More of the reply's text; returns (answer, reasoning) now safe to send."""
        self._pending += text
        answer, reasoning = [], []
        while True:
            marker = self._next_marker()
            if marker is None:
                break
            index, length, to = marker
            self._route(self._pending[:index], answer, reasoning)
            self._pending = self._pending[index + length:]
            self._strip = to == "reasoning" or (to == "answer" and self.state != "before")
            self._held_newlines = ""  # the reasoning's trailing newlines end with it
            self.state = to
        keep = 0 if final else self._partial_marker()
        cut = len(self._pending) - keep
        self._route(self._pending[:cut], answer, reasoning)
        self._pending = self._pending[cut:]
        return "".join(answer), "".join(reasoning)

    def _markers(self) -> list[tuple[str, str]]:
        """(marker, the state it leads to) for the current state."""
        f = self.fmt
        if f.name == "harmony":
            return {"before": [(f.start, "reasoning"), (f.answer, "answer"), ("<|channel|>final<|message|>", "answer")],
                    "reasoning": [(f.end, "between")],
                    "between": [(f.answer, "answer"), ("<|channel|>final<|message|>", "answer"),
                                ("<|start|>assistant" + f.start, "reasoning"), (f.start, "reasoning")],
                    "answer": [("<|end|>", "after"), ("<|return|>", "after")],
                    }.get(self.state, [])
        return {"before": [(f.start, "reasoning")], "reasoning": [(f.end, "answer")]}.get(self.state, [])

    def _next_marker(self) -> Optional[tuple[int, int, str]]:
        found = [(self._pending.find(m), -len(m), m, to) for m, to in self._markers()]
        found = [f for f in found if f[0] >= 0]
        if not found:
            return None
        index, _, m, to = min(found)
        return index, len(m), to

    def _partial_marker(self) -> int:
        """How many characters at the end of the pending text could begin a marker."""
        longest = 0
        for m, _ in self._markers():
            for n in range(min(len(m) - 1, len(self._pending)), 0, -1):
                if self._pending.endswith(m[:n]):
                    longest = max(longest, n)
                    break
        if self.fmt.name == "harmony" and self.state in ("before", "between"):
            return len(self._pending)  # nothing is answer until a channel says so
        return longest

    def _route(self, text: str, answer: list, reasoning: list) -> None:
        if self._strip and self.state in ("reasoning", "answer"):
            text = text.lstrip("\n")
            self._strip = not text
        if self.state == "reasoning":
            body = self._held_newlines + text
            kept = body.rstrip("\n")
            self._held_newlines = body[len(kept):]
            reasoning.append(kept)
        elif self.state in ("before", "answer"):
            answer.append(text)
        # harmony's text between channels (headers, <|start|>assistant) and after the answer is dropped
