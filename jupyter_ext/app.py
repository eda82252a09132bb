"""MLXExtension: owns the one Engine of this Jupyter server and mounts the `mlx/v1` routes.

The engine loads on its own thread, so the server (and every other extension) is usable at once;
until the model is ready, routes that need it answer 503 with `Retry-After: 2`. Why 503 and not
holding the request open: a load can take minutes (a first GGUF conversion), proxies and SDK
timeouts would cut a held request anyway, and 503 + Retry-After is what the openai and anthropic
SDKs already retry on (with backoff), so scripts started together with the server just work.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Optional

from jupyter_core.application import base_aliases
from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join
from traitlets import Bool, Dict, Float, Int, List, TraitError, Unicode, default, validate

from jupyter_ext import batches, control, embeddings, fine_tuning, handlers, metrics, monitor
from jupyter_ext.headless import ModelServerApp
from jupyter_ext.kernel_env import KernelEnv, KernelPort, direct_url
from jupyter_ext.keys import KEY_FILE, Keys, load_or_create_key
from jupyter_ext.settings import EngineTraits, engine_kwargs
from mlx_nb.engine import default_prefix_folder as default_folder
from mlx_nb.models.sources import DEFAULT_MODEL

ROUTES = [
    (r"mlx/v1/models", handlers.ModelsHandler),
    (r"mlx/v1/models/(.+)", handlers.ModelHandler),
    (r"mlx/v1/chat/completions", handlers.ChatHandler),
    (r"mlx/v1/completions", handlers.CompletionsHandler),
    (r"mlx/v1/messages", handlers.MessagesHandler),
    (r"mlx/v1/messages/count_tokens", handlers.CountTokensHandler),
    (r"mlx/v1/responses", handlers.ResponsesHandler),
    (r"mlx/v1/(tokenize|detokenize|apply-template)", handlers.TokensHandler),
    (r"mlx/v1/status", monitor.StatusHandler),
    (r"mlx/v1/metrics", metrics.MetricsHandler),
    (r"mlx/v1/cache", monitor.CacheHandler),
    (r"mlx/v1/events", monitor.EventsHandler),
    (r"mlx/v1/health", monitor.HealthHandler),
    (r"mlx/v1/requests/([^/]+)", control.RequestHandler),
    (r"mlx/v1/embeddings", embeddings.EmbeddingsHandler),
    (r"mlx/v1/files", batches.FilesHandler),
    (r"mlx/v1/files/([^/]+?)(/content)?", batches.FileHandler),
    (r"mlx/v1/batches", batches.BatchesHandler),
    (r"mlx/v1/batches/([^/]+?)(?:/(cancel))?", batches.BatchHandler),
    (r"mlx/v1/fine_tuning/jobs", fine_tuning.FineTuningJobsHandler),
    (r"mlx/v1/fine_tuning/jobs/([^/]+?)(?:/(cancel|events|checkpoints))?", fine_tuning.FineTuningJobHandler),
    (r"mlx/v1/batch\.svg", monitor.BatchPictureHandler),
    (r"mlx/v1/cache\.svg", monitor.CachePictureHandler),
    (r"mlx/v1(/.*)?", monitor.NotFoundHandler),  # JSON 404s instead of Jupyter's HTML page
    (r"mlx/?", monitor.BaseURLHandler),  # the base URL Claude Code probes
]


class MLXExtension(EngineTraits, ExtensionApp):
    """`c.MLXExtension.*` configures the engine; `jupyter mlx` runs a server with only this extension.

    The engine's settings (max_batch, kv_bits, ...) are EngineConfig's, inherited from EngineTraits
    (jupyter_ext/settings.py); the traits below are the server's own."""

    name = "mlx"
    description = "One shared, continuously batched MLX engine behind an OpenAI/Anthropic-compatible route."
    load_other_extensions = False  # `jupyter mlx` is an inference server; `jupyter lab` loads us anyway
    serverapp_class = ModelServerApp  # `jupyter mlx`: the model routes only, unless asked for more
    aliases = {**base_aliases, "model": "MLXExtension.model", "services": "ModelServerApp.jupyter_services"}
    classes = [ModelServerApp]  # the aliases name its option: --help must know the class

    model = Unicode(DEFAULT_MODEL, help="Model to serve: a built-in name, a local path, a .gguf file or a hub id.").tag(
        config=True
    )
    models = List(
        Unicode(),
        help="More models this server may serve, each loaded when a request names it: 'name=source', a source "
        "(a built-in name, a model directory, a .gguf file, a hub id; named by its folder or file stem), or a folder "
        "whose model directories and .gguf files are each served.",
    ).tag(config=True)
    adapters = List(
        Unicode(),
        help="mlx_lm LoRA adapter folders requests may name as 'model@adapter' (or with an 'adapter' field): "
        "'name=folder', a folder (named by itself), or a folder of them. An adapter folder listed in models counts "
        "too. Each is read the first time a request names it; its rows decode in the model's shared batch.",
    ).tag(config=True)
    memory_budget = Int(
        None, allow_none=True,
        help="Bytes the loaded models may hold together: weights plus each prefix cache's budget (None: three "
        "quarters of the machine's memory). Loading past it unloads the least recently used idle model first.",
    ).tag(config=True)
    keep_alive_s = Float(
        300.0, help="A model other than the default is unloaded once idle for this many seconds.",
    ).tag(config=True)
    draft_models = Dict(
        value_trait=Unicode(),
        help="Per model, as requests name it or by its source: a draft model of the same tokenizer (a name, folder "
        "or GGUF) whose greedy guesses the model verifies in the batch, instead of prompt lookup's; the tokens "
        "stay the model's own. A draft that cannot serve is left out, its reason in the model's status.",
    ).tag(config=True)
    model_kv_bits = Dict(
        value_trait=Int(),
        help="Per model, as requests name it or by its source: 8, 4 or 0 (float), over kv_bits for that model.",
    ).tag(config=True)
    prefix_cache_dir = Unicode(
        None, allow_none=True,
        help="Folder where the prefix cache is also kept, so a restarted server skips prompts it read before "
        "(None: $MLX_NB_PREFIX_CACHE_DIR, else $MLX_NB_HOME/prefix-cache; '': memory only).",
    ).tag(config=True)
    image_roots = List(
        Unicode(), help="Directories local image paths may come from (empty: the server's root_dir)."
    ).tag(config=True)
    max_body_bytes = Int(
        32 * 2**20, help="Largest request body the mlx routes accept (413 above); fits one base64 max-size image."
    ).tag(config=True)
    api_keys = List(
        Unicode(), help="API keys the mlx/v1 routes accept (and no other route), besides the generated one."
    ).tag(config=True)
    api_key_file = Unicode(
        None, allow_none=True,
        help="Where the generated API key is kept, owner-only (default: Jupyter's runtime dir/mlx-nb-api-key); "
        "'' generates none.",
    ).tag(config=True)
    load_on_start = Bool(True, help="Start loading the model with the server (else: on the first request).").tag(
        config=True
    )
    default_max_tokens = Int(
        None, allow_none=True,
        help="Budget of a request that names none (None: the rest of the context, as the OpenAI and Anthropic APIs do).",
    ).tag(config=True)
    max_tokens_cap = Int(
        None, allow_none=True,
        help="Most tokens one reply may generate; larger budgets are clamped and the response says so (None: no cap).",
    ).tag(config=True)
    default_temperature = Float(
        1.0, allow_none=True,
        help="Temperature of a request that sets none, when the model recommends none (its generation_config.json): "
        "1.0 as the OpenAI and Anthropic APIs document (None: greedy).",
    ).tag(config=True)
    model_aliases = Dict(
        {}, help="Other names clients may use for the served model, e.g. {'gpt-4o': 'smollm2-135m-instruct'}."
    ).tag(config=True)
    accept_any_model = Bool(
        True, help="Accept any model name (answering with the served one) while one model is served.",
    ).tag(config=True)
    backend_url = Unicode(
        "", help="An OpenAI-compatible server (http://host:port/v1) to front instead of loading a local model: "
        "vLLM, mlx_lm.server, llama.cpp's server, exo or another `jupyter mlx`. Every notebook shares it.",
    ).tag(config=True)
    backend_api_key = Unicode("", help="Sent to backend_url as `Authorization: Bearer <key>`.").tag(config=True)
    backend_model = Unicode(
        "", help="The model name to ask backend_url for (empty: the first it lists, or its default)."
    ).tag(config=True)
    metrics_unauthenticated = Bool(
        False, help="Serve mlx/v1/metrics without the mlx API key (for a local Prometheus scraper).",
    ).tag(config=True)
    max_file_bytes = Int(
        100 * 2**20, help="Largest file mlx/v1/files accepts (a batch's JSONL); 413 above.",
    ).tag(config=True)
    jobs_disk_bytes = Int(
        2 * 2**30, help="Disk the jobs and files under $MLX_NB_HOME may hold together; the oldest finished jobs "
        "are deleted first to make room.",
    ).tag(config=True)
    jobs_dir = Unicode(
        None, allow_none=True,
        help="Folder that keeps the jobs (their inputs and finished rows) and the uploaded files (None: "
        "$MLX_NB_HOME, where a restarted server finds and resumes its unfinished jobs).",
    ).tag(config=True)
    job_ttl_s = Float(
        7 * 24 * 3600.0, help="A finished job (its results and output files) is deleted this long after it ended.",
    ).tag(config=True)
    training_threads = Int(
        None, allow_none=True,
        help="BLAS threads of a fine-tune's worker process (None: as many as BLAS takes, every core). The worker is "
        "stopped while a chat is answered either way; fewer threads leave cores to the chats that arrive while it "
        "runs its share, and train more slowly.",
    ).tag(config=True)
    stream_keepalive_s = Float(
        15.0, help="While a stream waits for its first token (a long prompt being read), an SSE comment this often.",
    ).tag(config=True)

    @default("open_browser")
    def _no_browser(self):
        return False  # there is no page to open: this extension is an API

    def initialize_handlers(self):
        self.handlers.extend(ROUTES)

    def initialize_settings(self):
        import threading

        self.engine = None
        self.engine_lock = threading.Lock()
        self.embedder = None  # the default embedder, loaded by the first embeddings request (start_embedder)
        self.remote = None
        self.registry = self._registry()
        self.jobs = self._jobs()
        self.trained: dict[str, str] = {}  # fine-tuned adapters served here -> their base model
        self.training = self._training()
        self.sweeper = None  # unloads idle models (keep_alive_s), started with the server
        self.event_queues: set = set()  # live /events streams, woken when the extension stops
        self.request_counts = metrics.RequestCounts()  # finished requests, for /metrics
        self.keys = Keys(list(self.api_keys), self._generated_key())
        self.kernel_env, self.kernel_port = KernelEnv(), KernelPort()
        self.kernel_env.publish(direct_url(self.serverapp), self.keys.kernel_key)  # the port may move: see start
        if self.backend_url:
            from jupyter_ext.remote import RemoteEngine

            self.remote = RemoteEngine(self.backend_url, self.backend_api_key, self.backend_model)
            self.log.info("mlx: fronting %s", self.backend_url)
            return
        if self.load_on_start:
            self.start_engine()

    def _generated_key(self):
        if self.api_key_file == "":
            return None
        path = Path(self.api_key_file or Path(self.serverapp.runtime_dir) / KEY_FILE)
        key = load_or_create_key(path, self.log)
        routes = url_path_join(self.serverapp.base_url, "mlx/v1/")
        self.log.info("mlx: API key for %s (OpenAI / Anthropic clients; nothing else of Jupyter): %s  (kept in %s)",
                      routes, key, path)
        return key

    async def _start_jupyter_server_extension(self, serverapp):
        """Now the server listens: the kernels' URL is its own port, or a loopback port of the
        mlx routes when its own is TLS or a unix socket (kernel_env.py)."""
        if self.registry.entries and self.sweeper is None:
            from tornado.ioloop import PeriodicCallback

            self.sweeper_busy = False
            self.sweeper = PeriodicCallback(self._sweep, 1000 * min(5.0, max(0.5, self.keep_alive_s / 4)))
            self.sweeper.start()
        url = direct_url(serverapp)
        if url is None:
            routes = [(url_path_join(serverapp.base_url, pattern), handler, {"name": self.name})
                      for pattern, handler in ROUTES]
            url = self.kernel_port.start(serverapp, routes)
        self.kernel_env.publish(url, self.keys.kernel_key)
        self.log.info("mlx: serving %s; kernels reach it at %s", self.backend_url or self.model, url)
        await asyncio.to_thread(self.training.resume_unfinished)  # and fine-tunes; finished ones' adapters served
        resumed = await asyncio.to_thread(self.jobs.resume_unfinished)  # jobs a stopped server left running
        if resumed:
            self.log.info("mlx: resumed %d unfinished job(s): %s", len(resumed), ", ".join(resumed))

    def start_engine(self):
        """Create the Engine (it loads in the background) unless it exists; returns it. Called from the
        event loop and from the job runner's threads (a batch's first rows, all at once): one Engine."""
        with self.engine_lock:
            if self.engine is None:
                from mlx_nb.engine import Engine

                self.engine = Engine(self.model, wait=False, **self.engine_options(self.model))
                self.registry.pin(self.model, self.engine)
            return self.engine

    def start_embedder(self):
        """The default embedder (engine/embedding), created and loaded on first use; returns it ready.
        Blocks while it loads: called from a thread."""
        from mlx_nb.engine import Embedder

        with self.engine_lock:
            if self.embedder is None or self.embedder.closed:
                self.embedder = Embedder()
            embedder = self.embedder
        return embedder.wait_ready()

    def embedder_named(self, model: Optional[str]):
        """The ready embedder a request or a batch's line names (None: the default); LookupError, before
        anything loads, for one this server has not."""
        if model not in (None, "", *self.embedding_model_names()):
            raise LookupError(f"no embedding model {model!r} here: {', '.join(self.embedding_model_names())}")
        return self.start_embedder()

    def embedding_model_names(self) -> list[str]:
        from mlx_nb.engine import DEFAULT_EMBEDDER

        return [DEFAULT_EMBEDDER]

    def _registry(self):
        """The models besides the default one that requests may name (mlx_nb/registry.py)."""
        from mlx_nb.engine import default_prefix_budget
        from mlx_nb.registry import ModelRegistry, adapters_from, entries_from

        def make_engine(source: str):
            from mlx_nb.engine import Engine

            names = [source, *(n for n, s in entries.items() if s == source)]
            return Engine(source, wait=False, **self.engine_options(*names))

        def prefix_bytes(engine) -> int:
            held = engine.prefix_budget_bytes if engine is not None else None
            if held is not None:
                return held
            if not self.prefix_cache:
                return 0
            return default_prefix_budget() if self.prefix_cache_bytes is None else self.prefix_cache_bytes

        entries = {k: v for k, v in entries_from(list(self.models)).items() if k != self.model}
        drafts = {k: self.engine_options(k, v)["draft_model"] for k, v in entries.items()}
        return ModelRegistry(entries, make_engine, self._memory_budget(), self.keep_alive_s, prefix_bytes,
                             adapters=adapters_from([*self.adapters, *self.models]),
                             drafts={k: d for k, d in drafts.items() if d})

    def _jobs(self):
        """The dataset jobs and Batch API of this server (mlx_nb/jobs): rows run on the engine the line's
        model names, in its background lane."""
        from mlx_nb.jobs.manager import JobManager
        from mlx_nb.jobs.rows import LocalTarget
        from mlx_nb.jobs.store import Store

        def engine_for(model: Optional[str]):
            from mlx_nb.registry import split_adapter

            base, adapter = split_adapter(model)
            engine = self.registry.engine_for(base) if self.registered(base) else self.start_engine()
            if adapter is None:
                return engine, base if self.registered(base) else self.model
            if adapter not in self.registry.adapters:  # the row's error, as the chat route's 404 says
                raise LookupError(f"no adapter {adapter!r} is registered (MLXExtension.adapters): "
                                  f"{', '.join(self.registry.adapters) or 'none'}")
            engine.wait_ready()
            self.registry.adapter_on(engine, adapter)
            return engine, model, adapter

        if self.backend_url:  # the rows go to the backend, as this server's chat requests do
            from jupyter_ext.remote import RemoteTarget

            target = RemoteTarget(self.backend_url, self.backend_api_key, self.backend_model, self.server_defaults)
        else:
            target = LocalTarget(engine_for, self.server_defaults, self.embedder_named)
        store = Store(self.jobs_dir or None, disk_bytes=self.jobs_disk_bytes, ttl_s=self.job_ttl_s)
        return JobManager(store, target, source="job: batch")

    def _training(self):
        """The fine-tunes of this server (mlx_nb/training): kept beside the jobs; each checkpoint and
        adapter is registered as it appears (`model@name:step-N`, `model@name`), served per request
        on any engine of its base model; the worker pauses while an engine answers a chat."""
        from mlx_nb.training.manager import TrainManager

        def busy() -> bool:
            engines = [e for _, e in self.loaded_engines()] + ([self.engine] if self.engine is not None else [])
            return any(e.ready and not e.closed and e.interactive_requests() for e in engines)

        def serve(name: str, folder: str, base: str) -> None:
            """Served on its own base model only, if this server serves that model (a data home may
            hold fine-tunes of other models). A new dict, not an insert: handlers iterate the old one."""
            if base != self.model and self.registry.entry(base) is None:
                return
            self.trained = {**self.trained, name: base}
            self.registry.adapters = {**self.registry.adapters, name: folder}

        return TrainManager(self.jobs_dir or None, serve=serve, busy=busy, threads=self.training_threads,
                            name_taken=lambda name: name in self.registry.adapters)

    def _memory_budget(self) -> int:
        from mlx_nb.engine import physical_memory

        return self.memory_budget if self.memory_budget is not None else physical_memory() * 3 // 4

    def loaded_engines(self) -> list[tuple[str, Any]]:
        """(name, engine) of every loaded model, the default one first."""
        with self.registry.lock:
            return [(e.name, e.engine) for e in self.registry.entries.values()
                    if e.engine is not None and e.engine.ready]

    def registered(self, name: Optional[str]) -> bool:
        """Whether `name` is one of the other registered models (not the default one, not an alias)."""
        entry = self.registry.entry(name) if name and name != self.model else None
        return entry is not None and not entry.pinned

    async def _sweep(self) -> None:
        if self.sweeper_busy:
            return
        self.sweeper_busy = True
        try:
            for name in await asyncio.to_thread(self.registry.sweep):
                self.log.info("mlx: unloaded %s (idle for %.0f s)", name, self.keep_alive_s)
        except Exception:
            self.log.exception("mlx: unloading idle models failed")
        finally:
            self.sweeper_busy = False

    def server_defaults(self, engine=None):
        """What the routes fill in for fields a request leaves out (the model's own sampling
        recommendation first, once `engine` has loaded it), and the model names they accept."""
        from mlx_nb.api import ServerDefaults

        loaded = engine.loaded if engine is not None else None
        return ServerDefaults(
            max_tokens=self.default_max_tokens,
            max_tokens_cap=self.max_tokens_cap,
            temperature=self.default_temperature,
            sampling=dict(loaded.sampling.get("values", {})) if loaded is not None else {},
            aliases={k: self.model if v in ("", None) else v for k, v in self.model_aliases.items()},
            any_model=self.accept_any_model,
        )

    def model_names(self) -> list[str]:
        """The served model, then the aliases that name it, then the other registered models, then the
        default model with each registered adapter (what `models` lists)."""
        names = [self.model] + [a for a, t in self.server_defaults().aliases.items() if t == self.model]
        names += [n for n in self.registry.names() if n not in names]
        # configured adapters on the default model (a request may name them on any model above);
        # fine-tunes on the model they were trained on
        return names + [f"{self.trained.get(a, self.model)}@{a}" for a in self.registry.adapters]

    @validate("kv_bits", "kv_group_size", "model_kv_bits")
    def _valid_kv(self, proposal):
        from mlx_nb.engine import KVQuantization

        value, name = proposal["value"], proposal["trait"].name
        settings = {"kv_bits": lambda: [(value, self.kv_group_size)], "kv_group_size": lambda: [(8, value)],
                    "model_kv_bits": lambda: [(b, self.kv_group_size) for b in value.values()]}[name]()
        try:
            for bits, group in settings:
                KVQuantization.parse(bits, group)
        except ValueError as exc:
            raise TraitError(f"MLXExtension.{name}: {exc}") from None
        return value

    def engine_options(self, *names: str) -> dict:
        """The Engine's keyword arguments, from this extension's config; `names` (a model's name and
        source) pick its own entries of model_kv_bits and draft_models."""
        kv_bits, draft = self.kv_bits, None
        for name in names:
            kv_bits = self.model_kv_bits.get(name, kv_bits)
            draft = self.draft_models.get(name, draft)
        return engine_kwargs(
            self,
            draft_model=draft,
            kv_bits=kv_bits or None,
            prefix_cache_dir=(self.prefix_cache_dir if self.prefix_cache_dir is not None else default_folder()) or None,
            image_roots=list(self.image_roots) or [self.serverapp.root_dir],
        )

    async def stop_extension(self):
        # An exception here would stop the server's shutdown: log and carry on instead.
        for queue in list(getattr(self, "event_queues", ())):
            queue.put_nowait(None)
        if getattr(self, "sweeper", None) is not None:
            self.sweeper.stop()
        if getattr(self, "jobs", None) is not None:
            self.jobs.close()  # their unfinished rows resume at the next start
        if getattr(self, "training", None) is not None:
            await asyncio.to_thread(self.training.close)  # resumed from the last checkpoint at the next start
        engine, self.engine = getattr(self, "engine", None), None
        embedder, self.embedder = getattr(self, "embedder", None), None
        registry = getattr(self, "registry", None)
        remote, self.remote = getattr(self, "remote", None), None
        try:
            if registry is not None:
                await asyncio.to_thread(registry.close)
            if engine is not None:
                await asyncio.to_thread(engine.close)  # joins the engine thread: not on the loop
            if embedder is not None:
                await asyncio.to_thread(embedder.close)
            if remote is not None:
                await remote.close()
        except Exception:
            self.log.exception("mlx: closing the engine failed")
        if hasattr(self, "kernel_env"):
            self.kernel_env.restore()
            self.kernel_port.stop()


launch_instance = MLXExtension.launch_instance


def main(argv=None):
    """`jupyter mlx [options]` serves; `jupyter mlx batch -i IN.jsonl -o OUT.jsonl` runs a batch file
    offline (jupyter_ext/batch_cli.py)."""
    import sys

    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["batch"]:
        from jupyter_ext.batch_cli import BatchApp

        return BatchApp.launch_instance(args[1:])
    return launch_instance(args)
