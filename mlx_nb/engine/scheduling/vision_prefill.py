"""Vision prefill, paced like text prefill: one chunk per engine iteration, between batch steps.

A vision request is prefilled ALONE (mlx_vlm's processor, vision tower and embeddings, then the
language model over the prompt) and only then joins the shared decode batch: its cache MOVES into
BatchGenerator with the prompt's last token. Read whole, a long prompt or a large image would stall
every running stream, make the request unabortable and keep `status()` waiting. So each request
is a `VisionPrefill` job that the engine loop advances one step per iteration: first the processor
and vision tower, then one chunk of prompt positions at a time, sized as text prompt chunks are
(a PrefillPacer of its own: full chunks while nothing decodes, else about the step budget).
Running streams decode between chunks; an abort or a status call waits at most one chunk.
Progress is published as "prefill" events (done / total positions), as for text requests.

The chunk keywords are generate_step's: every processor output and embedding-step result, with the
full-prompt position ids sliced per chunk (so a chunked prefill sees the positions a one-pass
prefill sees). The language model's per-request module state is installed before each chunk and
read back after it, because decode steps of the batch run between chunks.
Engine thread only.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Optional

from mlx_nb.engine.events import EventLog
from mlx_nb.engine.scheduling.live import LiveRequest
from mlx_nb.engine.scheduling.pacing import PrefillPacer
from mlx_nb.engine.types import RequestError, first_line
from mlx_nb.models.rope_delta_cache import RopeDeltaCache
from mlx_nb.models.vision import chunked_prefill_allowed, module_state, set_module_state


class VisionPrefill:
    """One request's prefill: `advance(chunk)` until `finished`, then `result()`."""

    def __init__(self, loaded, live: LiveRequest):
        self.loaded = loaded
        self.live = live
        self.started = False
        self.done = 0  # prompt positions read
        self.total = 0  # positions to read here (all but the last, which the batch reads)
        self._ids = self._emb = self._cache = None  # set by the vision step: ids, Embedded, LM caches
        self._chunked = True  # False: the prompt is read in one pass
        self._state: dict = {}  # the language model's module state for this request

    @property
    def finished(self) -> bool:
        return self.started and self.done >= self.total

    def advance(self, chunk: int) -> None:
        """The vision step first, then one chunk of at most `chunk` prompt positions."""
        if not self.started:
            self._start()
        else:
            self._read(max(1, chunk) if self._chunked else self.total - self.done)

    def _start(self) -> None:
        import mlx.core as mx
        from mlx_vlm.models.cache import make_prompt_cache

        from mlx_nb.models.vision_inputs import embed, process, text_only

        live, loaded = self.live, self.loaded
        vm = loaded.vision_model
        lm = vm.language_model
        if live.images:
            chat = live.request.messages is not None
            inputs = process(loaded, live.extra["prompt_text"], live.images, chat=chat)
        else:
            inputs = text_only(live.prompt_tokens)
        tokens = inputs.input_ids[0].tolist()
        context = loaded.context_length
        if len(tokens) >= context:
            raise RequestError(f"the prompt is {len(tokens)} tokens (images included) but {loaded.name} holds {context}")
        live.prompt_tokens = tokens
        live.request.sampling.max_tokens = min(live.request.sampling.max_tokens, context - len(tokens))
        set_module_state(lm, {name: None for name in module_state(lm)})  # no earlier request's state
        self._ids = inputs.input_ids
        self._emb = embed(vm, inputs)
        self._state = module_state(lm)
        self._cache = make_prompt_cache(lm)
        positions = self._emb.embeds.shape[1]
        self._chunked = chunked_prefill_allowed(
            vm, input_ids=self._ids, inputs_embeds=self._emb.embeds, prompt_cache=self._cache,
            prefill_kwargs=self._emb.lm_kwargs)
        # A prompt read in one pass (it attends both ways) includes its last position, which is
        # then trimmed off and recomputed by the batch: the last position attends to the whole
        # prompt either way, so its state is the same.
        self.total = positions if not self._chunked else positions - 1
        if not self._chunked and not all(c.is_trimmable() for c in self._cache):
            raise RequestError(f"{loaded.name} must read its prompt in one pass but its cache cannot be trimmed")
        mx.eval(self._emb.embeds)
        self.started = True

    def _read(self, n: int) -> None:
        import mlx.core as mx

        lm = self.loaded.vision_model.language_model
        a, b = self.done, min(self.total, self.done + n)
        kwargs = dict(self._emb.lm_kwargs)
        if self._emb.position_ids is not None:
            kwargs["position_ids"] = self._emb.position_ids[..., a:b]
        set_module_state(lm, self._state)
        lm(inputs=self._ids[:, a:b], inputs_embeds=self._emb.embeds[:, a:b], cache=self._cache,
           n_to_process=b - a, logits_to_keep=1, **kwargs)
        mx.eval([c.state for c in self._cache])
        self._state = module_state(lm)
        self.done = b

    def result(self) -> tuple[list, list[int]]:
        """(caches, all_tokens) for `BatchRunner.admit`: every prompt position but the last."""
        if not self._chunked:
            for c in self._cache:
                c.trim(1)
        caches = list(self._cache)
        if self.loaded.model.rope_deltas:
            delta = self._state.get("_rope_deltas")
            if delta is None:
                delta = self._emb.lm_kwargs.get("rope_deltas", 0)
            caches.append(RopeDeltaCache.of(delta))
        return caches, self.live.prompt_tokens[:-1]


class VisionPrefills:
    """The vision requests waiting for or in their prefill, first come first served."""

    def __init__(self, loaded, events: EventLog, runner, max_chunk: int, budget_s: Optional[float]):
        self.loaded = loaded
        self.events = events
        self.runner = runner  # the BatchRunner a finished prefill joins
        self.pacer = PrefillPacer(max_chunk, budget_s)
        self.jobs: deque[VisionPrefill] = deque()

    def __bool__(self) -> bool:
        return bool(self.jobs)

    def live(self) -> list[LiveRequest]:
        return [job.live for job in self.jobs]

    def add(self, live: LiveRequest) -> None:
        live.phase = "queued"
        self.jobs.append(VisionPrefill(self.loaded, live))

    def step(self) -> None:
        """Advance the oldest job by one step; a finished one joins the batch."""
        job = self.jobs[0]
        live = job.live
        try:
            before, started = job.done, time.perf_counter()
            job.advance(self.pacer.chunk)
            # After the vision step nothing is read (0 positions): the pacer starts from a probe.
            self.pacer.next_chunk(time.perf_counter() - started, job.done - before,
                                  len(self.runner.decoding), len(self.jobs), rows=1)
            live.phase, live.prefilled = "prefill", job.done
            self.events.publish("prefill", self.runner.steps, [live.id], done=job.done, total=job.total, vision=True)
            if job.finished:
                self.jobs.popleft()
                caches, all_tokens = job.result()
                self.runner.admit(live, caches=caches, all_tokens=all_tokens)
        except Exception as exc:
            self._drop(job)
            live.finish("error", error=f"could not start the request: {type(exc).__name__}: {first_line(exc)}")
            self.events.publish("error", self.runner.steps, [live.id], message=first_line(exc))

    def abort(self, request_id: str) -> bool:
        job = next((j for j in self.jobs if j.live.id == request_id), None)
        if job is None:
            return False
        self._drop(job)
        job.live.finish("abort")
        self.events.publish("filter", self.runner.steps, [request_id], reason="abort",
                            batch_size=len(self.runner.decoding))
        return True

    def close(self) -> None:
        for job in self.jobs:
            job.live.finish("abort", error="engine closed")
        self.jobs.clear()

    def _drop(self, job: VisionPrefill) -> None:
        if job in self.jobs:
            self.jobs.remove(job)
