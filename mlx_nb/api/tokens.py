"""The tokenizer's routes, as llama-server has them: `tokenize` (text -> ids, optionally with each
id's text piece), `detokenize` (ids -> text) and `apply-template` (a conversation -> the prompt text
the chat template makes of it, what `chat/completions` would read)."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field

from mlx_nb.api.errors import invalid_request
from mlx_nb.api.request_common import WireModel, load_body, validate


class TokenizeRequest(WireModel):
    model: Optional[str] = None
    content: str
    add_special: bool = False  # the tokenizer's own special tokens (a BOS), as encoding a prompt adds them
    with_pieces: bool = False


class DetokenizeRequest(WireModel):
    model: Optional[str] = None
    tokens: list[int] = Field(max_length=1_000_000)


class ApplyTemplateRequest(WireModel):
    model: Optional[str] = None
    messages: list[dict]
    tools: Optional[list[dict]] = None
    chat_template_kwargs: Optional[dict] = None


def parse(model: type, body: Any):
    return validate(model, load_body(body))


def tokenize_body(req: TokenizeRequest, engine) -> dict:
    ids = engine.tokenize(req.content, add_special=req.add_special)
    if not req.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": i, "piece": engine.detokenize([i])} for i in ids]}


def detokenize_body(req: DetokenizeRequest, engine) -> dict:
    vocab = engine.vocab_size
    bad = [t for t in req.tokens if t < 0 or (vocab is not None and t >= vocab)]
    if bad:
        raise invalid_request(f"tokens: {bad[0]} is not a token id of this model (0 to {(vocab or 1) - 1})", "tokens")
    return {"content": engine.detokenize(req.tokens)}


def apply_template_body(req: ApplyTemplateRequest, engine) -> dict:
    return {"prompt": engine.apply_template(req.messages, req.tools, req.chat_template_kwargs)}
