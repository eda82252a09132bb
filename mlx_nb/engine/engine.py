"""Engine: the thread-safe face of one continuously batched model.

One engine thread owns every MLX call, model load included (MLX streams are thread-local: two
threads doing MLX work at once corrupt state). Callers on any thread or event loop talk to it
through a command queue; replies come back through RequestHandles. Templating and tokenizing
happen in the caller's thread, so bad input is refused at `submit` with a message naming the field.

Past 500 lines on purpose: this is the one public class callers hold; what it does is already split
out (submit_request, prefix_controls, adapter_controls, loop, scheduler), and what is left here is the
thin method per public call.
"""

from __future__ import annotations

import atexit
import itertools
import os
import time
import uuid
import weakref
from typing import Any, Callable, Optional

from mlx_nb.engine import workers
from mlx_nb.engine.constrained import processor_for
from mlx_nb.engine.background import BackgroundLane
from mlx_nb.engine.events import EventLog, prompt_snippet
from mlx_nb.engine.fim import fim_format, fim_prompt
from mlx_nb.engine.handle import RequestHandle
from mlx_nb.engine.images import ImageOptions
from mlx_nb.engine.kv_quant import KVQuantization, fresh_cache, kv_status
from mlx_nb.models.cache_layout import describe_layers
from mlx_nb.engine.live import LiveRequest
from mlx_nb.engine.loop import EngineClosedError, EngineLoop
from mlx_nb.engine.messages import normalize_messages
from mlx_nb.engine.prefix import segment_boundaries
from mlx_nb.engine.adapter_controls import AdapterControls
from mlx_nb.engine.prefix_controls import PrefixCacheControls
from mlx_nb.engine.prompts import chat_tool_format, encode_prompt, render_chat
from mlx_nb.engine.reasoning import reasoning_format
from mlx_nb.engine.thinking import Thinking
from mlx_nb.engine.sampling import validate
from mlx_nb.engine.textstream import TextStream
from mlx_nb.engine.submit_request import SubmitRequest
from mlx_nb.engine.types import ContextOverflowError, Request, RequestError
from mlx_nb.models.progress import LoadProgress

__all__ = ["Engine", "EngineClosedError"]


# Every engine loop not yet stopped, with the job running it: at interpreter exit each is stopped
# and waited for before Python tears down (see _stop_all_at_exit).
_running: "weakref.WeakKeyDictionary[EngineLoop, workers.Job]" = weakref.WeakKeyDictionary()


@atexit.register
def _stop_all_at_exit(timeout: float = 30.0) -> None:
    """A script that ends (or raises) while an Engine decodes: its thread is inside MLX between two
    ops, and Python's teardown under it aborted the process ("terminate called without an active
    exception", exit status 134). Stopped here first, the thread leaves MLX between steps and the
    process exits with its own status."""
    for loop, job in list(_running.items()):
        loop.close()
        job.join(timeout)


class Engine(PrefixCacheControls, AdapterControls):
    """`Engine("tiny-llama")` loads the model on its own thread and serves `submit()` calls.

    Dropping an Engine (or re-running `eng = Engine(...)` in a notebook) closes it: its thread
    goes idle and its model and batch are freed. `close()` (or `with Engine(...)`) does it now.
    """

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
        prefix_cache_dir: Optional[str] = None,
        prefix_cache_disk_bytes: Optional[int] = None,
        memory_limit: Optional[int] = None,
        buffer_cache_bytes: Optional[int] = None,
        event_capacity: int = 4096,
        image_roots: Optional[list] = None,
        allow_remote_images: bool = False,
        allow_private_image_hosts: bool = False,
        max_image_bytes: int = 20 * 1024 * 1024,
        max_image_pixels: int = 40_000_000,
        batch_policy: Optional[str] = None,
        quantize: Optional[int] = None,
        speculation: bool = True,
        draft_model: Optional[str] = None,
        kv_bits: Optional[int] = None,
        kv_group_size: int = 64,
        job_rows_under_load: int = 1,
        wait: bool = False,
    ):
        from mlx_nb.models.sources import DEFAULT_MODEL

        self.model_name = model or DEFAULT_MODEL
        # prefill_budget_s: while rows decode, prompt chunks are sized so a step takes about this
        # long (None: always prefill_step_size tokens), so long prompts don't stall running streams.
        # speculation: greedy rows of a small batch verify prompt-lookup guesses (engine/speculation.py),
        # or draft_model's (a model of the same tokenizer, engine/draft.py)
        # kv_bits (8 or 4): each request's keys and values quantized, rows of the shared batch all the
        # same (engine/kv_quant.py); a model that cannot read them keeps float ones, and status() says why.
        KVQuantization.parse(kv_bits, kv_group_size)  # a wrong setting is refused here, in one line
        # job_rows_under_load: a dataset job's minimum share beside interactive requests (its rows yield
        # to an arriving request and get this many slots back after a second; engine/background.py)
        BackgroundLane(job_rows_under_load)  # likewise
        self.options = dict(max_batch=max_batch, prefill_batch=prefill_batch, prefill_step_size=prefill_step_size,
                            prefill_budget_s=prefill_budget_s, speculation=speculation, draft_model=draft_model, kv_bits=kv_bits or None,
                            kv_group_size=kv_group_size, job_rows_under_load=job_rows_under_load)
        self.event_log = EventLog(event_capacity)
        self.image_options = ImageOptions(  # local image files are read only under image_roots (default: cwd)
            roots=image_roots if image_roots is not None else [os.getcwd()],
            allow_remote=allow_remote_images,
            allow_private=allow_private_image_hosts,  # remote images from loopback/private/... addresses
            max_bytes=max_image_bytes,
            max_pixels=max_image_pixels,
        )
        # prefix_cache_dir: the prefix cache also lives there (engine/prefix_disk.py), within
        # prefix_cache_disk_bytes (default 4 GiB or a tenth of the free space), across restarts.
        self.prefix_options = dict(enabled=prefix_cache, max_bytes=prefix_cache_bytes, dir=prefix_cache_dir,
                                   disk_bytes=prefix_cache_disk_bytes)
        # None: batch as the compatibility matrix says (engine/batchability.py); "batched",
        # "prefill_alone" or "sequential" force that mode (the sweep that measures the matrix does).
        if batch_policy not in (None, "batched", "prefill_alone", "sequential"):
            raise ValueError("batch_policy must be None, 'batched', 'prefill_alone' or 'sequential', "
                             f"not {batch_policy!r}")
        self.memory_options = dict(memory_limit=memory_limit, buffer_cache_bytes=buffer_cache_bytes)
        self.load_progress = LoadProgress()  # the load's phase, for status() while it runs
        # quantize (4 or 8): a float checkpoint's layers quantized for the CPU kernels at load
        # (default $MLX_NB_QUANTIZE; quantized checkpoints run as shipped either way).
        self._loop = EngineLoop(self.model_name, self.options, self.prefix_options, self.memory_options,
                                self.event_log, batch_policy, self.load_progress, load_options=dict(quantize=quantize))
        self._started = time.time()
        self._ids = itertools.count(1)
        self._job = workers.start(self._loop.run)
        _running[self._loop] = self._job
        # The loop holds no reference back to this Engine, so dropping the Engine runs this.
        self._close_loop = weakref.finalize(self, self._loop.close)
        self._close_loop.atexit = False  # _stop_all_at_exit stops the loop and waits for it instead
        if wait:
            self.wait_ready()

    # -- readiness ---------------------------------------------------------------------------
    @property
    def loaded(self):
        """The LoadedModel (None while loading, and after close)."""
        return self._loop.loaded

    @property
    def ready(self) -> bool:
        return self._loop.ready.is_set() and self._loop.load_error is None and not self.closed

    @property
    def policy(self):
        """How this model batches (engine/batchability.py): set once the model is loaded."""
        return self._loop.policy

    @property
    def closed(self) -> bool:
        return self._loop.closing

    @property
    def idle(self) -> bool:
        """No request running or queued (read from any thread: a snapshot, not a promise)."""
        loop = self._loop
        return not (loop.runner is not None and loop.runner.active) and not loop.prefills and loop.commands.empty()

    @property
    def weights_bytes(self) -> int:
        """The loaded weights' bytes, a draft model's included: what the registry's budget counts (0
        while loading)."""
        memory = self._loop.memory
        return memory.weights + memory.draft_weights if memory is not None else 0

    @property
    def prefix_budget_bytes(self) -> Optional[int]:
        """The prefix cache's byte budget once loaded (0: no prefix cache); None while loading."""
        runner = self._loop.runner
        if runner is None:
            return None
        return runner.prefix.max_bytes if runner.prefix is not None else 0

    @property
    def load_error(self) -> Optional[BaseException]:
        return self._loop.load_error

    def wait_ready(self, timeout: Optional[float] = None) -> "Engine":
        if not self._loop.ready.wait(timeout):
            raise TimeoutError(f"model {self.model_name} is still loading")
        if self._loop.load_error is not None:
            raise self._loop.load_error
        return self

    @property
    def on_engine_thread(self) -> bool:
        return self._loop.on_thread

    def _call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Run `fn` on the engine thread between two steps and return its result."""
        return self._loop.call(fn, timeout)

    def _check_open(self) -> None:
        if self.closed:
            raise EngineClosedError("the engine is closed: create a new Engine")

    # -- public API --------------------------------------------------------------------------
    def submit(self, messages: Optional[list] = None, prompt: Optional[str] = None, **fields: Any) -> RequestHandle:
        """`submit_request(SubmitRequest(messages=..., prompt=..., **fields))`: the same request as
        keywords (engine/submit_request.py names them), returning its handle at once."""
        return self.submit_request(SubmitRequest.of(messages=messages, prompt=prompt, **fields))

    def submit_request(self, req: SubmitRequest) -> RequestHandle:
        """Validate, template and queue a request; returns at once with its handle (see `_prepared`)."""
        live = self._prepared(req)
        self._loop.submit(live)
        return live.handle

    def submit_requests(self, reqs: list[SubmitRequest]) -> list[RequestHandle]:
        """Several requests that start together: all are validated and templated first (one refused
        queues none), then the engine admits them at the same step, so they are read as one prompt
        batch and decode side by side (a route's `n` choices)."""
        lives = [self._prepared(req) for req in reqs]
        self._loop.submit_all(lives)
        return [live.handle for live in lives]

    def _prepared(self, req: SubmitRequest) -> LiveRequest:
        """A request validated, templated and tokenized on the caller's thread, ready to queue.

        `logits_processors` (`fn(tokens, logits) -> logits`) and `sampler` (`fn(logprobs) -> token ids`)
        run on this request's row only; one that raises or returns the wrong shape or dtype ends
        this request alone with finish_reason "error". A `constraint` (engine/constrained.py: a JSON
        schema, regex or grammar) holds the output to it token by token; a grammar llguidance cannot
        compile is a RequestError here. `max_tokens` None means the rest of the context; a budget
        larger than what fits after the prompt is clamped to it (`handle.max_tokens` says what was
        granted). `source` says who asked (e.g. "notebook 02-chats.ipynb", "route: OpenAI/Python"):
        batch events carry it, with the prompt's first words, so a timeline can say which lane is whose.
        `suffix` with a `prompt` asks what goes between them (fill-in-the-middle), for a model whose
        tokenizer has FIM tokens (`status()["fill_in_the_middle"]`); for others it is a RequestError.
        A thinking model's reasoning streams apart from its answer (`Delta.reasoning`; its format is
        `status()["reasoning"]`); stop strings and a constraint apply to the answer only, and
        `reasoning_budget` closes the reasoning after that many tokens. `split_reasoning=False` keeps
        the reply as the model wrote it, markers and all (a raw completion).
        """
        self._check_open()
        self.wait_ready()
        messages, prompt, suffix = req.messages, req.prompt, req.suffix
        if (messages is None) == (prompt is None):
            raise RequestError("give exactly one of messages (chat) or prompt (completion)", "messages")
        loaded = self.loaded  # one read: the loop drops it when it stops
        if loaded is None:
            raise EngineClosedError("the engine has stopped: create a new Engine")
        context = loaded.context_length
        sampling = req.sampling_for(context)
        validate(sampling, loaded.vocab_size)
        if suffix and messages is not None:
            raise RequestError("suffix goes with a completion prompt (fill-in-the-middle), not with messages", "suffix")
        if suffix and self._fim(loaded) is None:
            raise RequestError(f"{self.model_name} has no fill-in-the-middle tokens, so it cannot take a suffix: "
                               "send the prompt alone", "suffix")
        rid = req.request_id or f"req-{next(self._ids)}-{uuid.uuid4().hex[:6]}"
        request = Request(rid, messages=messages, prompt=prompt, sampling=sampling, tools=req.tools,
                          chat_template_kwargs=dict(req.chat_template_kwargs or {}), suffix=suffix or None)
        images, extra = [], {"source": req.source or "python", "label": prompt_snippet(messages, prompt), "job": req.job}
        if loaded.kind == "vision":  # every request to a vision model, text-only ones too
            from mlx_nb.engine.vision import prepare_vision_request

            tokens, images, extra["prompt_text"] = prepare_vision_request(loaded, request, self.image_options)
            # No prefix reuse: an image's pad tokens don't identify the image (a hit could hand one
            # image's state to another), and the vision prefill builds every cache itself anyway.
            extra["no_prefix_cache"] = True
        else:
            tokens, extra["boundaries"] = self._prompt_tokens(loaded, request)
        self._check_adapter(req.adapter, loaded, extra)
        if len(tokens) >= context:
            raise ContextOverflowError(self.model_name, len(tokens), context, self._system_tokens(loaded, request),
                                       "messages" if messages is not None else "prompt")
        sampling.max_tokens = min(sampling.max_tokens, context - len(tokens))
        sampler, constraint, reasoning_budget = req.sampler, req.constraint, req.reasoning_budget
        if sampler is not None and not callable(sampler):
            raise RequestError("sampler must be a function of the log-probabilities", "sampler")
        logits_processors = list(req.logits_processors or [])
        thinking = (Thinking.of(self._reasoning_format(loaded), loaded.tokenizer, tokens)
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
        handle = RequestHandle(rid, self._loop.abort, prompt_tokens=len(tokens), max_tokens=sampling.max_tokens)  # the loop, not self: a handle never pins an Engine
        live = LiveRequest(
            request=request,
            handle=handle,
            prompt_tokens=tokens,
            stream=TextStream(loaded.tokenizer, sampling.stop, thinking.split() if thinking is not None else None),
            logits_processors=logits_processors,
            sampler=sampler,
            images=images,
            extra=extra,
        )
        return live

    def _reasoning_format(self, loaded):
        """The loaded model's reasoning markers (engine/reasoning.py), found once per model."""
        if getattr(self, "_reasoning_of", None) is not loaded:
            self._reasoning_of, self._reasoning = loaded, reasoning_format(loaded.tokenizer)
        return self._reasoning

    # -- the tokenizer, as llama-server's routes expose it (no MLX: any thread) --------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return list(self._ready_loaded().tokenizer.encode(text, add_special_tokens=add_special))

    def detokenize(self, tokens: list[int]) -> str:
        return self._ready_loaded().tokenizer.decode(list(tokens))

    def apply_template(self, messages: list, tools: Optional[list] = None,
                       chat_template_kwargs: Optional[dict] = None) -> str:
        """The prompt text `submit(messages=...)` would read (the template, tools and all)."""
        return render_chat(self._ready_loaded().tokenizer, normalize_messages(messages), tools,
                           dict(chat_template_kwargs or {}), True)

    @property
    def vocab_size(self) -> Optional[int]:
        return self._ready_loaded().vocab_size

    def _ready_loaded(self):
        self._check_open()
        self.wait_ready()
        loaded = self.loaded
        if loaded is None:
            raise EngineClosedError("the engine has stopped: create a new Engine")
        return loaded

    def count_tokens(self, messages: Optional[list] = None, prompt: Optional[str] = None,
                     tools: Optional[list] = None) -> int:
        """How many prompt tokens `submit` would queue for this input (chat template applied)."""
        self._check_open()
        self.wait_ready()
        request = Request("count", messages=messages, prompt=prompt, tools=tools)
        loaded = self.loaded
        if loaded is None:
            raise EngineClosedError("the engine has stopped: create a new Engine")
        if loaded.kind == "vision":
            from mlx_nb.engine.vision import prepare_vision_request

            return len(prepare_vision_request(loaded, request, self.image_options)[0])
        tok = loaded.tokenizer
        if messages is None:
            return len(encode_prompt(tok, prompt, chat=False))
        text = render_chat(tok, normalize_messages(messages), tools, {}, True)
        return len(encode_prompt(tok, text, chat=True))

    def _prompt_tokens(self, loaded, request: Request) -> tuple[list[int], list[int]]:
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
        boundaries = segment_boundaries(render, messages, tokens) if self._loop.snapshots else []
        return tokens, boundaries

    def _system_tokens(self, loaded, request: Request) -> int:
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

    def generate(self, messages: Optional[list] = None, prompt: Optional[str] = None, **kwargs):
        """Submit and wait: the finished Result."""
        return self.submit(messages, prompt, **kwargs).result()

    def abort(self, request_id: str) -> None:
        self._loop.abort(request_id)

    def status(self) -> dict:
        """Per engine and per request: phase, tokens, timings, batch size, memory, runtime."""
        base = {
            "model": self.model_name,
            "ready": self.ready,
            "loading": not self._loop.ready.is_set(),
            "error": None if self.load_error is None else str(self.load_error),
            "uptime_s": time.time() - self._started,
            "runtime": self._loop.runtime,
            "load": self.load_progress.to_dict(),
        }
        if not self.ready:
            return {**base, "requests": [], "batch_size": 0, "queue_length": 0}
        return {**base, **self._call(self._status_on_thread)}

    def sampling_defaults(self) -> dict:
        """What the API routes give a request for each sampling setting it leaves out: the model's
        own recommendation (`values`) and where it came from (`source`; None when it has none)."""
        loaded = self.loaded
        return dict(loaded.sampling) if loaded is not None else {"values": {}, "source": None}

    def tool_format(self) -> Optional[str]:
        """How request tools reach the model: "template" (its chat template renders them) or
        "generic" (inlined in the system prompt, see `generic_tools`); None before the model loads."""
        loaded = self.loaded
        if loaded is None:
            return None
        if loaded.kind == "vision":
            from mlx_nb.engine.vision import vision_tool_format

            return vision_tool_format(loaded)
        return chat_tool_format(loaded.tokenizer)

    @staticmethod
    def _fim(loaded) -> Optional[str]:
        return None if loaded.kind == "vision" else fim_format(loaded.tokenizer)

    def _status_on_thread(self) -> dict:
        runner, prefills = self._loop.runner, self._loop.prefills
        waiting = prefills.live() if prefills is not None else []
        requests = [lv.status() for lv in [*runner.live(), *waiting]]
        uptime = time.time() - self._started
        return {
            "kind": self.loaded.kind,
            "context_length": self.loaded.context_length,
            "batch_size": len(runner.decoding),
            "peak_batch_size": runner.peak_batch,
            "queue_length": sum(1 for r in requests if r["phase"] == "queued"),
            "prefilling": sum(1 for r in requests if r["phase"] == "prefill"),
            "prefill_chunk": runner.pacer.chunk,
            "prefill_batch": runner.prefill_batch,  # 1 when the policy prefills prompts one at a time
            "policy": self._loop.policy.to_dict(),
            # which layers run on the CPU kernels (mlx_nb.kernels.swap), None on MLX's own ops
            "kernels": self.loaded.kernels,
            "weights": self.loaded.weights,  # each matrix's format (a GGUF's block types) and the bytes held
            "sampling_defaults": self.sampling_defaults(),
            "tool_format": self.tool_format(),
            "fill_in_the_middle": self._fim(self.loaded),  # the FIM spelling a `suffix` uses, or None
            "reasoning": (fmt.name if (fmt := self._reasoning_format(self.loaded)) else None),  # a thinking model's markers
            "steps": runner.steps,
            "generated_tokens": runner.generated_tokens,
            "prompt_tokens": runner.prompt_tokens,
            "latency": runner.latency.snapshot(),
            "tokens_per_s": runner.generated_tokens / uptime if uptime else 0.0,
            "memory": self._loop.memory.status(runner.prefix),
            "options": dict(self.options),
            # the KV cache's format: float, or quantized (bits, group size); and why float when asked otherwise
            "kv_cache": kv_status(self._loop.kv, self._loop.kv_note),
            "prefix_cache": runner.prefix.status() if runner.prefix is not None else {"enabled": False},
            "adapters": self._adapters_on_thread(),
            "speculation": runner.speculation.status() if runner.speculation is not None else None,
            # dataset jobs' rows (engine/background.py): waiting, in the batch, yielded to interactive rows
            "background": runner.background_status(),
            "requests": requests,
        }

    def cache_layout(self, request_id: Optional[str] = None) -> dict:
        """Per layer: cache class (nested for CacheList), offset, shapes, dtype, bytes, trimmable; and the
        prefix cache's status (what it keeps in memory and on disk), which the cache picture draws too."""
        self.wait_ready()

        def read():
            prefix = self._loop.runner.prefix
            layers = (describe_layers(fresh_cache(self.loaded, self._loop.kv)) if request_id is None
                      else self._loop.runner.request_layout(request_id))
            return layers, (prefix.status() if prefix is not None else {"enabled": False})

        layers, prefix = self._call(read)
        if layers is None:
            raise KeyError(f"no live request {request_id!r}: it finished or never existed")
        return {"model": self.model_name, "request": request_id, "layers": layers, "prefix_cache": prefix}

    def events(self, since: int = 0) -> list[dict]:
        return [e.to_dict() for e in self.event_log.recent(since)]

    def subscribe(self, callback: Callable) -> Callable[[], None]:
        return self.event_log.subscribe(callback)

    def close(self, timeout: float = 30.0) -> None:
        """Stop serving: running requests end with "abort", the model and batch are freed."""
        self._close_loop()
        if not self.on_engine_thread:
            self._job.join(timeout)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "ready" if self.ready else ("failed" if self.load_error else "loading")
        return f"Engine({self.model_name!r}, {state}, pid={os.getpid()})"
