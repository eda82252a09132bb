"""Fine-tunes from a Client: `client.train(...)` returns a TrainJob; `client.compare(...)` puts
the base model's answers beside the adapter's.

Embedded (no server), the fine-tunes of this process run through one TrainManager whose jobs live
under the data home, so a restarted kernel finds its adapters (and resumes an unfinished job) the
first time it names one. Its checkpoints and adapter are loaded into the shared engine on first use
(`base@name`, `base@name:step-N`), beside the base model's rows in the same batch; the worker pauses
whenever one of this process's engines has a chat to answer.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Optional

from mlx_nb.client.streams import ClientError

_MANAGER = None
_MANAGER_LOCK = threading.Lock()


def _busy() -> bool:
    from mlx_nb.client import backends

    return any(e.interactive_requests() for e in list(backends._ENGINES.values()) if not e.closed and e.ready)


def local_manager():
    """This process's TrainManager (started on first use; it resumes what a dead process left)."""
    global _MANAGER
    with _MANAGER_LOCK:
        if _MANAGER is None or _MANAGER.closed:
            from mlx_nb.training.manager import TrainManager

            _MANAGER = TrainManager(busy=_busy)
            _MANAGER.resume_unfinished()
        return _MANAGER


def close_manager() -> None:
    """Stop this process's fine-tunes (they stay on disk and resume at the next use) (tests)."""
    global _MANAGER
    with _MANAGER_LOCK:
        manager, _MANAGER = _MANAGER, None
    if manager is not None:
        manager.close()


def trained_adapter(name: str, base: str) -> Optional[str]:
    """The folder of the fine-tune checkpoint or adapter of `base` called `name`, if there is one."""
    manager = local_manager()
    return manager.adapters.get(name) if manager.bases.get(name) == base else None


class TrainJob:
    """One fine-tune: `.status()`, `.wait()`, `.losses()`, `.cancel()`; `.model` is what to chat with."""

    def __init__(self, manager, job_id: str):
        self.manager, self.id = manager, job_id  # a TrainManager, or RemoteTraining (a server's route)
        settings = manager.describe(job_id)["settings"]
        self.base, self.name = settings["base"], settings["name"]

    @property
    def model(self) -> str:
        """`base@name`: the adapter, served per request beside the base model."""
        return f"{self.base}@{self.name}"

    def status(self) -> dict:
        return self.manager.describe(self.id)

    def losses(self) -> list[dict]:
        """Every step's training loss and every validation loss so far, in order."""
        return [e for e in self.manager.events(self.id) if e.get("kind") in ("train", "val")]

    def checkpoints(self) -> list[str]:
        """The model names of its checkpoints and adapter (`base@name:step-N`, ..., `base@name`)."""
        return [f"{self.base}@{n}" for n in self.manager.served(self.id)]

    def cancel(self) -> dict:
        return self.manager.cancel(self.id)

    def export(self, path, *, fuse: bool = True, format: str = "safetensors", quantize: Optional[str] = None,
               dtype: Optional[str] = None) -> str:
        """The adapter taken elsewhere: `fuse=False` copies the adapter folder (mlx_lm's
        `load(base, adapter_path=...)` reads it); else the base with the adapter fused in, as an MLX
        folder (`format="safetensors"`, float32 or `dtype`) or a GGUF of a GGUF base (`format="gguf"`,
        `quantize` F32 (default), F16, Q8_0, Q4_0, or another type through llama.cpp's llama-quantize).
        Reads the adapter folder on this machine (a server's, for a client on the same machine)."""
        import shutil
        from pathlib import Path

        from mlx_nb.training.export import ExportError, export_folder, export_gguf

        adapter = self.manager.served(self.id).get(self.name)
        if adapter is None or not Path(adapter).is_dir():
            raise ClientError(f"fine-tune {self.name} has no adapter on this machine yet: wait for it to complete")
        try:
            if not fuse:
                if Path(path).expanduser().exists():
                    raise ExportError(f"{path} exists: pick a new path (an export never overwrites)")
                return shutil.copytree(adapter, Path(path).expanduser(), ignore=shutil.ignore_patterns("optimizer.*"))
            if format == "gguf":
                return str(export_gguf(self.base, Path(adapter), Path(path), quantize))
            if format != "safetensors":
                raise ExportError(f"format must be 'safetensors' or 'gguf', not {format!r}")
            return str(export_folder(self.base, Path(adapter), Path(path), dtype))
        except ExportError as exc:
            raise ClientError(str(exc)) from None

    def wait(self, timeout: Optional[float] = None, progress: Any = True) -> dict:
        """Block until it ends (a progress line on stderr unless `progress=False`); its final status.
        A failed fine-tune raises ClientError with its error."""
        show = _progress(progress, self)
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.status()
            show(info)
            if info["status"] not in ("queued", "running", "cancelling"):
                show(info, final=True)
                if info["status"] == "failed":
                    raise ClientError(f"fine-tune {self.name} failed: {info.get('error')}")
                return info
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"fine-tune {self.name} is at step {info.get('step', 0)} of {info['total_steps']}")
            time.sleep(0.5)

    def __repr__(self) -> str:
        info = self.status()
        return f"<TrainJob {self.id} {self.model}: {info['status']}, step {info.get('step', 0)}/{info['total_steps']}>"


def _progress(progress: Any, job: TrainJob):
    if progress is False or progress is None:
        return lambda info, final=False: None
    if callable(progress):
        return lambda info, final=False: progress(info)
    from mlx_nb.client.job_progress import _in_kernel

    if _in_kernel():
        return _panel(job)
    state = {"last": 0.0}

    def line(info: dict, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - state["last"] < 5:
            return
        state["last"] = now
        parts = [f"fine-tune {job.name}: {info['status']}", f"step {info.get('step', 0)}/{info['total_steps']}"]
        for key, label in (("train_loss", "loss"), ("val_loss", "val")):
            if info.get(key) is not None:
                parts.append(f"{label} {info[key]:.3f}")
        if info.get("tokens_per_second"):
            parts.append(f"{info['tokens_per_second']:.0f} tok/s")
        if info.get("eta_s") is not None and not final:
            parts.append(f"ETA {info['eta_s']:.0f} s")
        print("  ".join(parts), file=sys.stderr, flush=True)

    return line


class RemoteTraining:
    """A server's fine-tunes, read through its `/fine_tuning/jobs` route as TrainJob reads a manager."""

    def __init__(self, backend):
        self.backend = backend

    def describe(self, job_id: str) -> dict:
        info = self.backend.get(f"fine_tuning/jobs/{job_id}")
        return {**info, "status": info.get("mlx_status", info["status"])}

    def events(self, job_id: str) -> list[dict]:
        return [e["data"] for e in reversed(self.backend.get(f"fine_tuning/jobs/{job_id}/events")["data"])]

    def served(self, job_id: str) -> dict:
        return {c["id"]: c.get("folder") for c in reversed(self.backend.get(f"fine_tuning/jobs/{job_id}/checkpoints")
                                                           ["data"])}

    def cancel(self, job_id: str) -> dict:
        self.backend.send("POST", f"fine_tuning/jobs/{job_id}/cancel")
        return self.describe(job_id)

    def list(self) -> list[dict]:
        return [{**j, "status": j.get("mlx_status", j["status"])} for j in self.backend.get("fine_tuning/jobs")["data"]]

    def create(self, data: Any, base: str, name: str, val: Any, settings: dict) -> str:
        """Upload the rows (normalized here: a DataFrame or a list never leaves as pickles) and create the job."""
        import json

        import openai

        from mlx_nb.training.data import TrainingDataError, rows_of

        def upload(rows: Any, what: str) -> Optional[str]:
            if rows is None:
                return None
            _, normalized, _ = rows_of(rows, what)
            body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in normalized).encode()
            return self.backend.sync.files.create(file=(f"{name}-{what}.jsonl", body), purpose="fine-tune").id

        try:
            train_file, val_file = upload(data, "data"), upload(val, "val")
            job = self.backend.sync.fine_tuning.jobs.create(
                model=base, suffix=name, training_file=train_file,
                extra_body={"settings": settings, **({"validation_file": val_file} if val_file else {})})
        except TrainingDataError as exc:
            raise ClientError(str(exc)) from None
        except openai.APIStatusError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            raise ClientError((body.get("error") or body).get("message") or str(exc)) from None
        return job.id


def _panel(job: TrainJob):
    """A TrainPanel while it trains, replaced by its static picture when it ends (what a saved notebook keeps)."""
    from IPython.display import HTML, display

    from mlx_nb.pictures.theme import static_html
    from mlx_nb.widgets.train_panel import TrainPanel

    panel = TrainPanel(job, follow=False)
    handle = display(panel, display_id=True)
    state = {"last": 0.0}

    def show(info: dict, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - state["last"] < 1.0:
            return
        state["last"] = now
        panel.draw(info, job.manager.events(job.id))
        if final:
            panel.close()
            if handle is not None:
                handle.update(HTML(static_html(panel.svg, panel.note.value, alt="fine-tune")))

    return show


def start_training(data: Any, base: str, name: str, val: Any, settings: dict, backend=None) -> TrainJob:
    """The fine-tune started on `backend`'s server (a remote client), else in this process."""
    from mlx_nb.training.manager import TrainingError

    if backend is not None:
        remote = RemoteTraining(backend)
        return TrainJob(remote, remote.create(data, base, name, val, settings))
    manager = local_manager()
    try:
        job_id = manager.create(data, base, name, val=val, **settings)
    except TrainingError as exc:
        raise ClientError(str(exc)) from None
    return TrainJob(manager, job_id)


def compare(client, prompts: list, models: list, params: dict) -> list[dict]:
    """Every prompt asked of every model at once (their rows share the batch): one row per prompt,
    one column per model. Threads, not asyncio: a notebook's cell already runs inside an event loop."""
    from concurrent.futures import ThreadPoolExecutor

    pairs = [(p, m) for p in prompts for m in models]
    with ThreadPoolExecutor(max_workers=min(32, len(pairs)) or 1) as pool:
        answers = list(pool.map(lambda pm: client.chat(pm[0], model=pm[1], **params).text, pairs))
    return [{"prompt": p, **{m: answers[i * len(models) + j] for j, m in enumerate(models)}}
            for i, p in enumerate(prompts)]
