"""OpenAI legacy Completions (`/v1/completions`): raw prompt in, `text_completion` out.

One prompt string per request (a one-element list is accepted); token-id prompts, `echo` and
`best_of` > 1 are rejected with a 400 rather than silently ignored. A `suffix` asks what goes
between the prompt and it (fill-in-the-middle) of a model with FIM tokens, a 400 for others. `n` > 1 gives
n choices, decoded as n rows of the batch. `logprobs: k` asks for the chosen token's logprob plus
k alternatives (OpenAI's meaning). A missing `max_tokens` means the server's default budget
(by default the rest of the context; OpenAI's legacy default of 16 cuts most answers short).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Union

from pydantic import Field, field_validator

from mlx_nb.api.errors import server_error
from mlx_nb.api.ids import prefixed_id
from mlx_nb.api.openai_common import (
    choice_requests,
    choices_body,
    completion_logprobs,
    error_chunk,
    finish_reason,
    usage_dict,
)
from mlx_nb.api.request_common import (
    SamplingFields,
    ServerDefaults,
    WireModel,
    parse_request,
    engine_logprobs,
    constraint_kwargs,
    generation_kwargs,
    sampling_kwargs,
)
from mlx_nb.engine import Delta, Result


class StreamOptions(WireModel):
    include_usage: bool = False


class CompletionRequest(SamplingFields):
    model: Optional[str] = None
    prompt: str
    max_tokens: Optional[int] = Field(None, ge=1)
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    stream_options: Optional[StreamOptions] = None
    echo: Optional[bool] = None
    suffix: Optional[str] = None
    best_of: Optional[int] = None
    response_format: Optional[dict] = None  # as on chat (vLLM takes it here too): json_object / json_schema

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if any(isinstance(x, int) or isinstance(x, list) for x in v):
                raise ValueError("token-id prompts are not supported: send the prompt as text")
            if len(v) != 1:
                raise ValueError("send exactly one prompt string per request")
            v = v[0]
        if v == "":
            raise ValueError("the prompt is empty")
        return v

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v: Optional[bool]) -> Optional[bool]:
        if v:
            raise ValueError("echo is not supported by this server")
        return v

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v != 1:
            raise ValueError("only best_of=1 is supported")
        return v

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


def parse_completion_request(
    body: Union[dict, bytes, str],
    *,
    model_names: Optional[Iterable[str]] = None,
    defaults: ServerDefaults = ServerDefaults(),
) -> CompletionRequest:
    return parse_request(CompletionRequest, body, model_names, defaults)


def completion_engine_kwargs(req: CompletionRequest, defaults: ServerDefaults = ServerDefaults()) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"prompt": req.prompt, **sampling_kwargs(req), **constraint_kwargs(req, req.response_format)}
    kwargs.update(generation_kwargs(defaults, req.max_tokens, kwargs))
    kwargs["logprobs"] = engine_logprobs(req.logprobs is not None, req.logprobs)
    kwargs["tools"] = None
    kwargs["suffix"] = req.suffix or None
    kwargs["split_reasoning"] = False  # a raw completion: the text as the model wrote it
    return kwargs


def completion_engine_requests(req: CompletionRequest, defaults: ServerDefaults = ServerDefaults()) -> list[dict]:
    """One `engine.submit` kwargs per choice (`n` of them)."""
    return choice_requests(completion_engine_kwargs(req, defaults), req.n)


def completion_response(
    result: Union[Result, list[Result]], *, model: str, created: int, top_logprobs: Optional[int] = None
) -> dict:
    """The `text_completion` body (one Result per choice); `top_logprobs` trims alternatives to
    the request's `logprobs`."""
    results = result if isinstance(result, list) else [result]
    choices = []
    for i, r in enumerate(results):
        if r.finish_reason == "error":
            raise server_error(r.error or "generation failed")
        choices.append({
            "index": i,
            "text": r.text,
            "finish_reason": finish_reason(r.finish_reason),
            "logprobs": completion_logprobs(r.logprobs, top_logprobs),
        })
    return choices_body("text_completion", results, choices, model=model, created=created)


class CompletionStream:
    """Deltas -> `text_completion` chunks: text pieces, a finish chunk, then usage if asked."""

    def __init__(
        self, model: str, created: int, request_id: str, include_usage: bool = False, top_logprobs: Optional[int] = None,
        index: int = 0,
    ):
        self.index = index
        self.model = model
        self.created = created
        self.id = prefixed_id("cmpl-", request_id)
        self.include_usage = include_usage
        self.top_logprobs = top_logprobs
        self.offset = 0  # text_offset of the next token, across chunks
        self.done = False

    @classmethod
    def for_request(
        cls, req: CompletionRequest, *, model: str, created: int, request_id: str, index: int = 0,
        include_usage: Optional[bool] = None,
    ) -> "CompletionStream":
        usage = req.include_usage if include_usage is None else include_usage
        return cls(model, created, request_id, usage, req.logprobs, index)

    def start(self) -> list[dict]:
        """Nothing to send at admission: legacy completions have no role chunk."""
        return []

    def feed(self, delta: Delta) -> list[dict]:
        if self.done:
            return []
        if delta.error or delta.finish_reason == "error":
            self.done = True
            return [error_chunk(delta.error or "generation failed")]
        out = []
        if delta.text or delta.logprobs or delta.finish_reason is not None:
            logprobs = completion_logprobs(delta.logprobs, self.top_logprobs, self.offset)
            self.offset += sum(len(lp.token) for lp in delta.logprobs)
            choice = {
                "index": self.index,
                "text": delta.text,
                "logprobs": logprobs,
                "finish_reason": finish_reason(delta.finish_reason),
            }
            out.append({**self.envelope(), "choices": [choice]})
        if delta.finish_reason is not None:
            self.done = True
            if self.include_usage:
                out.append({**self.envelope(), "choices": [], "usage": usage_dict(delta.usage)})
        return out

    def envelope(self) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model}
