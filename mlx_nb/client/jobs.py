"""Jobs from the Client: `Client.map` and the handle it returns, over either backend.

- Embedded (no server): one JobManager per process (mlx_nb/jobs) runs the rows on this process's
  shared engines and keeps them under the data home, so a restarted kernel that asks for the same
  map finds the job and runs only the rows it had not finished.
- A server (`MLX_NB_URL`, or any URL that speaks OpenAI's Batch API): the rows go up as a JSONL
  file and run as a batch there (`/v1/files`, `/v1/batches`); the job lives in the server, so a
  kernel restart loses nothing and another notebook can open it by id. A map asked for again finds
  its batch by the rows' fingerprint (kept in the batch's metadata).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Optional

from mlx_nb.client.streams import ClientError

POLL_S = 0.5  # how often a wait asks a server how the job is doing

_MANAGERS: dict = {}  # per engine a Client is bound to (None: the shared engines)
_MANAGERS_LOCK = threading.Lock()


def embedded_manager(fixed=None):
    """This process's JobManager for the shared embedded engines (or for one given Engine)."""
    from mlx_nb.client.embeddings import shared_embedder
    from mlx_nb.jobs.manager import JobManager
    from mlx_nb.jobs.rows import LocalTarget
    from mlx_nb.jobs.store import Store

    key = None if fixed is None else id(fixed)
    with _MANAGERS_LOCK:
        manager = _MANAGERS.get(key)
        if manager is None or (fixed is not None and manager.target.engine_for(None)[0] is not fixed):
            from mlx_nb.client.backends import shared_engine
            from mlx_nb.models.sources import DEFAULT_MODEL

            def engine_for(model: Optional[str]):
                if model and "@" in model:
                    raise LookupError(f"{model}: a LoRA adapter is served in jobs by a server (MLXExtension."
                                      "adapters); here, map with the base model or run the job on the server")
                if fixed is not None:
                    if model not in (None, fixed.model_name):
                        raise LookupError(f"this job's engine serves {fixed.model_name}, not {model}")
                    return fixed, fixed.model_name
                name = model or DEFAULT_MODEL
                return shared_engine(name), name

            target = LocalTarget(engine_for, embedder_for=shared_embedder)
            manager = _MANAGERS[key] = JobManager(Store(), target, source="job: notebook")
        return manager


class EmbeddedJobs:
    def __init__(self, fixed=None):
        self.manager = embedded_manager(fixed)

    def submit(self, rows: list[dict], metadata: dict) -> str:
        job_id = self.manager.create_rows("map", "/v1/chat/completions", rows, metadata)
        self.manager.start(job_id)
        return job_id

    def describe(self, job_id: str) -> dict:
        return self.manager.describe(job_id)

    def results(self, job_id: str) -> list[dict]:
        return self.manager.results(job_id)

    def cancel(self, job_id: str) -> dict:
        return self.manager.cancel(job_id)

    def resume(self, job_id: str) -> None:
        self.manager.start(job_id)

    def requests(self, job_id: str) -> list[dict]:
        return list(self.manager.store.job(job_id).inputs())

    def list(self) -> list[dict]:
        return self.manager.list(limit=100)


class RemoteJobs:
    """A server's Batch API through the openai SDK (`client` is an `openai.OpenAI`)."""

    def __init__(self, client):
        self.client = client

    def submit(self, rows: list[dict], metadata: dict) -> str:
        wanted = metadata.get("mlx_fingerprint")
        for batch in self.list():
            if (batch.get("metadata") or {}).get("mlx_fingerprint") == wanted and batch.get("status") not in (
                    "failed", "cancelled", "expired"):
                return batch["id"]
        data = "".join(json.dumps({"custom_id": r["custom_id"], "method": "POST", "url": r["url"], "body": r["body"]},
                                  ensure_ascii=False) + "\n" for r in rows).encode()
        upload = self.client.files.create(file=("map.jsonl", data), purpose="batch")
        batch = self.client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                           completion_window="24h", metadata=metadata)
        return batch.id

    def describe(self, job_id: str) -> dict:
        return self.client.batches.retrieve(job_id).to_dict()

    def results(self, job_id: str) -> list[dict]:
        batch = self.describe(job_id)
        lines = []
        for key in ("output_file_id", "error_file_id"):
            if batch.get(key):
                text = self.client.files.content(batch[key]).text
                lines += [json.loads(raw) for raw in text.splitlines() if raw.strip()]
        for line in lines:  # the Batch API matches rows by custom_id
            line["row"] = int(line["custom_id"]) if str(line.get("custom_id", "")).isdigit() else -1
        return lines

    def cancel(self, job_id: str) -> dict:
        return self.client.batches.cancel(job_id).to_dict()

    def resume(self, job_id: str) -> None:
        pass  # the server resumes its own jobs

    def requests(self, job_id: str) -> list[dict]:
        file_id = self.describe(job_id).get("input_file_id")
        text = self.client.files.content(file_id).text if file_id else ""
        return [json.loads(raw) for raw in text.splitlines() if raw.strip()]

    def list(self) -> list[dict]:
        return [b.to_dict() for b in self.client.batches.list(limit=100)]


class Job:
    """A map (or batch) job: `status()`, `wait()`, `result()`, `cancel()`; `Client.job(id)` finds it again."""

    def __init__(self, backend, job_id: str, inputs: Any = None, schema: Any = None, out: str = "answer"):
        self.backend = backend
        self.id = job_id
        self._inputs, self._schema, self._out = inputs, schema, out

    def status(self) -> dict:
        """The job's batch object: status, request_counts, and (while it runs) `progress`."""
        return self.backend.describe(self.id)

    def progress(self) -> dict:
        batch = self.status()
        return {"status": batch.get("status"), **(batch.get("progress") or {})}

    @property
    def finished(self) -> bool:
        return self.status().get("status") in ("completed", "failed", "cancelled", "expired")

    def wait(self, timeout: Optional[float] = None, progress: Any = True) -> "Job":
        """Block until the job ends, showing its progress (`progress=False`: quietly; a callable:
        called with each progress dict)."""
        from mlx_nb.client.job_progress import progress_display

        self.backend.resume(self.id)
        show = progress_display(progress, self)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                batch = self.status()
                show(batch)
                if batch.get("status") in ("completed", "failed", "cancelled", "expired"):
                    break
                if batch.get("status") in ("validating", "in_progress") and not batch.get("running_here", True):
                    self.backend.resume(self.id)  # the process that ran it is gone: take it up here
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.id} is still {batch.get('status')} after {timeout} s")
                time.sleep(POLL_S)
        except KeyboardInterrupt:  # an interrupted cell: the job goes on (job.cancel() stops it)
            show(self.status(), final=True)
            raise
        show(batch, final=True)
        if batch.get("status") == "failed":
            errors = ((batch.get("errors") or {}).get("data") or [{}])
            raise ClientError(f"job {self.id} failed: {errors[0].get('message', 'see its errors')}")
        return self

    def result(self):
        """The answers aligned with the inputs (a list, or the DataFrame with new columns); rows without
        a result yet are None with an error saying so."""
        from mlx_nb.jobs.tables import shape

        lines = self.backend.results(self.id)
        if self._inputs is None:
            return lines
        result = shape(self._inputs, lines, self._schema, self._out)
        if hasattr(result, "errors"):
            result.job_id = self.id
        return result

    def cancel(self) -> dict:
        return self.backend.cancel(self.id)

    def conversations(self) -> list[list[dict]]:
        """Each finished row as a conversation: its request's messages and the model's answer (rows that
        failed are left out): what `client.train` learns from when handed this job."""
        answers = {}
        for line in self.backend.results(self.id):
            body = ((line.get("response") or {}).get("body") or {}) if not line.get("error") else {}
            choices = body.get("choices") or []
            if choices and (choices[0].get("message") or {}).get("content"):
                answers[str(line.get("custom_id"))] = choices[0]["message"]["content"]
        out = []
        for request in self.backend.requests(self.id):
            answer = answers.get(str(request.get("custom_id")))
            messages = (request.get("body") or {}).get("messages")
            if answer is not None and messages:
                out.append([*messages, {"role": "assistant", "content": answer}])
        return out

    def __repr__(self) -> str:
        return f"Job({self.id!r})"


def start_map(backend, inputs: Any, prompt: Optional[str], model: str, **settings: Any) -> Job:
    """Render the rows, find or create their job, return its handle (running)."""
    from mlx_nb.jobs.manager import fingerprint
    from mlx_nb.jobs.tables import map_rows

    out = settings.pop("out", "answer")
    if not hasattr(inputs, "__len__"):  # a generator: read once, kept to shape the result
        inputs = list(inputs)
    rows = map_rows(inputs, prompt, model=model, **settings)
    if not rows:
        raise ClientError("nothing to map: the inputs have no rows")
    metadata = {"mlx_kind": "map", "mlx_fingerprint": fingerprint("map", "/v1/chat/completions", rows)}
    return Job(backend, backend.submit(rows, metadata), inputs, settings.get("schema"), out)


__all__ = ["EmbeddedJobs", "Job", "RemoteJobs", "start_map"]
