"""The sequential lane: a model that cannot be batched is served one request at a time.

Some models' caches cannot join a batch (chunked or layered KV caches), and some are wrong batched
even with prompts prefilled alone (their attention cannot take a batch's mask, or their state
drifts in batched decoding). Refusing them leaves the user with a peer server; this lane serves
them through mlx_lm's own `generate_step`, the path that is right for one request by definition
(it is the compatibility sweep's reference), while every other part of the engine stays the same.

A vision model whose language model carries per-request state from step to step (Mllama's
cross-attention states) goes the same way through mlx_vlm's own `generate_step`, which reads the
processor outputs, the vision tower and the prompt in its first step (one step: an abort waits
for it), in mlx_vlm's own prefill chunks: Mllama's text-only answers depend on the chunk size.

`SequentialGenerator` answers the few calls `BatchRunner` makes on mlx_lm's BatchGenerator
(insert_segments, next, remove, extract_cache, close), so requests keep their routes, events,
streaming, stop strings, logprobs, aborts and widgets. Requests wait in a queue (their phase is
`queued`, as in the batch view); the one that runs is read in generate_step's own chunks (its
default `prefill_step_size`, 2048 tokens: some models' answers depend on the chunking, and nothing
else decodes meanwhile, so there is nothing to pace), one chunk per `next()` so an abort or a
status call waits one chunk at most, then decodes one token per `next()` through `generate_step`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional


@dataclass
class PromptResponse:  # the fields BatchRunner reads of PromptProcessingBatch.Response
    uid: int
    progress: tuple
    end_of_segment: bool
    end_of_prompt: bool


@dataclass
class TokenResponse:  # the fields BatchRunner reads of GenerationBatch.Response
    uid: int
    token: int
    logprobs: Any
    finish_reason: Optional[str]
    prompt_cache: Optional[list] = None
    all_tokens: Optional[list] = None


@dataclass
class Job:
    uid: int
    prompt: list[int]
    max_tokens: int
    sampler: Optional[Callable]
    processors: list
    read: int = 0  # prompt tokens read into the cache
    generated: int = 0
    cache: Optional[list] = None
    steps: Any = None  # generate_step's iterator, once the prompt but its last token is read
    tokens: list[int] = field(default_factory=list)  # prompt + generated, for extract_cache
    live: Any = None  # the engine's LiveRequest (a vision request's images and prompt text)


class SequentialGenerator:
    """One request at a time through `generate_step`, behind BatchGenerator's calls."""

    def __init__(self, loaded, stop_tokens: list[list[int]], kv=None):
        import inspect

        from mlx_lm.generate import generate_step

        self.loaded = loaded
        self.model = loaded.model
        self.kv = kv  # a KVQuantization: the text requests' plain KV layers quantized (engine/caches/kv_quant.py)
        self.stop = {t for seq in stop_tokens for t in seq if len(seq) == 1}
        self.prefill_step_size = inspect.signature(generate_step).parameters["prefill_step_size"].default
        self.queue: deque[Job] = deque()
        self.current: Optional[Job] = None
        self._uid = 0

    def insert_segments(self, segments, max_tokens, caches=None, all_tokens=None, samplers=None,
                        logits_processors=None, requests=None) -> list[int]:
        if caches is not None and any(c is not None for c in caches):
            raise ValueError("the sequential lane starts every request from an empty cache")
        uids = []
        for i, parts in enumerate(segments):
            prompt = [t for part in parts for t in part]
            self._uid += 1
            self.queue.append(Job(self._uid, prompt, max_tokens[i], (samplers or [None] * len(segments))[i],
                                  list((logits_processors or [[]] * len(segments))[i] or []),
                                  live=(requests or [None] * len(segments))[i]))
            uids.append(self._uid)
        return uids

    def next(self) -> tuple[list, list]:
        """One prefill chunk of the running request, or one of its tokens."""
        if self.current is None:
            if not self.queue:
                return [], []
            self.current = self.queue.popleft()
        job = self.current
        from mlx_nb.models.lora import adapter_rows

        with adapter_rows(self.model, [job.uid]):
            return self._advance(job)

    def _advance(self, job: Job) -> tuple[list, list]:
        try:
            if job.cache is None and self.loaded.kind == "vision":
                return self._start_vision(job)
            if job.cache is None:
                self._start(job)
            if job.steps is None:
                return self._prefill(job)
            return [], [self._token(job)]
        except Exception as exc:  # this request fails alone; the queue goes on
            from mlx_nb.engine.types import first_line

            self._end(job)
            if job.live is None:
                raise
            job.live.failure = f"{type(exc).__name__}: {first_line(exc)}"
            return [], []

    def _start(self, job: Job) -> None:
        from mlx_lm.models.cache import make_prompt_cache

        job.cache = make_prompt_cache(self.model)
        if self.kv is not None:
            job.cache = self.kv.convert(job.cache)
        job.tokens = list(job.prompt)

    def _start_vision(self, job: Job) -> tuple[list, list]:
        """mlx_vlm's generate_step over the request's processor outputs: its first step reads the
        images and the whole prompt and gives the first token."""
        import mlx.core as mx
        from mlx_vlm.generate import generate_step as vision_step
        from mlx_vlm.models.cache import make_prompt_cache

        from mlx_nb.engine.types import RequestError
        from mlx_nb.models.vision_inputs import process, text_only

        live, loaded = job.live, self.loaded
        if live.images:
            inputs = process(loaded, live.extra["prompt_text"], live.images, chat=live.request.messages is not None)
        else:
            inputs = text_only(job.prompt)
        tokens = inputs.input_ids[0].tolist()
        if len(tokens) >= loaded.context_length:
            raise RequestError(f"the prompt is {len(tokens)} tokens (images included) but {loaded.name} holds "
                               f"{loaded.context_length}")
        live.prompt_tokens, job.prompt, job.tokens = tokens, list(tokens), list(tokens)
        job.max_tokens = min(job.max_tokens, loaded.context_length - len(tokens))
        vm = loaded.vision_model
        for attr in ("_position_ids", "_rope_deltas"):  # the previous request's mRoPE state
            if hasattr(vm.language_model, attr):
                setattr(vm.language_model, attr, None)
        job.cache = make_prompt_cache(vm.language_model)
        job.steps = vision_step(inputs.input_ids, vm, inputs.pixel_values, inputs.mask, max_tokens=job.max_tokens,
                                sampler=job.sampler or (lambda lp: mx.argmax(lp, axis=-1)),
                                logits_processors=job.processors or None, prompt_cache=job.cache, **inputs.extra)
        job.read = len(tokens)
        return [PromptResponse(job.uid, (job.read, job.read), True, True)], [self._token(job)]

    def _prefill(self, job: Job) -> tuple[list, list]:
        """generate_step's own prompt loop, a chunk per call: every token but the last, in chunks
        of at most prefill_step_size; then generate_step takes the last token and decodes."""
        import mlx.core as mx
        from mlx_lm.generate import generate_step

        total = len(job.prompt)
        if total - job.read > 1:
            n = min(max(1, self.prefill_step_size), total - job.read - 1)
            self.model(mx.array(job.prompt[job.read:job.read + n])[None], cache=job.cache)
            mx.eval([c.state for c in job.cache])
            mx.clear_cache()
            job.read += n
            if total - job.read > 1:
                return [PromptResponse(job.uid, (job.read, total), False, False)], []
        head = mx.array(job.prompt[:-1])
        job.steps = generate_step(
            mx.array(job.prompt[-1:]), self.model, max_tokens=job.max_tokens, prompt_cache=job.cache,
            sampler=job.sampler, logits_processors=[_after(head, p) for p in job.processors] or None)
        job.read = total
        return [PromptResponse(job.uid, (total, total), True, True)], [self._token(job)]

    def _token(self, job: Job) -> TokenResponse:
        token, logprobs = next(job.steps)
        token = int(token)
        job.generated += 1
        job.tokens.append(token)
        reason = "stop" if token in self.stop else "length" if job.generated >= job.max_tokens else None
        if reason is not None:
            self._end(job)
        return TokenResponse(job.uid, token, logprobs, reason)

    def _end(self, job: Job) -> None:
        if job.steps is not None:
            job.steps.close()
        job.steps = job.cache = None
        if self.current is job:
            self.current = None

    def remove(self, uids: list[int]) -> None:
        gone = set(uids)
        self.queue = deque(j for j in self.queue if j.uid not in gone)
        if self.current is not None and self.current.uid in gone:
            self._end(self.current)

    def extract_cache(self, uids: list[int]) -> dict:
        job = self.current
        if job is None or job.uid not in uids or job.cache is None:
            return {}
        return {job.uid: (job.cache, list(job.tokens[:job.read + max(0, job.generated - 1)]))}

    def close(self) -> None:
        if self.current is not None:
            self._end(self.current)
        self.queue.clear()


def _after(head, processor: Callable) -> Callable:
    """A logits processor as generate_step calls it here (it saw only the prompt's last token and
    what followed), given what BatchGenerator gives it: the whole prompt and what followed."""
    import mlx.core as mx

    return lambda tokens, logits: processor(mx.concatenate([head, tokens]), logits)
