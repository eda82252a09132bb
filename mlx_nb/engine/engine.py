"""Engine: the thread-safe face of one continuously batched model.

One engine thread owns every MLX call, model load included (MLX streams are thread-local: two
threads doing MLX work at once corrupt state). Callers on any thread or event loop talk to it
through a command queue; replies come back through RequestHandles. Templating and tokenizing
happen in the caller's thread, so bad input is refused at `submit` with a message naming the field.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Optional

from mlx_nb.engine import workers
from mlx_nb.engine.events import EventLog, prompt_snippet
from mlx_nb.engine.handle import RequestHandle
from mlx_nb.engine.images import ImageOptions
from mlx_nb.engine.layout import always_trimmable, describe_layers, is_batchable
from mlx_nb.engine.live import LiveRequest
from mlx_nb.engine.messages import normalize_messages
from mlx_nb.engine.prefix import segment_boundaries
from mlx_nb.engine.prompts import encode_prompt, render_chat
from mlx_nb.engine.sampling import validate
from mlx_nb.engine.textstream import TextStream
from mlx_nb.engine.types import Request, RequestError, SamplingParams, first_line
from mlx_nb.models.loader import ModelLoadError
from mlx_nb.models.progress import LoadProgress, reporting

log = logging.getLogger("mlx_nb.engine")


class EngineClosedError(RuntimeError):
    pass


class Engine:
    """`Engine("tiny-llama")` loads the model on its own thread and serves `submit()` calls."""

    def __init__(
        self,
        model: Optional[str] = None,
        *,
        max_batch: int = 32,
        prefill_batch: int = 32,
        prefill_step_size: int = 512,
        prefill_budget_s: Optional[float] = 0.25,
        prefix_cache: bool = True,
        prefix_cache_bytes: Optional[int] = None,
        event_capacity: int = 4096,
        image_roots: Optional[list] = None,
        allow_remote_images: bool = False,
        max_image_bytes: int = 20 * 1024 * 1024,
        max_image_pixels: int = 40_000_000,
        wait: bool = False,
    ):
        from mlx_nb.models.sources import DEFAULT_MODEL

        self.model_name = model or DEFAULT_MODEL
        # prefill_budget_s: while rows decode, prompt chunks are sized so a step takes about this
        # long (None: always prefill_step_size tokens), so long prompts don't stall running streams.
        self.options = dict(max_batch=max_batch, prefill_batch=prefill_batch, prefill_step_size=prefill_step_size,
                            prefill_budget_s=prefill_budget_s)
        self.prefix_options = dict(enabled=prefix_cache, max_bytes=prefix_cache_bytes)
        self.event_log = EventLog(event_capacity)
        self.image_options = ImageOptions(  # local image files are read only under image_roots (default: cwd)
            roots=image_roots if image_roots is not None else [os.getcwd()],
            allow_remote=allow_remote_images,
            max_bytes=max_image_bytes,
            max_pixels=max_image_pixels,
        )
        self.loaded = None
        self._snapshots = False  # set at load: whether prompts are cut at segment ends for prefix snapshots
        self._runner = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._ready = threading.Event()
        self.load_progress = LoadProgress()  # the load's phase, for status() while it runs
        self._load_error: Optional[BaseException] = None
        self._closed = False
        self._stopped = False  # the engine thread has left its loop; guarded by _stop_lock
        self._stop_lock = threading.Lock()
        self._started = time.time()
        self._runtime: Optional[dict] = None  # read on the engine thread: it asks MLX for the device
        self._ids = itertools.count(1)
        self._job = workers.start(self._run)
        if wait:
            self.wait_ready()

    # -- readiness ---------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self._load_error is None

    @property
    def load_error(self) -> Optional[BaseException]:
        return self._load_error

    def wait_ready(self, timeout: Optional[float] = None) -> "Engine":
        if not self._ready.wait(timeout):
            raise TimeoutError(f"model {self.model_name} is still loading")
        if self._load_error is not None:
            raise self._load_error
        return self

    @property
    def on_engine_thread(self) -> bool:
        return threading.current_thread() is self._job.thread

    # -- the engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            with reporting(self.load_progress):
                self._load()
        except BaseException as exc:  # reported to every caller through wait_ready()
            self._load_error = exc if isinstance(exc, ValueError) else ModelLoadError(
                f"could not load {self.model_name}: {type(exc).__name__}: {first_line(exc)}"
            )
            self.load_progress.finish("failed")
            self._ready.set()
            return
        self.load_progress.finish("ready")
        self._ready.set()
        try:
            self._serve()
        finally:  # closed, or an unexpected error: nobody may be left waiting
            with self._stop_lock:
                self._stopped = True
            self._runner.close()
            self._refuse_pending()

    def _serve(self) -> None:
        runner = self._runner
        while True:
            try:
                cmd = self._commands.get(block=not runner.active)
            except queue.Empty:
                cmd = None
            while cmd is not None:
                if not self._handle(cmd):
                    return
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    cmd = None
            if runner.active:
                runner.step()

    def _load(self) -> None:
        from mlx_nb.engine.prefix import PrefixCache
        from mlx_nb.engine.scheduler import BatchRunner
        from mlx_nb.models import load_model
        from mlx_nb.runtime import runtime_info

        self._runtime = runtime_info()
        loaded = load_model(self.model_name)
        unbatchable = [type(c).__name__ for c in loaded.make_cache() if not is_batchable(c)]
        if unbatchable:
            raise ModelLoadError(
                f"{self.model_name} uses {sorted(set(unbatchable))} caches, which cannot be batched: "
                "load a model without quantized/chunked KV caches"
            )
        self.loaded = loaded
        # Snapshots at segment ends (system prompt, conversation before the reply) are how a model
        # whose cache can't be cut back (SSM state, a wrapped window) finds the next turn's prefix.
        # Plain KV caches are trimmed back from any stored entry instead: no snapshot (each one is
        # an extra prefill step and a cache copy per request).
        self._snapshots = self.prefix_options["enabled"] and not all(
            always_trimmable(c) for c in loaded.make_cache())
        prefix = None
        if self.prefix_options["enabled"]:
            prefix = PrefixCache(self.model_name, self.prefix_options["max_bytes"])
        self._runner = BatchRunner(loaded, self.event_log, prefix=prefix, **self.options)

    def _handle(self, cmd: tuple) -> bool:
        kind = cmd[0]
        if kind == "submit":
            live = cmd[1]
            if live.handle.done:  # aborted before it was admitted
                return True
            try:
                if self.loaded.kind == "vision":  # prefilled alone, then its cache MOVES into the batch
                    from mlx_nb.engine.vision import prefill_request

                    caches, all_tokens = prefill_request(self.loaded, live, self.options["prefill_step_size"])
                    self._runner.admit(live, caches=caches, all_tokens=all_tokens)
                else:
                    self._runner.admit(live)
            except Exception as exc:
                live.finish("error", error=f"could not start the request: {type(exc).__name__}: {first_line(exc)}")
        elif kind == "abort":
            try:
                self._runner.abort(cmd[1])
            except Exception as exc:  # the runner recovers on its next step; the abort is logged
                log.exception("mlx_nb: abort of %s failed: %s", cmd[1], first_line(exc))
        elif kind == "call":
            fn, fut = cmd[1], cmd[2]
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)
        elif kind == "close":
            return False
        return True

    def _refuse_pending(self) -> None:
        """Commands that raced with close(): their callers must not wait forever."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "submit":
                cmd[1].finish("abort", error="the engine was closed before this request started")
            elif cmd[0] == "call":
                cmd[2].set_exception(EngineClosedError("the engine is closed"))

    def _call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Run `fn` on the engine thread between two steps and return its result."""
        if self.on_engine_thread:
            return fn()
        self._check_open()
        fut: Future = Future()
        self._commands.put(("call", fn, fut))
        try:
            return fut.result(timeout)
        except FutureTimeout:
            raise TimeoutError(
                f"the engine thread did not answer within {timeout:.0f} s (a long prefill?): try again"
            ) from None

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine is closed: create a new Engine")

    # -- public API --------------------------------------------------------------------------
    def submit(
        self,
        messages: Optional[list] = None,
        prompt: Optional[str] = None,
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Optional[dict] = None,
        stop: Optional[list[str] | str] = None,
        seed: Optional[int] = None,
        logprobs: int = 0,
        tools: Optional[list] = None,
        logits_processors: Optional[list] = None,
        chat_template_kwargs: Optional[dict] = None,
        request_id: Optional[str] = None,
        source: Optional[str] = None,
    ) -> RequestHandle:
        """Validate, template and queue a request; returns at once with its handle.

        `source` says who asked (e.g. "notebook 02-chats.ipynb", "route: OpenAI/Python"): batch events
        carry it, with the prompt's first words, so a timeline can say which lane is whose."""
        self._check_open()
        self.wait_ready()
        if (messages is None) == (prompt is None):
            raise RequestError("give exactly one of messages (chat) or prompt (completion)", "messages")
        sampling = SamplingParams(
            max_tokens=max_tokens,
            temperature=float(temperature),
            top_p=float(top_p),
            top_k=top_k,
            min_p=float(min_p),
            repetition_penalty=float(repetition_penalty),
            presence_penalty=float(presence_penalty),
            frequency_penalty=float(frequency_penalty),
            logit_bias=dict(logit_bias or {}),
            stop=[stop] if isinstance(stop, str) else list(stop or []),
            seed=seed,
            logprobs=int(logprobs or 0),
        )
        context = self.loaded.context_length
        validate(sampling, context, self.loaded.vocab_size)
        rid = request_id or f"req-{next(self._ids)}-{uuid.uuid4().hex[:6]}"
        request = Request(rid, messages=messages, prompt=prompt, sampling=sampling, tools=tools,
                          chat_template_kwargs=dict(chat_template_kwargs or {}))
        images, extra = [], {"source": source or "python", "label": prompt_snippet(messages, prompt)}
        if self.loaded.kind == "vision":  # every request to a vision model, text-only ones too
            from mlx_nb.engine.vision import prepare_vision_request

            tokens, images, extra["prompt_text"] = prepare_vision_request(self.loaded, request, self.image_options)
            # No prefix reuse: an image's pad tokens don't identify the image (a hit could hand one
            # image's state to another), and prefill_vision builds every cache itself anyway.
            extra["no_prefix_cache"] = True
        else:
            tokens, extra["boundaries"] = self._prompt_tokens(request)
        if len(tokens) >= context:
            raise RequestError(
                f"the prompt is {len(tokens)} tokens but {self.model_name} holds {context}: shorten the conversation",
                "messages" if messages is not None else "prompt",
            )
        sampling.max_tokens = min(sampling.max_tokens, context - len(tokens))
        handle = RequestHandle(rid, self.abort)
        live = LiveRequest(
            request=request,
            handle=handle,
            prompt_tokens=tokens,
            stream=TextStream(self.loaded.tokenizer, sampling.stop),
            logits_processors=list(logits_processors or []),
            images=images,
            extra=extra,
        )
        with self._stop_lock:
            if not self._stopped:
                self._commands.put(("submit", live))
                return handle
        live.finish("abort", error="the engine was closed before this request started")
        return handle

    def _prompt_tokens(self, request: Request) -> tuple[list[int], list[int]]:
        """Prompt token ids, and the segment ends worth a prefix-cache snapshot."""
        tok = self.loaded.tokenizer
        if request.messages is None:
            if not isinstance(request.prompt, str):
                raise RequestError("prompt must be a string", "prompt")
            return encode_prompt(tok, request.prompt, chat=False), []
        messages = normalize_messages(request.messages)
        request.messages = messages

        def render(msgs, add_generation_prompt=True):
            text = render_chat(tok, msgs, request.tools, request.chat_template_kwargs, add_generation_prompt)
            return encode_prompt(tok, text, chat=True)

        tokens = render(messages)
        boundaries = segment_boundaries(render, messages, tokens) if self._snapshots else []
        return tokens, boundaries

    def generate(self, messages: Optional[list] = None, prompt: Optional[str] = None, **kwargs):
        """Submit and wait: the finished Result."""
        return self.submit(messages, prompt, **kwargs).result()

    def abort(self, request_id: str) -> None:
        if not self._closed:
            self._commands.put(("abort", request_id))

    def status(self) -> dict:
        """Per engine and per request: phase, tokens, timings, batch size, memory, runtime."""
        base = {
            "model": self.model_name,
            "ready": self.ready,
            "loading": not self._ready.is_set(),
            "error": None if self._load_error is None else str(self._load_error),
            "uptime_s": time.time() - self._started,
            "runtime": self._runtime,
            "load": self.load_progress.to_dict(),
        }
        if not self.ready or self._closed:
            return {**base, "requests": [], "batch_size": 0, "queue_length": 0}
        return {**base, **self._call(self._status_on_thread)}

    def _status_on_thread(self) -> dict:
        import mlx.core as mx

        runner = self._runner
        requests = [lv.status() for lv in runner.live()]
        uptime = time.time() - self._started
        return {
            "kind": self.loaded.kind,
            "context_length": self.loaded.context_length,
            "batch_size": len(runner.decoding),
            "peak_batch_size": runner.peak_batch,
            "queue_length": sum(1 for r in requests if r["phase"] == "queued"),
            "prefilling": sum(1 for r in requests if r["phase"] == "prefill"),
            "prefill_chunk": runner.pacer.chunk,
            "prefill_batch": runner.prefill_batch,  # 1 for architectures whose padded prefill is unsafe
            "steps": runner.steps,
            "generated_tokens": runner.generated_tokens,
            "prompt_tokens": runner.prompt_tokens,
            "tokens_per_s": runner.generated_tokens / uptime if uptime else 0.0,
            "memory": {"active_bytes": mx.get_active_memory(), "peak_bytes": mx.get_peak_memory()},
            "options": dict(self.options),
            "prefix_cache": runner.prefix.status() if runner.prefix else {"enabled": False},
            "requests": requests,
        }

    def cache_layout(self, request_id: Optional[str] = None) -> dict:
        """Per layer: cache class (nested for CacheList), offset, shapes, dtype, bytes, trimmable."""
        self.wait_ready()
        if request_id is None:
            return self._call(lambda: {"model": self.model_name, "request": None,
                                       "layers": describe_layers(self.loaded.make_cache())})
        layers = self._call(lambda: self._runner.request_layout(request_id))
        if layers is None:
            raise KeyError(f"no live request {request_id!r}: it finished or never existed")
        return {"model": self.model_name, "request": request_id, "layers": layers}

    def events(self, since: int = 0) -> list[dict]:
        return [e.to_dict() for e in self.event_log.recent(since)]

    def subscribe(self, callback: Callable) -> Callable[[], None]:
        return self.event_log.subscribe(callback)

    def close(self, timeout: float = 30.0) -> None:
        if self._closed:
            return
        self._closed = True
        self._commands.put(("close",))
        if not self.on_engine_thread:
            self._job.join(timeout)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "ready" if self.ready else ("failed" if self._load_error else "loading")
        return f"Engine({self.model_name!r}, {state}, pid={os.getpid()})"
