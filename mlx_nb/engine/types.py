"""The values that cross the engine's boundary: what a caller asks for and what comes back.

Kept free of MLX so the API layer, the client and the widgets can import them cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

FinishReason = Literal["stop", "length", "abort", "error"]


def first_line(exc: BaseException) -> str:
    """An exception as one line, for messages that must stay one line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class RequestError(ValueError):
    """A request the engine refuses at submit time. `field` names the offending input."""

    def __init__(self, message: str, field: Optional[str] = None):
        super().__init__(message)
        self.field = field


class ContextOverflowError(RequestError):
    """The prompt does not fit the model's context: how long it is, what the model holds, and how
    much of it is the system prompt and tool definitions (what a client can't see it sent)."""

    def __init__(self, model: str, prompt_tokens: int, context: int, system_tokens: int, field: str):
        share = f" ({system_tokens} of them the system prompt and tools)" if system_tokens else ""
        super().__init__(f"the prompt is {prompt_tokens} tokens{share} but {model} holds {context}: shorten the "
                         "conversation", field)
        self.prompt_tokens, self.context, self.system_tokens = prompt_tokens, context, system_tokens


class TooLargeError(RequestError):
    """Refused because a part exceeds a size limit (an image's bytes or pixels): HTTP says 413."""


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class TokenLogprob:
    token: str
    logprob: float
    top: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class Delta:
    """One streamed piece of a reply. `text` is always valid UTF-8 and never holds a stop token.
    A thinking model's reasoning comes in `reasoning`, apart from the answer (engine/text/reasoning.py)."""

    request_id: str
    text: str = ""
    reasoning: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: Optional[FinishReason] = None
    error: Optional[str] = None
    usage: Optional[Usage] = None
    matched_stop: Optional[str] = None  # the stop string that ended the reply, if one did


@dataclass
class Result:
    """The whole reply, assembled from the deltas."""

    request_id: str
    text: str
    finish_reason: FinishReason
    usage: Usage
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    error: Optional[str] = None
    matched_stop: Optional[str] = None
    reasoning: str = ""  # a thinking model's reasoning, apart from the answer in `text`


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0  # OpenAI's additive penalties, over the last 20 tokens (mlx_lm's)
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    stop: list[str] = field(default_factory=list)
    seed: Optional[int] = None
    logprobs: int = 0  # how many top alternatives per token; 0 = no logprobs

    def sampler_key(self) -> tuple:
        """Requests with equal keys share one sampler object, so the batch samples in one call."""
        return (self.temperature, self.top_p, self.top_k, self.min_p, self.logprobs > 0)


@dataclass
class Request:
    """A validated request: a chat (`messages`) or a completion (`prompt`), plus sampling."""

    id: str
    messages: Optional[list[dict[str, Any]]] = None
    prompt: Optional[str] = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tools: Optional[list[dict[str, Any]]] = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    suffix: Optional[str] = None  # a completion's text after the hole (fill-in-the-middle, engine/inputs/fim.py)
