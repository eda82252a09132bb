"""Engine: the thread-safe face of one continuously batched model.

One engine thread owns every MLX call, model load included (MLX streams are thread-local: two
threads doing MLX work at once corrupt state). Callers on any thread or event loop talk to it
through a command queue; replies come back through RequestHandles. Templating and tokenizing
happen in the caller's thread (inputs/intake.py), so bad input is refused at `submit` with a message
naming the field.

What the engine does lives in its rooms (see `mlx_nb/engine/__init__.py`); what is left here is the
thin method per public call.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from typing import Any, Callable, Optional

from mlx_nb.engine.adapter_controls import AdapterControls
from mlx_nb.engine.caches.kv_quant import fresh_cache, kv_status
from mlx_nb.engine.config import EngineConfig
from mlx_nb.engine.events import EventLog
from mlx_nb.engine.handle import RequestHandle
from mlx_nb.engine.inputs.images import ImageOptions
from mlx_nb.engine.inputs.intake import Intake, fim_of
from mlx_nb.engine.inputs.messages import normalize_messages
from mlx_nb.engine.inputs.prompts import chat_tool_format, render_chat
from mlx_nb.engine.prefix_controls import PrefixCacheControls
from mlx_nb.engine.scheduling import workers
from mlx_nb.engine.scheduling.live import LiveRequest
from mlx_nb.engine.scheduling.loop import EngineClosedError, EngineLoop
from mlx_nb.engine.submit_request import SubmitRequest
from mlx_nb.models.cache_layout import describe_layers
from mlx_nb.models.progress import LoadProgress

__all__ = ["Engine", "EngineClosedError"]

# the settings status()["options"] shows (Engine.options)
STATUS_SETTINGS = ("max_batch", "prefill_batch", "prefill_step_size", "prefill_budget_s", "speculation", "draft_model",
                 "kv_bits", "kv_group_size", "job_rows_under_load", "job_batch")


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

    def __init__(self, model: Optional[str] = None, *, config: Optional[EngineConfig] = None, wait: bool = False,
                 **settings: Any):
        """`model`: a built-in name, a model folder, a .gguf file or a hub id (default: the built-in
        default model). The settings are EngineConfig's (`config`, and any of them by name over it:
        `Engine(model, max_batch=8, kv_bits=8)`); `wait`: return once the model is loaded."""
        from mlx_nb.models.sources import DEFAULT_MODEL

        self.model_name = model or DEFAULT_MODEL
        self.config = cfg = EngineConfig.of(config, **settings)
        self.event_log = EventLog(cfg.event_capacity)
        self.image_options = ImageOptions(  # local image files are read only under image_roots (default: cwd)
            roots=cfg.image_roots if cfg.image_roots is not None else [os.getcwd()],
            allow_remote=cfg.allow_remote_images,
            allow_private=cfg.allow_private_image_hosts,  # remote images from loopback/private/... addresses
            max_bytes=cfg.max_image_bytes,
            max_pixels=cfg.max_image_pixels,
        )
        self.load_progress = LoadProgress()  # the load's phase, for status() while it runs
        self._loop = EngineLoop(self.model_name, cfg, self.event_log, self.load_progress)
        self._intake = Intake(self.model_name, self.image_options, self._loop)  # requests in, on the caller's thread
        self._started = time.time()
        self._interactive: list[RequestHandle] = []  # handles of interactive requests, until done
        self._interactive_lock = threading.Lock()
        self._job = workers.start(self._loop.run)
        _running[self._loop] = self._job
        # The loop holds no reference back to this Engine, so dropping the Engine runs this.
        self._close_loop = weakref.finalize(self, self._loop.close)
        self._close_loop.atexit = False  # _stop_all_at_exit stops the loop and waits for it instead
        if wait:
            self.wait_ready()

    @property
    def options(self) -> dict:
        """The batch's settings, as status()["options"] shows them."""
        return {k: getattr(self.config, k) for k in STATUS_SETTINGS}

    @property
    def prefix_options(self) -> dict:
        cfg = self.config
        return dict(enabled=cfg.prefix_cache, max_bytes=cfg.prefix_cache_bytes, dir=cfg.prefix_cache_dir,
                    disk_bytes=cfg.prefix_cache_disk_bytes)

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
        """How this model batches (engine/batch/batchability.py): set once the model is loaded."""
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
        self._count_interactive([live])
        self._loop.submit(live)
        return live.handle

    def submit_requests(self, reqs: list[SubmitRequest]) -> list[RequestHandle]:
        """Several requests that start together: all are validated and templated first (one refused
        queues none), then the engine admits them at the same step, so they are read as one prompt
        batch and decode side by side (a route's `n` choices)."""
        lives = [self._prepared(req) for req in reqs]
        self._count_interactive(lives)
        self._loop.submit_all(lives)
        return [live.handle for live in lives]

    def _count_interactive(self, lives: list) -> None:
        with self._interactive_lock:
            self._interactive = [h for h in self._interactive if not h.done]
            self._interactive += [lv.handle for lv in lives if not lv.extra.get("job")]

    def interactive_requests(self) -> int:
        """Requests other than dataset jobs' rows that are queued or running, read on any thread
        without waiting for a step: a fine-tune (mlx_nb/training) pauses while there are any."""
        with self._interactive_lock:
            return sum(1 for h in self._interactive if not h.done)

    def _prepared(self, req: SubmitRequest) -> LiveRequest:
        """A request validated, templated and tokenized on the caller's thread, ready to queue.

        `logits_processors` (`fn(tokens, logits) -> logits`) and `sampler` (`fn(logprobs) -> token ids`)
        run on this request's row only; one that raises or returns the wrong shape or dtype ends
        this request alone with finish_reason "error". A `constraint` (engine/sampling/constrained.py: a JSON
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
        return self._intake.live(self._ready_loaded(), req)

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
        """The loaded model, read once (the loop drops it when it stops), once it is ready."""
        self._check_open()
        self.wait_ready()
        loaded = self.loaded
        if loaded is None:
            raise EngineClosedError("the engine has stopped: create a new Engine")
        return loaded

    def count_tokens(self, messages: Optional[list] = None, prompt: Optional[str] = None,
                     tools: Optional[list] = None) -> int:
        """How many prompt tokens `submit` would queue for this input (chat template applied)."""
        return self._intake.count(self._ready_loaded(), messages, prompt, tools)

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
            from mlx_nb.engine.inputs.vision import vision_tool_format

            return vision_tool_format(loaded)
        return chat_tool_format(loaded.tokenizer)

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
            "fill_in_the_middle": fim_of(self.loaded),  # the FIM spelling a `suffix` uses, or None
            # a thinking model's markers
            "reasoning": (fmt.name if (fmt := self._intake.reasoning_format(self.loaded)) else None),
            "steps": runner.steps,
            "generated_tokens": runner.generated_tokens,
            "prompt_tokens": runner.prompt_tokens,
            "latency": runner.latency.snapshot(),
            "tokens_per_s": runner.generated_tokens / uptime if uptime else 0.0,
            "memory": self._loop.memory.status(runner.prefix),
            "options": self.options,
            # the KV cache's format: float, or quantized (bits, group size); and why float when asked otherwise
            "kv_cache": kv_status(self._loop.kv, self._loop.kv_note),
            "prefix_cache": runner.prefix.status() if runner.prefix is not None else {"enabled": False},
            "adapters": self._adapters_on_thread(),
            "speculation": runner.speculation.status() if runner.speculation is not None else None,
            # dataset jobs' rows (engine/scheduling/background.py): waiting, in the batch, yielded to interactive rows
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


def _signature_with_settings():
    """Engine's signature with every EngineConfig setting as a keyword, for help() and completion."""
    import inspect

    from mlx_nb.engine.config import settings_rows

    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD), P("model", P.POSITIONAL_OR_KEYWORD, default=None),
              P("config", P.KEYWORD_ONLY, default=None), P("wait", P.KEYWORD_ONLY, default=False)]
    params += [P(r["name"], P.KEYWORD_ONLY, default=r["default"], annotation=r["type"]) for r in settings_rows()]
    return inspect.Signature(params)


Engine.__init__.__signature__ = _signature_with_settings()
