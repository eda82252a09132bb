"""The batch runner: drives mlx_lm's BatchGenerator on the engine thread.

Requests join the running batch while it decodes (insert -> merged prompt batch -> extend into
the decode batch) and leave it when they finish or are aborted (filter). Each `step()` is one
`BatchGenerator.next()`: one decode step for every decoding row plus one prefill chunk. This module
calls the generator's public keyword API (insert_segments, next, remove, extract_cache) and unpacks
what it returns through `upstream`, which checks the shapes. The generator itself (`decode.Generator`)
subclasses mlx_lm's private batch classes: `upstream_guard` lists every private name it relies on,
and mlx-lm is pinned exactly.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from mlx_nb.engine.batch.upstream import extracted, progress, responses
from mlx_nb.engine.caches.layout import always_trimmable
from mlx_nb.engine.events import EventLog
from mlx_nb.engine.sampling.samplers import SamplerCache, logits_processors
from mlx_nb.engine.scheduling.background import JOB_BATCH, UNDER_LOAD_ROWS, BackgroundLane, Parked
from mlx_nb.engine.scheduling.latency import Latency
from mlx_nb.engine.scheduling.live import LiveRequest
from mlx_nb.engine.scheduling.pacing import PrefillPacer
from mlx_nb.engine.speculation.prompt_lookup import PromptLookup
from mlx_nb.engine.types import RequestError, TokenLogprob, first_line
from mlx_nb.models.cache_layout import describe_layers
from mlx_nb.models.cache_types import cache_type_name
from mlx_nb.models.lora import attach_router

log = logging.getLogger("mlx_nb.engine")


class BatchRunner:
    def __init__(
        self,
        loaded,
        events: EventLog,
        *,
        max_batch: int = 32,
        prefill_batch: int = 32,
        prefill_step_size: int = 512,
        prefill_budget_s: Optional[float] = 0.25,
        prefix=None,
        policy=None,
        speculation: bool = True,
        kv=None,
        drafter=None,
        draft_note=None,
        job_rows_under_load: int = UNDER_LOAD_ROWS,
        job_batch: int = JOB_BATCH,
    ):
        self.loaded = loaded
        self.kv = kv  # a KVQuantization: each request's plain KV layers quantized (engine/caches/kv_quant.py)
        self.prefix = prefix  # a PrefixCache, or None when reuse is off
        self.events = events
        self.max_batch = max_batch
        # Never above max_batch: BatchGenerator would raise its decode batch to the prefill batch.
        # 1 when the model's batch policy (engine/batch/batchability.py) says its state reads the
        # padding of a prompt batch: prompts are then prefilled one at a time, decode still batches.
        self.sequential = policy is not None and policy.mode == "sequential"  # engine/scheduling/sequential.py
        alone = policy is not None and policy.mode in ("prefill_alone", "sequential")
        self.prefill_batch = 1 if alone else min(prefill_batch, max_batch)
        self.prefill_step_size = prefill_step_size
        self.pacer = PrefillPacer(prefill_step_size, prefill_budget_s)
        self.samplers = SamplerCache()
        self.by_uid: dict[int, LiveRequest] = {}
        # dataset jobs' rows: admitted into the slots interactive requests leave (engine/scheduling/background.py)
        self.lane = BackgroundLane(job_rows_under_load, job_batch)
        # a running job row yields its slot only where its cache can be cut back by a token (plain KV)
        self.yieldable = not self.sequential and all(always_trimmable(c) for c in loaded.make_cache())
        self.job_rows = 0  # background rows finished, for status() and /metrics
        self.steps = 0
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.latency = Latency()  # time to first token, gaps between tokens (the /metrics route's histograms)
        self.decoding: list[str] = []
        self._peak_batch = 0
        self._read_tokens = 0  # prompt tokens read in the current step, for the pacer
        # prompt-lookup speculation of greedy rows (engine/speculation/prompt_lookup.py); its counters are status()'s
        # (or a draft model's guesses: engine/speculation/draft.py)
        self.speculation = PromptLookup(drafter=drafter, draft_note=draft_note) if speculation and not self.sequential else None
        self._bg = self._new_generator()
        # LoRA adapters loaded on this model, applied to the rows whose requests name one (models/lora.py)
        self.lora = attach_router(loaded.model, self._adapter_of) if loaded.kind != "vision" else None

    # -- lifecycle ---------------------------------------------------------------------------
    def _new_generator(self):
        from mlx_nb.engine.batch.decode import Generator
        from mlx_nb.engine.scheduling.sequential import SequentialGenerator

        eos = sorted(getattr(self.loaded.tokenizer, "eos_token_ids", []) or [])
        if self.sequential:
            return SequentialGenerator(self.loaded, stop_tokens=[[t] for t in eos], kv=self.kv)
        return Generator(
            self.loaded.model,
            speculation=self.speculation,
            stop_tokens=[[t] for t in eos],
            completion_batch_size=self.max_batch,
            prefill_batch_size=self.prefill_batch,
            prefill_step_size=self.prefill_step_size,
        )

    @property
    def peak_batch(self) -> int:
        return self._peak_batch

    @property
    def active(self) -> bool:
        return bool(self.by_uid) or bool(self.lane)

    def live(self) -> list[LiveRequest]:
        """The requests in the batch and the job rows out of it mid-answer (yielded); job rows that
        have not started are counted in `background_status`, not listed (a job may hold thousands)."""
        return [*self.by_uid.values(), *(p.live for p in self.lane.parked)]

    # -- the background lane (dataset jobs) --------------------------------------------------
    def queue_background(self, live: LiveRequest) -> None:
        """A job's row: it waits in the lane until the batch has room for it (see `balance`)."""
        live.phase = "queued"
        self.lane.add(live)

    def balance(self) -> None:
        """Between two steps: background rows join the slots interactive rows leave free (a wave at a
        time), or yield theirs (taken out with their state, resumed later) when interactive rows run
        (engine/scheduling/background.py says when and how many)."""
        if self.sequential:  # one request at a time there: the lane only waits its turn
            if not self.by_uid:
                self._start(self.lane.take(1))
            return
        background = [lv for lv in self.by_uid.values() if lv.extra.get("job")]
        interactive = len(self.by_uid) - len(background)
        room = self.lane.room(interactive, len(background), self.max_batch, time.monotonic())
        if room < 0 and self.yieldable:  # rows furthest from their answer yield first
            self._yield(sorted(background, key=lambda lv: lv.phase == "decode")[:-room])
        if not interactive and background and room < self.lane.wave(self.max_batch, room, time.monotonic()):
            return  # the next wave joins when the batch has room for it
        rows = self.lane.take(max(0, room))
        self._start(rows)
        if rows and not interactive:
            # a wave into a batch of job rows alone: its prompts are read in paced steps from the
            # first (engine/scheduling/pacing.py), or a chat arriving would wait for all of them at once
            self._pace(0.0, 0)

    def _start(self, rows: list) -> None:
        """Rows from the lane into the batch; one that cannot start ends with its error, alone."""
        for row in rows:
            try:
                self._resume(row) if isinstance(row, Parked) else self.admit(row)
            except Exception as exc:
                live = row.live if isinstance(row, Parked) else row
                live.finish("error", error=f"could not start the request: {type(exc).__name__}: {first_line(exc)}")

    def background_status(self) -> dict:
        in_batch = sum(1 for lv in self.by_uid.values() if lv.extra.get("job"))
        return {"waiting": len(self.lane), "in_batch": in_batch, "rows_done": self.job_rows,
                "yielded": self.lane.yielded, "rows_under_load": self.lane.under_load,
                "job_batch": self.lane.batch, "can_yield": self.yieldable}

    def _yield(self, lives: list[LiveRequest]) -> None:
        """Background rows leave the batch with their cache (decode.Generator.park), wherever they are:
        decoding, reading their prompt, or not started."""
        if not lives:
            return
        parked = self._bg.park([lv.uid for lv in lives])
        for live in lives:
            if live.uid not in parked:
                continue
            cache, tokens, rest = parked[live.uid]
            self.by_uid.pop(live.uid, None)
            was_decoding = live.phase == "decode"
            live.phase = "parked"
            self._left(live)
            self.lane.park(Parked(live, cache, tokens, rest, was_decoding))
        self.events.publish("filter", self.steps, [lv.id for lv in lives if lv.phase == "parked"], reason="yield",
                            batch_size=len(self.decoding))

    def _resume(self, parked: Parked) -> None:
        """A yielded row back in the batch: it reads what it had left to read (a decoding row: its last
        token, as a one-token prompt) against its cache, and goes on from there."""
        live = parked.live
        if live.handle.done:
            return
        remaining = live.request.sampling.max_tokens - live.generated
        (uid,) = self._bg.insert_segments(segments=[parked.rest], max_tokens=[remaining],
                                          caches=[parked.cache], all_tokens=[parked.tokens],
                                          samplers=[self._sampler(live)], logits_processors=[live.extra["procs"]])
        live.uid = uid
        live.phase = "queued"  # decoding (again) once what it has left to read is read (_on_prompt)
        if not parked.decoding:  # its prompt's progress counts on from the part it had read
            live.prefilled = live.extra["prefill_start"] = len(parked.tokens)
        self.by_uid[uid] = live
        self.events.publish("insert", self.steps, [live.id], prompt_tokens=len(live.prompt_tokens),
                            cached_tokens=len(parked.tokens), resumed=True, source=live.extra.get("source"),
                            label=live.extra.get("label"), job=live.extra.get("job"))

    # -- admission ---------------------------------------------------------------------------
    def _adapter_of(self, uid: int) -> Optional[str]:
        live = self.by_uid.get(uid)
        return None if live is None else live.extra.get("adapter")

    def _reuses_prefix(self, live: LiveRequest) -> bool:
        return self.prefix is not None and not live.extra.get("no_prefix_cache")

    def admit(self, live: LiveRequest, caches: Optional[list] = None, all_tokens: Optional[list] = None) -> None:
        """Insert a request, starting from `caches` (holding `all_tokens`) or a prefix-cache hit."""
        p = live.request.sampling
        prompt = live.prompt_tokens
        adapter = live.extra.get("adapter")
        if adapter is not None and (self.lora is None or adapter not in self.lora.adapters):
            raise RequestError(f"adapter {adapter} was unloaded before the request started: load it again")
        if self._reuses_prefix(live):
            # an adapter row's entries are filed under its adapter load's key (engine/caches/prefix.py)
            live.extra["prefix_space"] = None if adapter is None else self.lora.adapters[adapter].key
            if caches is None:
                # The last prompt token is always computed: its logits give the first new token.
                hit, cached, kind = self.prefix.lookup(prompt[:-1], live.extra["prefix_space"])
                live.extra["prefix_hit"] = kind
                if hit is not None:
                    caches, all_tokens, live.cached_tokens = hit, prompt[:cached], cached
        if self.kv is not None and not self.sequential:  # a fresh cache, a prefix hit or a vision prefill's
            caches = self.kv.convert(caches if caches is not None else self.loaded.make_cache())
        start = len(all_tokens or [])
        # Segment ends (system prompt, conversation before the reply) become prefix-cache snapshots.
        cuts = [b for b in live.extra.get("boundaries", ()) if b > start] if self._reuses_prefix(live) else []
        edges = [start, *cuts, len(prompt)]
        procs = live.extra["procs"] = [self._guard(live, fn) for fn in logits_processors(p, live.logits_processors)]
        (uid,) = self._bg.insert_segments(
            segments=[[prompt[a:b] for a, b in zip(edges, edges[1:])]],
            max_tokens=[p.max_tokens],
            caches=[caches] if caches is not None else None,
            all_tokens=[list(all_tokens or [])],
            samplers=[self._sampler(live)],
            logits_processors=[procs],
            **({"requests": [live]} if self.sequential else {}),
        )
        live.uid = uid
        live.phase = "queued"
        live.prefilled = live.extra["prefill_start"] = start
        self.by_uid[uid] = live
        self.events.publish(
            "insert",
            self.steps,
            [live.id],
            prompt_tokens=len(live.prompt_tokens),
            cached_tokens=live.cached_tokens,
            prefix_hit=live.extra.get("prefix_hit"),
            cache_types=[cache_type_name(c) for c in caches] if caches else None,
            source=live.extra.get("source"),
            label=live.extra.get("label"),
            images=len(live.images),
            adapter=live.extra.get("adapter"),
            job=live.extra.get("job"),
        )

    @staticmethod
    def _guard(live: LiveRequest, fn: Callable) -> Callable:
        """A per-request logits processor that fails only its own request, never the batch: one that
        raises, or returns anything but a float array of the logits' shape, marks its request failed
        (it leaves the batch after this step) and the batch goes on with the logits unchanged."""
        import mlx.core as mx

        def guarded(tokens, logits):
            if live.failure is not None:
                return logits
            out = _checked(live, "logits processor", lambda: fn(tokens, logits), logits.shape, mx.floating,
                           "an array", "floating point logits")
            return logits if out is None else out.astype(logits.dtype)

        return guarded

    @staticmethod
    def _guard_sampler(live: LiveRequest, fn: Optional[Callable]) -> Optional[Callable]:
        """A per-request sampler that fails only its own request: one that raises or returns anything
        but one integer token id per row marks its request failed; the row takes the argmax meanwhile."""
        if fn is None:
            return None
        import mlx.core as mx

        def guarded(logprobs):
            fallback = mx.argmax(logprobs, axis=-1)
            if live.failure is not None:
                return fallback
            out = _checked(live, "sampler", lambda: fn(logprobs), fallback.shape, mx.integer,
                           "token ids", "integer token ids")
            return fallback if out is None else out.astype(fallback.dtype)

        return guarded

    def _sampler(self, live: LiveRequest) -> Callable:
        """The caller's own sampler (guarded), else a shared one for these settings (one batched call)."""
        if live.sampler is not None:
            return self._guard_sampler(live, live.sampler)
        return self.samplers.get(live.request.sampling)

    # -- the step ----------------------------------------------------------------------------
    def step(self) -> None:
        """One BatchGenerator step; a failure fails the requests in the batch, not the engine."""
        try:
            started = time.perf_counter()
            self._read_tokens = 0
            prompt_responses, gen_responses = responses(self._bg.next())
            step_s = time.perf_counter() - started
            self.steps += 1
            for r in prompt_responses:
                self._on_prompt(r)
            for r in gen_responses:
                self._on_token(r)
            failed = [lv for lv in self.by_uid.values() if lv.failure is not None]
            if failed:
                self._remove(failed, "error")
        except Exception as exc:
            self._recover(exc)
            return
        self._peak_batch = max(self._peak_batch, len(self.decoding))
        self._pace(step_s, self._read_tokens)
        if self.decoding:
            self.events.publish("step", self.steps, list(self.decoding), batch_size=len(self.decoding))

    def _pace(self, step_s: float, read_tokens: int) -> None:
        """The next step's prompt chunk per row (engine/scheduling/pacing.py), from the last step's time
        and the prompt tokens it read; the batch holding job rows alone reads in background steps."""
        waiting = sum(1 for lv in self.by_uid.values() if lv.phase in ("queued", "prefill"))
        background = bool(self.by_uid) and all(lv.extra.get("job") for lv in self.by_uid.values())
        chunk = self.pacer.next_chunk(step_s, read_tokens, len(self.decoding), waiting,
                                      rows=min(waiting, self.prefill_batch), background=background)
        if not self.sequential:  # the sequential lane reads generate_step's own chunks
            self._bg.prefill_step_size = chunk

    def _on_prompt(self, r) -> None:
        live = self.by_uid.get(r.uid)
        if live is None:
            return
        done, total = progress(r)
        prefilled = live.extra.get("prefill_start", 0) + done
        self._read_tokens += max(0, prefilled - live.prefilled)
        live.prefilled = prefilled
        if r.end_of_prompt:
            live.phase = "decode"
            self.decoding.append(live.id)
            self.prompt_tokens += total
            self.events.publish("extend", self.steps, [live.id], batch_size=len(self.decoding))
        else:
            live.phase = "prefill"
            self.events.publish("prefill", self.steps, [live.id], done=done, total=total)
            # A snapshot only where one was asked for: mlx_lm also ends a segment before the
            # prompt's last token, which nobody will look up.
            if r.end_of_segment and self._reuses_prefix(live) and prefilled in live.extra.get("boundaries", ()):
                self._snapshot(live)

    def _snapshot(self, live: LiveRequest) -> None:
        found = self._bg.extract_cache([live.uid])
        if live.uid in found:
            cache, tokens = extracted(found, live.uid)
            self.prefix.store(tokens, cache, "user", live.extra.get("prefix_space"))

    def _on_token(self, r) -> None:
        live = self.by_uid.get(r.uid)
        if live is None:
            return
        live.generated += 1
        self.generated_tokens += 1
        if live.extra.get("job"):  # a background row: the latency histograms are the interactive rows'
            live.last_token_at = time.perf_counter()
        else:
            self.latency.token(live, time.perf_counter())  # a stop token too: it ends the wait
        if r.finish_reason is not None and self._reuses_prefix(live) and r.prompt_cache is not None:
            self.prefix.store(list(r.all_tokens), r.prompt_cache, "assistant", live.extra.get("prefix_space"))
        if r.finish_reason == "stop":  # a stop token: never sent as content
            self._finish(live, "stop", live.stream.finish())
            return
        logprob = self._logprob(live, r) if live.request.sampling.logprobs else None
        text, reasoning = live.stream.add(r.token)
        live.emit(text, r.token, logprob, reasoning)
        if live.stream.stopped:
            self._remove([live], "stop")
        elif r.finish_reason == "length":
            self._finish(live, "length", live.stream.finish())

    def _logprob(self, live: LiveRequest, r) -> TokenLogprob:
        import mlx.core as mx

        k = live.request.sampling.logprobs
        top = mx.argpartition(-r.logprobs, kth=k - 1)[:k]
        values = r.logprobs[top]
        order = mx.argsort(-values)
        top_ids, top_vals = top[order].tolist(), values[order].tolist()
        tok = self.loaded.tokenizer
        return TokenLogprob(
            token=tok.decode([r.token]),
            logprob=r.logprobs[r.token].item(),
            top=[(tok.decode([i]), v) for i, v in zip(top_ids, top_vals)],
        )

    # -- leaving the batch -------------------------------------------------------------------
    def _finish(self, live: LiveRequest, reason: str, tail: tuple[str, str] = ("", ""),
                error: Optional[str] = None) -> None:
        """A request BatchGenerator already dropped (it reported stop or length)."""
        self.by_uid.pop(live.uid, None)
        self._left(live)
        live.finish(reason, tail, error)
        self.events.publish("filter", self.steps, [live.id], reason=reason, batch_size=len(self.decoding))

    def _remove(self, lives: list[LiveRequest], reason: str) -> None:
        """Take requests out of the batch ourselves (abort, stop string, per-request error)."""
        self._bg.remove([lv.uid for lv in lives])
        for live in lives:
            self.by_uid.pop(live.uid, None)
            self._left(live)
            tail = live.stream.finish() if reason == "stop" else ("", "")
            live.finish(reason, tail, live.failure if reason == "error" else None)
        self.events.publish(
            "filter", self.steps, [lv.id for lv in lives], reason=reason, batch_size=len(self.decoding)
        )

    def _left(self, live: LiveRequest) -> None:
        if live.id in self.decoding:
            self.decoding.remove(live.id)
        if live.extra.get("job") and live.phase != "parked":
            self.job_rows += 1

    def abort(self, request_id: str) -> bool:
        waiting = self.lane.remove(request_id)
        if waiting is not None:
            waiting.finish("abort")
            return True
        for live in self.by_uid.values():
            if live.id == request_id:
                self._remove([live], "abort")
                return True
        return False

    def _recover(self, exc: Exception) -> None:
        """A step raised: fail every request in the batch, start a fresh generator, go on."""
        log.exception("mlx_nb: batch step failed; failing %d request(s) and rebuilding the batch", len(self.by_uid))
        message = f"batch step failed: {type(exc).__name__}: {first_line(exc)}"
        lives = list(self.by_uid.values())
        self.by_uid.clear()
        self.decoding.clear()
        for live in lives:
            live.finish("error", error=message)
        self.events.publish("error", self.steps, [lv.id for lv in lives], message=message)
        self._bg = self._new_generator()

    def close(self) -> None:
        for live in [*self.by_uid.values(), *self.lane.clear()]:
            live.finish("abort", error="engine closed")
        self.by_uid.clear()
        self._bg.close()

    # -- introspection -----------------------------------------------------------------------
    def request_layout(self, request_id: str) -> Optional[list[dict]]:
        for live in self.by_uid.values():
            if live.id == request_id:
                found = self._bg.extract_cache([live.uid])
                if live.uid not in found:
                    return None
                cache, _tokens = extracted(found, live.uid)
                return describe_layers(cache)
        return None


def _checked(live: LiveRequest, what: str, call: Callable, shape, kind, noun: str, dtype_noun: str):
    """`call()`'s array if it has `shape` and a dtype of `kind`; else None, with the request marked
    failed by a one-line reason (what a caller's processor or sampler did wrong)."""
    import mlx.core as mx

    try:
        out = call()
        if not isinstance(out, mx.array) or out.shape != shape:
            got = tuple(out.shape) if isinstance(out, mx.array) else type(out).__name__
            raise TypeError(f"returned {got}, expected {noun} of shape {tuple(shape)}")
        if not mx.issubdtype(out.dtype, kind):
            raise TypeError(f"returned {out.dtype}, expected {dtype_noun}")
    except Exception as exc:
        live.failure = f"{what} failed: {type(exc).__name__}: {first_line(exc)}"
        return None
    return out
