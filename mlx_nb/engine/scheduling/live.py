"""The engine thread's record of one admitted request: tokens, text stream, timings, phase."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from mlx_nb.engine.handle import RequestHandle
from mlx_nb.engine.text.textstream import TextStream
from mlx_nb.engine.types import Delta, Request, TokenLogprob, Usage


@dataclass
class LiveRequest:
    request: Request
    handle: RequestHandle
    prompt_tokens: list[int]
    stream: TextStream
    logits_processors: list = field(default_factory=list)
    sampler: Any = None  # the caller's own sampler, or None for the one its settings give
    images: list = field(default_factory=list)
    uid: Optional[int] = None
    phase: str = "queued"  # queued | prefill | decode | done
    cached_tokens: int = 0
    prefilled: int = 0
    generated: int = 0
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: Optional[float] = None
    last_token_at: Optional[float] = None  # the latest token's time, for the gaps between tokens
    finished_at: Optional[float] = None
    failure: Optional[str] = None  # set by a failing per-request callback during a step
    extra: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.request.id

    def usage(self) -> Usage:
        return Usage(len(self.prompt_tokens), self.generated, self.cached_tokens)

    def emit(self, text: str, token: Optional[int], logprob: Optional[TokenLogprob], reasoning: str = "") -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.handle.push(
            Delta(
                self.id,
                text=text,
                reasoning=reasoning,
                token_ids=[token] if token is not None else [],
                logprobs=[logprob] if logprob is not None else [],
            )
        )

    def finish(self, reason: str, tail: tuple[str, str] = ("", ""), error: Optional[str] = None) -> None:
        """The last delta: `tail` is the rest of the (answer, reasoning) text."""
        if self.phase == "done":
            return
        self.phase = "done"
        self.finished_at = time.perf_counter()
        text, reasoning = tail
        self.handle.push(
            Delta(self.id, text=text, reasoning=reasoning, finish_reason=reason, error=error, usage=self.usage(),
                  matched_stop=self.stream.matched_stop)
        )

    def status(self) -> dict[str, Any]:
        now = time.perf_counter()
        ttft = None if self.first_token_at is None else self.first_token_at - self.submitted_at
        decode_time = None if self.first_token_at is None else (self.finished_at or now) - self.first_token_at
        tps = self.generated / decode_time if decode_time and self.generated > 1 else None
        return {
            "id": self.id,
            "phase": self.phase,
            "prompt_tokens": len(self.prompt_tokens),
            "cached_tokens": self.cached_tokens,
            "prefilled_tokens": self.prefilled,
            "generated_tokens": self.generated,
            "max_tokens": self.request.sampling.max_tokens,
            "ttft_s": ttft,
            "tokens_per_s": tps,
            "age_s": now - self.submitted_at,
            "images": len(self.images),
            "source": self.extra.get("source"),  # who asked: a notebook, a route's client (X-MLX-Source)
            "label": self.extra.get("label"),  # the prompt's first words
            "adapter": self.extra.get("adapter"),  # the LoRA adapter its row decodes with, or None
            "job": self.extra.get("job"),  # the dataset job it is a row of (a background row), or None
        }
