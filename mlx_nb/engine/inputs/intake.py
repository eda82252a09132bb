"""Intake: a SubmitRequest made into a LiveRequest on the CALLER's thread, ready to queue.

Everything a request can be refused for is found here, before it reaches the engine thread: the
messages or prompt, sampling settings, fill-in-the-middle, an adapter, the context length, a
caller's sampler, a reasoning budget, a constraint llguidance cannot compile. Templating and
tokenizing happen here too (no MLX), so a long chat template never holds the batch.

`Intake` keeps what it learns once per loaded model (its reasoning markers); the Engine holds one
and hands it the loaded model on every call (the loop drops the model when it stops).
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any, Optional

from mlx_nb.engine.adapter_controls import check_adapter
from mlx_nb.engine.caches.prefix import segment_boundaries
from mlx_nb.engine.events import prompt_snippet
from mlx_nb.engine.handle import RequestHandle
from mlx_nb.engine.inputs.fim import fim_format, fim_prompt
from mlx_nb.engine.inputs.images import ImageOptions
from mlx_nb.engine.inputs.messages import normalize_messages
from mlx_nb.engine.inputs.prompts import encode_prompt, render_chat
from mlx_nb.engine.sampling.constrained import processor_for
from mlx_nb.engine.sampling.samplers import validate
from mlx_nb.engine.scheduling.live import LiveRequest
from mlx_nb.engine.submit_request import SubmitRequest
from mlx_nb.engine.text.reasoning import reasoning_format
from mlx_nb.engine.text.textstream import TextStream
from mlx_nb.engine.text.thinking import Thinking
from mlx_nb.engine.types import ContextOverflowError, Request, RequestError


def fim_of(loaded) -> Optional[str]:
    """The loaded model's fill-in-the-middle format (None: it has no FIM tokens, or sees images)."""
    return None if loaded.kind == "vision" else fim_format(loaded.tokenizer)


class Intake:
    def __init__(self, model_name: str, image_options: ImageOptions, loop):
        self.model_name = model_name
        self.image_options = image_options
        self.loop = loop  # the engine's loop, never the Engine: a handle never pins an Engine
        self._ids = itertools.count(1)
        self._reasoning_of: Any = None
        self._reasoning: Any = None

    def live(self, loaded, req: SubmitRequest) -> LiveRequest:
        """`req` validated, templated and tokenized (see Engine.submit for what each field does)."""
        messages, prompt, suffix = req.messages, req.prompt, req.suffix
        if (messages is None) == (prompt is None):
            raise RequestError("give exactly one of messages (chat) or prompt (completion)", "messages")
        context = loaded.context_length
        sampling = req.sampling_for(context)
        validate(sampling, loaded.vocab_size)
        if suffix and messages is not None:
            raise RequestError("suffix goes with a completion prompt (fill-in-the-middle), not with messages", "suffix")
        if suffix and fim_of(loaded) is None:
            raise RequestError(f"{self.model_name} has no fill-in-the-middle tokens, so it cannot take a suffix: "
                               "send the prompt alone", "suffix")
        rid = req.request_id or f"req-{next(self._ids)}-{uuid.uuid4().hex[:6]}"
        request = Request(rid, messages=messages, prompt=prompt, sampling=sampling, tools=req.tools,
                          chat_template_kwargs=dict(req.chat_template_kwargs or {}), suffix=suffix or None)
        images, extra = [], {"source": req.source or "python", "label": prompt_snippet(messages, prompt), "job": req.job}
        if loaded.kind == "vision":  # every request to a vision model, text-only ones too
            from mlx_nb.engine.inputs.vision import prepare_vision_request

            tokens, images, extra["prompt_text"] = prepare_vision_request(loaded, request, self.image_options)
            # No prefix reuse: an image's pad tokens don't identify the image (a hit could hand one
            # image's state to another), and the vision prefill builds every cache itself anyway.
            extra["no_prefix_cache"] = True
        else:
            tokens, extra["boundaries"] = self.prompt_tokens(loaded, request)
        check_adapter(self.loop, self.model_name, req.adapter, loaded, extra)
        if len(tokens) >= context:
            raise ContextOverflowError(self.model_name, len(tokens), context, system_tokens(loaded, request),
                                       "messages" if messages is not None else "prompt")
        sampling.max_tokens = min(sampling.max_tokens, context - len(tokens))
        sampler, constraint, reasoning_budget = req.sampler, req.constraint, req.reasoning_budget
        if sampler is not None and not callable(sampler):
            raise RequestError("sampler must be a function of the log-probabilities", "sampler")
        logits_processors = list(req.logits_processors or [])
        thinking = (Thinking.of(self.reasoning_format(loaded), loaded.tokenizer, tokens)
                    if req.split_reasoning else None)
        if reasoning_budget is not None:
            if not isinstance(reasoning_budget, int) or isinstance(reasoning_budget, bool) or reasoning_budget < 0:
                raise RequestError("reasoning_budget must be a non-negative integer (reasoning tokens)",
                                   "reasoning_budget")
            if thinking is not None:
                logits_processors = [*logits_processors, thinking.budget(reasoning_budget)]
        if constraint is not None:  # last: after bias and penalties, nothing can lift what it masks
            processor = processor_for(loaded, constraint)  # compiled here: a bad grammar fails the submit
            if thinking is not None:  # the answer only: the reasoning is free text
                processor = thinking.answer_only(lambda: processor_for(loaded, constraint), processor)
            logits_processors = [*logits_processors, processor]
        handle = RequestHandle(rid, self.loop.abort, prompt_tokens=len(tokens), max_tokens=sampling.max_tokens)
        return LiveRequest(
            request=request,
            handle=handle,
            prompt_tokens=tokens,
            stream=TextStream(loaded.tokenizer, sampling.stop, thinking.split() if thinking is not None else None),
            logits_processors=logits_processors,
            sampler=sampler,
            images=images,
            extra=extra,
        )

    def reasoning_format(self, loaded):
        """The loaded model's reasoning markers (engine/text/reasoning.py), found once per model."""
        if self._reasoning_of is not loaded:
            self._reasoning_of, self._reasoning = loaded, reasoning_format(loaded.tokenizer)
        return self._reasoning

    def prompt_tokens(self, loaded, request: Request) -> tuple[list[int], list[int]]:
        """Prompt token ids, and the segment ends worth a prefix-cache snapshot."""
        tok = loaded.tokenizer
        if request.messages is None:
            if not isinstance(request.prompt, str):
                raise RequestError("prompt must be a string", "prompt")
            if request.suffix:
                return fim_prompt(tok, request.prompt, request.suffix), []
            return encode_prompt(tok, request.prompt, chat=False), []
        messages = normalize_messages(request.messages)
        request.messages = messages

        def render(msgs, add_generation_prompt=True):
            text = render_chat(tok, msgs, request.tools, request.chat_template_kwargs, add_generation_prompt)
            return encode_prompt(tok, text, chat=True)

        tokens = render(messages)
        boundaries = segment_boundaries(render, messages, tokens) if self.loop.snapshots else []
        return tokens, boundaries

    def count(self, loaded, messages: Optional[list], prompt: Optional[str], tools: Optional[list]) -> int:
        """How many prompt tokens a request with this input would queue (chat template applied)."""
        request = Request("count", messages=messages, prompt=prompt, tools=tools)
        if loaded.kind == "vision":
            from mlx_nb.engine.inputs.vision import prepare_vision_request

            return len(prepare_vision_request(loaded, request, self.image_options)[0])
        tok = loaded.tokenizer
        if messages is None:
            return len(encode_prompt(tok, prompt, chat=False))
        text = render_chat(tok, normalize_messages(messages), tools, {}, True)
        return len(encode_prompt(tok, text, chat=True))


def system_tokens(loaded, request: Request) -> int:
    """Tokens of the system prompt and tool definitions alone (rendered without the turns)."""
    if request.messages is None or loaded.kind == "vision":
        return 0
    system = [m for m in request.messages if m.get("role") == "system"]
    if not system and not request.tools:
        return 0
    try:
        text = render_chat(loaded.tokenizer, system or [{"role": "system", "content": ""}], request.tools,
                           request.chat_template_kwargs, False)
    except Exception:  # a template that needs a user turn: the share is not known, the error still stands
        return 0
    return len(encode_prompt(loaded.tokenizer, text, chat=True))
