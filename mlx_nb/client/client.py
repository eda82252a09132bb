"""Client: one chat API over an in-process Engine or any OpenAI-compatible URL.

Magics and widgets only talk to this, so they behave the same in a kernel under the Jupyter server
(the extension sets MLX_NB_URL / MLX_NB_TOKEN: one engine shared by every notebook) and in terminal
IPython, nbval or scripts (no URL: one embedded engine per model name, shared process-wide).
A stream starts its request when created, so bad input fails before anything is displayed.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from mlx_nb.client import backends
from mlx_nb.client.backends import _Embedded, _Remote
from mlx_nb.client.content import build_messages, request_source, response_format_of
from mlx_nb.client.streams import (
    AsyncChatStream,
    ChatReply,
    ChatStream,
    ClientError,
    _Stream,
)
from mlx_nb.client.waiting import DEFAULT_LOAD_TIMEOUT_S, LoadWait, Progress, wait_embedded

if TYPE_CHECKING:
    import numpy as np

STATUS_POLL_S = 1.0  # how often wait_ready asks a server whether its model has loaded


class Client:
    """`Client()` -> the server's engine if MLX_NB_URL is set, else an embedded one in this process."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, model: Optional[str] = None,
                 *, embedded: bool = False, engine: Any = None, load_timeout: float = DEFAULT_LOAD_TIMEOUT_S):
        """`embedded=True` ignores MLX_NB_URL; `engine=` talks to that Engine (e.g. one a tutorial made).

        A request to a model that is still loading waits for it (up to `load_timeout` s), reporting
        the load's progress to the call's `progress(status)` (default: a line on stderr per phase)."""
        if url is None and not embedded and engine is None:
            url = os.environ.get("MLX_NB_URL") or None
            api_key = api_key or os.environ.get("MLX_NB_TOKEN")
        self._backend = _Remote(url.rstrip("/"), api_key) if url else _Embedded(engine)
        self.model = model
        self.load_timeout = load_timeout
        self._live: dict[str, _Stream] = {}

    @property
    def backend(self) -> str:
        """'embedded', or the base URL of the OpenAI-compatible server."""
        return self._backend.name

    @property
    def embedded(self) -> bool:
        return isinstance(self._backend, _Embedded)

    def model_name(self, model: Optional[str] = None) -> str:
        return model or self.model or self._backend.default_model()

    @property
    def engine(self):
        """The embedded Engine behind this client (started on first use)."""
        if not self.embedded:
            raise ClientError(f"this client talks to {self.backend}, not to an in-process engine")
        return self._backend.engine(self.model_name())

    def load(self, model: Optional[str] = None, progress: Optional[Progress] = None) -> "Client":
        """Make `model` this client's default and wait until it has loaded (a bad name raises; the
        old model stays). Over HTTP the server serves what it serves: `model` must be one of them."""
        model = model or self.model
        if not self.embedded:
            served = self.models()
            if model is not None and model not in served:
                raise ClientError(f"{self.backend} serves {', '.join(served) or 'no model'}, not {model}: "
                                  "pick one of those, or start the server with --MLXExtension.model=...")
            if model is not None and self.model_states().get(model) not in (None, "loaded"):
                self._load_registered(model, self._wait(progress))  # one of the server's other models
                self.model = model
                return self
        self.wait_ready(progress=progress, model=model)
        self.model = model
        return self

    def _load_registered(self, model: str, wait: LoadWait) -> None:
        """Ask the server to load one of its registered models, and wait until it has."""
        card = self._backend.send("POST", f"models/{model}", timeout=60.0)
        while card.get("state") == "loading":
            wait.round({"model": model, "load": card.get("load") or {}})
            time.sleep(STATUS_POLL_S)
            card = self._card(model)
        if card.get("state") != "loaded":
            raise ClientError(f"{model} did not load on {self.backend}: {card.get('error') or card.get('state')}")
        wait.finish()

    def _card(self, model: str) -> dict:
        return next((c for c in self._cards() if c.get("id") == model), {"state": "missing"})

    def _cards(self) -> list[dict]:
        """The server's `models` list, each model's card."""
        return [c for c in self._backend.get("models").get("data", []) if isinstance(c, dict)]

    def unload(self, model: str) -> dict:
        """Unload `model`: a server's registered model (not its default one), or an embedded shared
        engine of this process. What the backend says it did."""
        if not self.embedded:
            return self._backend.send("DELETE", f"models/{model}", timeout=60.0)
        from mlx_nb.registry import split_adapter

        if "@" in model:  # an adapter: taken off its model's engine
            engine, name = self._backend.engine(model), backends.adapter_name(split_adapter(model)[1])
            loaded = engine.ready and name in {a["name"] for a in engine.adapters()}
            if loaded:
                engine.unload_adapter(name)
            return {"id": model, "unloaded_now": loaded, "state": "available"}
        engine = backends._ENGINES.pop(model, None)
        if engine is not None:
            engine.close()
        return {"id": model, "unloaded_now": engine is not None, "state": "available"}

    def wait_ready(self, timeout: Optional[float] = None, progress: Optional[Progress] = None,
                   model: Optional[str] = None) -> "Client":
        """Block until the model has loaded, calling `progress(status)` meanwhile; a failed load raises."""
        wait = LoadWait(progress, self.load_timeout if timeout is None else timeout)
        if self.embedded:
            engine = self._backend.engine(self.model_name(model))
            wait_embedded(engine, wait)
            self._backend.adapter(engine, self.model_name(model))  # `base@folder`: read it now
            return self
        while True:
            status = self.status()
            if status.get("ready"):
                wait.finish()
                return self
            wait.round(status)
            time.sleep(STATUS_POLL_S)

    def _wait(self, progress: Optional[Progress]) -> LoadWait:
        return LoadWait(progress, self.load_timeout)

    # -- chat ---------------------------------------------------------------------------------
    @staticmethod
    def _params(max_tokens, temperature, top_p, stop, seed, response_format=None, thinking=None,
                reasoning_budget=None) -> dict:
        out = dict(max_tokens=max_tokens, temperature=temperature, top_p=1.0 if top_p is None else top_p,
                   stop=stop, seed=seed, source=request_source())
        fmt = response_format_of(response_format)
        if fmt is not None:
            out["response_format"] = fmt
        if thinking is not None:  # a thinking model's template switch (Qwen3's enable_thinking)
            out["chat_template_kwargs"] = {"enable_thinking": bool(thinking)}
        if reasoning_budget is not None:
            out["reasoning_budget"] = reasoning_budget
        return out

    def stream(self, messages_or_text: Any, *, system: Optional[str] = None, images: Any = None,
               max_tokens: int = 256, temperature: float = 0.0, top_p: Optional[float] = None,
               stop: Any = None, seed: Optional[int] = None, model: Optional[str] = None,
               progress: Optional[Progress] = None, response_format: Any = None, thinking: Optional[bool] = None,
               reasoning_budget: Optional[int] = None) -> ChatStream:
        """Start a request (waiting for a loading model first); iterate the ChatStream for text chunks.
        `response_format` (a pydantic model class, a JSON schema dict, or OpenAI's response_format)
        holds the answer to that schema token by token. A thinking model's reasoning streams apart
        (`stream.reasoning`, `reply.reasoning`); `thinking=False` asks its template for none and
        `reasoning_budget` closes it after that many tokens."""
        messages = build_messages(messages_or_text, system, images)
        params = self._params(max_tokens, temperature, top_p, stop, seed, response_format, thinking, reasoning_budget)
        wait = self._wait(progress)
        return ChatStream(self, self.model_name(model), lambda st: self._backend.open(st, messages, params, wait))

    def chat(self, messages_or_text: Any, *, system: Optional[str] = None, images: Any = None,
             max_tokens: int = 256, temperature: float = 0.0, top_p: Optional[float] = None, stop: Any = None,
             seed: Optional[int] = None, stream: bool = False, model: Optional[str] = None,
             progress: Optional[Progress] = None, response_format: Any = None, thinking: Optional[bool] = None,
             reasoning_budget: Optional[int] = None):
        """The whole ChatReply (`.text`, and a thinking model's `.reasoning`), or with stream=True a
        ChatStream of text chunks."""
        st = self.stream(messages_or_text, system=system, images=images, max_tokens=max_tokens,
                         temperature=temperature, top_p=top_p, stop=stop, seed=seed, model=model, progress=progress,
                         response_format=response_format, thinking=thinking, reasoning_budget=reasoning_budget)
        if stream:
            return st
        for _ in st:
            pass
        return st.reply

    def astream(self, messages_or_text: Any, *, system: Optional[str] = None, images: Any = None,
                max_tokens: int = 256, temperature: float = 0.0, top_p: Optional[float] = None,
                stop: Any = None, seed: Optional[int] = None, model: Optional[str] = None,
                progress: Optional[Progress] = None, response_format: Any = None, thinking: Optional[bool] = None,
                reasoning_budget: Optional[int] = None) -> AsyncChatStream:
        """`async for chunk in client.astream(...)`: never blocks the event loop."""
        messages = build_messages(messages_or_text, system, images)
        params = self._params(max_tokens, temperature, top_p, stop, seed, response_format, thinking, reasoning_budget)
        wait = self._wait(progress)
        # the model may be resolved later, in aopen: asking a server for its models must not block the loop
        return AsyncChatStream(self, model or self.model, lambda st: self._backend.aopen(st, messages, params, wait))

    async def achat(self, messages_or_text: Any, *, system: Optional[str] = None, images: Any = None,
                    max_tokens: int = 256, temperature: float = 0.0, top_p: Optional[float] = None,
                    stop: Any = None, seed: Optional[int] = None, model: Optional[str] = None,
                    progress: Optional[Progress] = None, response_format: Any = None,
                    thinking: Optional[bool] = None, reasoning_budget: Optional[int] = None) -> ChatReply:
        """Awaitable chat; several at once (asyncio.gather) share the engine's batch."""
        st = self.astream(messages_or_text, system=system, images=images, max_tokens=max_tokens,
                          temperature=temperature, top_p=top_p, stop=stop, seed=seed, model=model,
                          progress=progress, response_format=response_format, thinking=thinking,
                          reasoning_budget=reasoning_budget)
        async for _ in st:
            pass
        return st.reply

    def abort(self, request_id: str) -> None:
        """Stop a running request by id (embedded: the engine drops it; URL: the stream is closed)."""
        st = self._live.get(request_id)
        if st is not None:
            st.abort()
        elif self.embedded:
            for eng in [self._backend.fixed, *backends._ENGINES.values()]:
                if eng is not None:
                    eng.abort(request_id)

    # -- jobs ---------------------------------------------------------------------------------
    def _jobs(self):
        from mlx_nb.client.jobs import EmbeddedJobs, RemoteJobs

        return EmbeddedJobs(self._backend.fixed) if self.embedded else RemoteJobs(self.openai())

    def map(self, inputs: Any, prompt: Optional[str] = None, *, system: Optional[str] = None,
            model: Optional[str] = None, schema: Any = None, max_tokens: int = 256, temperature: float = 0.0,
            top_p: Optional[float] = None, seed: Optional[int] = None, stop: Any = None, out: str = "answer",
            wait: bool = True, progress: Any = True):
        """The same question over every row of `inputs` (strings, dicts, a pandas Series or DataFrame), as a
        job whose rows fill the engine's batch beside interactive chats (mlx_nb/jobs).

        `prompt` is a template naming the row's fields (`"Classify: {text}"`; a string row is `{text}`);
        `schema` (JSON schema, pydantic model or dataclass) holds each answer to it. Returns the answers
        aligned with the rows: a list (None where a row failed, `.errors` saying why), or the DataFrame with
        the answer's columns (the schema's fields, else `out`), `error` and token counts. The job is kept on
        disk (embedded) or in the server: asked again after a restart, it resumes where it stopped.
        `wait=False` returns the Job at once (`job.wait()`, `job.result()`, `job.cancel()`)."""
        from mlx_nb.client.jobs import start_map

        job = start_map(self._jobs(), inputs, prompt, self.model_name(model), system=system, schema=schema,
                        max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop, out=out)
        if not wait:
            return job
        return job.wait(progress=progress).result()

    async def amap(self, inputs: Any, prompt: Optional[str] = None, **kwargs: Any):
        """`await client.amap(...)`: `map` without blocking the event loop."""
        import asyncio

        progress = kwargs.pop("progress", True)
        job = await asyncio.to_thread(self.map, inputs, prompt, wait=False, **kwargs)
        await asyncio.to_thread(job.wait, None, progress)
        return await asyncio.to_thread(job.result)

    def job(self, job_id: str, inputs: Any = None, schema: Any = None):
        """A job by id (from `jobs()`, or another notebook); `inputs` and `schema` shape its result as map does."""
        from mlx_nb.client.jobs import Job

        job = Job(self._jobs(), job_id, inputs, schema)
        try:
            job.status()
        except KeyError:
            raise ClientError(f"no job {job_id!r}: client.jobs() lists them") from None
        return job

    def jobs(self) -> list[dict]:
        """Every job the backend keeps (the newest first): id, status, request_counts, progress."""
        return self._jobs().list()

    # -- fine-tuning --------------------------------------------------------------------------
    def train(self, data: Any, *, name: str, base: Optional[str] = None, val: Any = None, wait: bool = True,
              progress: Any = True, **settings: Any):
        """Fine-tune a LoRA adapter on `data` (conversations, prompt/completion or text rows: a list, a
        pandas DataFrame or a JSONL path) and serve it as `base@name` beside the base model, in the
        same batch, without a reload; checkpoints are served as `base@name:step-N` as they appear.
        Settings: rank, scale, num_layers, iters, learning_rate, batch_size, mask_prompt (True),
        max_seq_length, truncate, steps_per_save, seed (mlx_nb/training/settings.py). `val` is the
        validation rows (default: a tenth of `data`). Runs in a worker process of this kernel (of the
        server, for a client of one), paused while a chat is answered; kept on disk and resumed from
        its last checkpoint after a restart.
        Returns the TrainJob (after it ends, unless `wait=False`)."""
        from mlx_nb.client.training import start_training

        job = start_training(data, base or self.model_name(), name, val, settings,
                             backend=None if self.embedded else self._backend)
        if wait:
            job.wait(progress=progress)
        return job

    def training_jobs(self) -> list[dict]:
        """Every fine-tune this data home keeps (the newest first), with its losses and adapters."""
        from mlx_nb.client.training import RemoteTraining, local_manager

        return (local_manager() if self.embedded else RemoteTraining(self._backend)).list()

    def compare(self, prompts: Any, models: list, *, max_tokens: int = 128, temperature: float = 0.0, **params: Any):
        """Each prompt asked of each model at once, answers side by side: a pandas DataFrame (one column
        per model) when pandas is installed, else a list of dicts. `models` may name adapters
        (`base@name`), which share the base model's batch."""
        from mlx_nb.client.training import compare

        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        rows = compare(self, prompts, list(models), {"max_tokens": max_tokens, "temperature": temperature, **params})
        try:
            import pandas
        except ImportError:
            return rows
        return pandas.DataFrame(rows)

    # -- introspection ------------------------------------------------------------------------
    # -- embeddings --------------------------------------------------------------------------
    def embed(self, texts: Any, *, model: Optional[str] = None, truncate: bool = False) -> "np.ndarray":
        """One vector per text (a string, a list or a pandas Series of them, or token-id lists), as a
        float32 array (texts x dimensions), rows in order; unit length where the model normalizes
        (all-MiniLM-L6-v2, the default, does). A text longer than the model reads is an error naming
        it, unless `truncate` cuts it. Embedded: this process's embedder; else the server's route."""
        from mlx_nb.client.embeddings import as_inputs, embed_remote, shared_embedder

        inputs = as_inputs(texts)
        if not self.embedded:
            return embed_remote(self._backend.sync, inputs, model, truncate)
        return shared_embedder(model).embed(inputs, truncate=truncate).vectors

    def status(self) -> dict:
        return self.engine.status() if self.embedded else self._backend.get("status")

    def cache_layout(self, request_id: Optional[str] = None) -> dict:
        """A live request's KV cache layer by layer (or a fresh cache's); an unknown id raises ClientError."""
        if not self.embedded:
            return self._backend.get("cache", request_id=request_id)
        try:
            return self.engine.cache_layout(request_id)
        except KeyError as exc:
            raise ClientError(exc.args[0]) from None

    def prefix_cache(self, action: str, disk: bool = False) -> dict:
        """"save" (write what memory holds to disk now), "load" (read the disk's entries into memory)
        or "clear" (empty memory; with `disk`, the files too): what the engine answers."""
        if action not in ("save", "load", "clear"):
            raise ClientError(f"prefix cache action must be save, load or clear, not {action!r}")
        if not self.embedded:
            if action == "clear":
                return self._backend.send("DELETE", "cache", disk=int(disk))
            return self._backend.send("POST", "cache", timeout=120.0, action=action)
        engine = self.engine
        try:
            if action == "clear":
                return engine.clear_prefix_cache(disk=disk)
            return engine.save_prefix_cache() if action == "save" else engine.load_prefix_cache()
        except ValueError as exc:
            raise ClientError(str(exc)) from None

    def events(self, since: int = 0) -> list[dict]:
        if self.embedded:
            return self.engine.events(since)
        body = self._backend.get("events", since=since, stream=0)
        return body.get("events", body.get("data", [])) if isinstance(body, dict) else body

    def subscribe(self, callback: Callable[[dict], None], since: int = 0,
                  on_state: Optional[Callable[[str], None]] = None) -> Callable[[], None]:
        """`callback(event_dict)` for each new BatchEvent; returns the unsubscribe function.

        Embedded: called on the engine thread, from now on (keep it quick). Over HTTP: called on a
        reader thread of the `events` SSE route, for every event after `since`; `on_state(message)`
        hears of connection trouble ("" once connected), retried with backoff, or final (401/404)."""
        if not self.embedded:
            return self._backend.subscribe(callback, since, on_state)
        return self.engine.subscribe(lambda event: callback(event.to_dict()))

    def models(self) -> list[str]:
        """What this client can chat with: the server's models, the engine it is bound to, or
        (shared embedded engines) every model available offline plus any already running."""
        if not self.embedded:
            return self._backend.models()
        if self._backend.fixed is not None:
            return [self._backend.fixed.model_name]
        from mlx_nb.models.sources import available_offline

        names = available_offline()
        return names + [n for n in list(backends._ENGINES) if n not in names]

    def model_states(self) -> dict[str, str]:
        """Each model's state where the backend says: a server's registry ("available", "loading",
        "loaded", "failed"), or (embedded) the shared engines running in this process."""
        if not self.embedded:
            return {c["id"]: c["state"] for c in self._cards() if c.get("state")}
        engines = [self._backend.fixed] if self._backend.fixed is not None else list(backends._ENGINES.values())
        return {e.model_name: ("failed" if e.load_error else "loaded" if e.ready else "loading")
                for e in engines if not e.closed}

    def openai(self):
        """An `openai.OpenAI` for the same server (there is none for the embedded backend)."""
        if self.embedded:
            raise ClientError(
                "no server to connect to: start `jupyter lab` (the extension is jupyter_ext), or set MLX_NB_URL "
                "(and MLX_NB_TOKEN) to an OpenAI-compatible URL"
            )
        import openai

        return openai.OpenAI(base_url=self._backend.url, api_key=self._backend.api_key or "none")

    def __repr__(self) -> str:
        return f"Client({self.backend!r}, model={self.model_name() if self.embedded else self.model!r})"


def openai_client(url: Optional[str] = None, api_key: Optional[str] = None):
    """A configured `openai.OpenAI` for MLX_NB_URL (or `url`)."""
    return Client(url, api_key).openai()
