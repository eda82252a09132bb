"""JobManager: the jobs of one process (a Jupyter server, or a notebook's embedded engines).

It creates jobs in the store, runs them on a thread of its own (an asyncio loop that only awaits
the engines: MLX stays on each engine's thread), resumes the unfinished ones it finds (a server at
start, a notebook when the same map is asked for again), and answers for them in the Batch API's
shape. A job runs in one process at a time: the runner holds an advisory lock on the job's folder,
which the OS releases if that process dies, so a restarted server takes it up again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from concurrent.futures import Future
from typing import Any, Optional

from mlx_nb.jobs.lines import BatchInputError, endpoint_of, parse_input
from mlx_nb.jobs.runner import CANCEL_MARKER, JobRun
from mlx_nb.jobs.store import FINISHED, JobFolder, Store, new_id

WINDOWS = {"24h": 24 * 3600}
RETRY_S = 5.0  # a job stopped by something passing (its engine closed, its model busy) runs again after this


def fingerprint(kind: str, endpoint: str, rows: list[dict]) -> str:
    """Same kind, endpoint and rows -> same job: asking for it again resumes it instead of starting over."""
    digest = hashlib.sha256(json.dumps([kind, endpoint, rows], sort_keys=True, ensure_ascii=False).encode())
    return digest.hexdigest()


class JobLock:
    """An advisory lock on a job's folder, held while this process runs it."""

    def __init__(self, folder: JobFolder):
        self.path = folder.path / ".lock"
        self._f = None

    def acquire(self) -> bool:
        try:
            import fcntl
        except ImportError:  # no fcntl (Windows): one process is assumed
            return True
        f = open(self.path, "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return False
        self._f = f
        return True

    def release(self) -> None:
        if self._f is not None:
            self._f.close()  # closing the file drops the lock
            self._f = None


class JobManager:
    def __init__(self, store: Store, target, source: str = "job"):
        self.store = store
        self.target = target
        self.source = source
        self.runs: dict[str, JobRun] = {}
        self._locks: dict[str, JobLock] = {}  # held while a job runs here
        self._done: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None

    # -- the runners' thread -------------------------------------------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve():
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name="mlx-nb-jobs", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        """Stop running jobs here: their unfinished rows stay for the next process (or the next
        manager of this one) to resume. Not a cancel: their records still say in_progress."""
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        with self._lock:
            for lock in self._locks.values():
                lock.release()
            self._locks.clear()
            self.runs.clear()

    # -- creating ------------------------------------------------------------------------------
    def create_batch(self, input_file_id: str, endpoint: str, completion_window: str = "24h",
                     metadata: Optional[dict] = None) -> dict:
        """A Batch API job from an uploaded file; started at once. BatchInputError / KeyError say what is wrong."""
        url = endpoint_of(endpoint)
        if url is None:
            raise BatchInputError(f"endpoint {endpoint!r} cannot be batched: use one of /v1/chat/completions, "
                                  "/v1/completions")
        if not isinstance(completion_window, str) or completion_window not in WINDOWS:
            raise BatchInputError(f"completion_window must be one of {', '.join(WINDOWS)}, not {completion_window!r}")
        data = self.store.file_path(input_file_id).read_bytes()
        rows = parse_input(data, url)
        record = self._record("batch", url, rows, metadata, input_file_id=input_file_id,
                              completion_window=completion_window)
        self.store.create_job(record, rows)
        self.start(record["id"])
        return self.describe(record["id"])

    def create_rows(self, kind: str, endpoint: str, rows: list[dict], metadata: Optional[dict] = None,
                    reuse: bool = True) -> str:
        """A job over rows already in the runner's form (`{"row", "custom_id", "url", "body"}`); an
        unfinished or completed job of the same rows is found again instead (`reuse`). Not started."""
        fp = fingerprint(kind, endpoint, rows)
        if reuse:
            for folder in self.store.jobs():
                record = _read(folder)
                if record and record.get("fingerprint") == fp and record.get("status") not in ("failed", "cancelled",
                                                                                                "expired"):
                    return folder.id
        record = self._record(kind, endpoint, rows, metadata, fingerprint=fp)
        self.store.create_job(record, rows)
        return record["id"]

    def _record(self, kind: str, endpoint: str, rows: list[dict], metadata: Optional[dict], **more: Any) -> dict:
        now = int(time.time())
        return {"id": new_id("batch"), "object": "batch", "kind": kind, "endpoint": endpoint, "errors": None,
                "input_file_id": None, "completion_window": "24h", "status": "validating", "output_file_id": None,
                "error_file_id": None, "created_at": now, "in_progress_at": None,
                "expires_at": now + WINDOWS["24h"], "finalizing_at": None, "completed_at": None, "failed_at": None,
                "expired_at": None, "cancelling_at": None, "cancelled_at": None, "ended_at": None,
                "request_counts": {"total": len(rows), "completed": 0, "failed": 0},
                "metadata": dict(metadata or {}), "fingerprint": fingerprint(kind, endpoint, rows), **more}

    # -- running -------------------------------------------------------------------------------
    def start(self, job_id: str) -> bool:
        """Run the job here unless it has ended or runs already (here or in another process)."""
        folder = self.store.job(job_id)
        with self._lock:
            if job_id in self.runs:
                return True
            if _read(folder).get("status") in FINISHED:
                return False
            lock = JobLock(folder)
            if not lock.acquire():
                return False
            self._locks[job_id] = lock
            run = self.runs[job_id] = JobRun(folder, self.target, self.source, store=self.store)
            run.progress.total = (_read(folder).get("request_counts") or {}).get("total", 0)
            done = self._done[job_id] = Future()
        loop = self._ensure_loop()

        async def go():
            record = None
            try:
                record = await run.run()
                done.set_result(record)
            except BaseException as exc:  # the job's record says what happened; the waiter hears it too
                done.set_exception(exc)
            finally:
                with self._lock:
                    if self._locks.get(job_id) is lock:
                        lock.release()
                        del self._locks[job_id]
                    if self.runs.get(job_id) is run:
                        del self.runs[job_id]
            if record is not None and record.get("status") == "in_progress" and self._loop is loop:
                loop.call_later(RETRY_S, self._retry, job_id)  # stopped by something passing: again later

        loop.call_soon_threadsafe(lambda: setattr(run, "task", loop.create_task(go())))
        return True

    def _retry(self, job_id: str) -> None:
        try:
            self.start(job_id)
        except KeyError:  # deleted meanwhile
            pass

    def resume_unfinished(self, kinds: tuple = ("batch",)) -> list[str]:
        """Start every job of `kinds` left in progress (by a process that stopped or died); their ids.
        (A notebook's map or a `jupyter mlx batch` run is resumed by asking for it again, on its own
        engines.) Jobs left cancelling end cancelled; jobs past their time to live are deleted first."""
        self.store.expire()
        resumed = []
        for folder in self.store.jobs():
            record = _read(folder)
            if record.get("kind") not in kinds:
                continue
            if record.get("status") == "cancelling" and JobLock(folder).acquire():
                folder.update(status="cancelled", cancelled_at=int(time.time()), ended_at=time.time())
            elif record.get("status") in ("validating", "in_progress") and self.start(folder.id):
                resumed.append(folder.id)
        return resumed

    def wait(self, job_id: str, timeout: Optional[float] = None) -> dict:
        """Block until the job stops running here (or at once if it does not run here); its batch object."""
        future = self._done.get(job_id)
        if future is not None:
            future.result(timeout)
        return self.describe(job_id)

    def cancel(self, job_id: str) -> dict:
        """Cancel a job wherever it runs: here (its rows in flight aborted), in another process (a
        marker its runner reads), or nowhere (it ends now). Only the runner writes its last record."""
        folder = self.store.job(job_id)
        if _read(folder).get("status") in FINISHED:
            return self.describe(job_id)
        run = self.runs.get(job_id)
        if run is not None:
            run.cancel()
            return self.describe(job_id)
        lock = JobLock(folder)
        if lock.acquire():  # nobody runs it: it ends here
            try:
                folder.update(status="cancelled", cancelled_at=int(time.time()), ended_at=time.time())
            finally:
                lock.release()
        else:
            (folder.path / CANCEL_MARKER).touch()
        return self.describe(job_id)

    # -- reading -------------------------------------------------------------------------------
    def describe(self, job_id: str) -> dict:
        """The Batch API's batch object, with this server's live progress under `progress`."""
        folder = self.store.job(job_id)
        record = _read(folder)
        run = self.runs.get(job_id)
        out = {k: v for k, v in record.items() if k not in ("fingerprint", "ended_at")}
        asked = (run is not None and run.cancelled) or (folder.path / CANCEL_MARKER).exists()
        if asked and out.get("status") in ("validating", "in_progress"):
            out["status"] = "cancelling"
        if run is not None:
            out["request_counts"] = run.counts()
            out["progress"] = run.progress.to_dict()
        else:
            counts = record.get("request_counts") or {}
            out["progress"] = {"total": counts.get("total", 0),
                               "done": counts.get("completed", 0) + counts.get("failed", 0),
                               "errors": counts.get("failed", 0)}
        out["running_here"] = run is not None
        return out

    def list(self, limit: int = 20, after: Optional[str] = None) -> list[dict]:
        ids = [f.id for f in self.store.jobs()]
        if after in ids:
            ids = ids[ids.index(after) + 1:]
        out = []
        for job_id in ids[:limit]:
            try:
                out.append(self.describe(job_id))
            except (KeyError, OSError):  # deleted (expired) while the list was read
                pass
        return out

    def results(self, job_id: str) -> list[dict]:
        """Each finished row's output line, in row order."""
        return sorted(self.store.job(job_id).results().values(), key=lambda r: r["row"])


def _read(folder: JobFolder) -> dict:
    try:
        return folder.record()
    except (OSError, ValueError):
        return {}


__all__ = ["BatchInputError", "JobManager", "fingerprint"]
