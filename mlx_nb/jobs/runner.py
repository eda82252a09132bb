"""Running one job: its unfinished rows through the background lane, each result on disk as it ends.

The runner keeps `window` rows submitted at a time (enough to fill a batch twice over: the lane
holds the rest back, so submitting more would only template prompts early), writes each finished
row with one fsync per group of rows that finished together, and keeps the live numbers a progress
display reads (`Progress`). Cancel aborts the rows in flight; their rows get no result, so a job
stopped by a closing engine or a killed process resumes them. A cancel asked in another process
(the one running the job holds its lock) leaves a marker in the job's folder that the runner reads.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Optional

from mlx_nb.jobs.lines import failed
from mlx_nb.jobs.rows import Interrupted, ModelLoadFailure, run_row
from mlx_nb.jobs.store import JobFolder

WINDOW = 64  # rows submitted at once
RECORD_EVERY_S = 1.0  # how often the job's record on disk gets its counts while it runs
CANCEL_MARKER = "cancel-requested"  # a file in the job's folder: cancel it, whichever process runs it


@dataclass
class Progress:
    """What a progress bar or widget shows; read from any thread (a snapshot, not a promise)."""

    total: int = 0
    done: int = 0  # rows with a result (errors included)
    errors: int = 0
    tokens: int = 0  # completion tokens of the rows finished while this process ran the job
    started: Optional[float] = None  # when this process started running it (time.time())
    resumed_from: int = 0  # rows already done when this process took it up
    timeline: list = field(default_factory=list)  # (seconds since started, rows done, tokens)

    def note(self, line: dict) -> None:
        self.done += 1
        self.errors += failed(line)
        usage = ((line.get("response") or {}).get("body") or {}).get("usage") or {}
        self.tokens += int(usage.get("completion_tokens") or 0)
        if self.started is not None:
            point = (round(time.time() - self.started, 3), self.done, self.tokens)
            if not self.timeline or point[0] - self.timeline[-1][0] >= 0.25 or self.done == self.total:
                self.timeline.append(point)

    def to_dict(self) -> dict:
        elapsed = time.time() - self.started if self.started else 0.0
        fresh = self.done - self.resumed_from
        rate = fresh / elapsed if elapsed > 0 else 0.0
        left = self.total - self.done
        return {"total": self.total, "done": self.done, "errors": self.errors, "tokens": self.tokens,
                "elapsed_s": round(elapsed, 3), "rows_per_s": round(rate, 3),
                "tokens_per_s": round(self.tokens / elapsed, 2) if elapsed > 0 else 0.0,
                "eta_s": round(left / rate, 1) if rate > 0 and left else (0.0 if not left else None),
                "timeline": list(self.timeline[-200:])}


class JobRun:
    """One job being run by this process."""

    def __init__(self, folder: JobFolder, target, source: str, store=None, window: int = WINDOW):
        self.folder = folder
        self.store = store  # where a batch's output and error files go
        self.target = target
        self.source = source
        self.window = window
        self.progress = Progress()
        self.cancelled = False
        self._handles: set = set()
        self.task: Optional[asyncio.Task] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None  # the jobs' loop, once running

    def cancel(self) -> None:
        """Stop (from any thread): rows in flight are aborted on the jobs' loop (a remote row's abort
        cancels a task of that loop), the engine drops them at its next step."""
        self.cancelled = True
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._abort_all)

    def _abort_all(self) -> None:
        for handle in list(self._handles):
            handle.abort()

    def _cancel_asked(self) -> bool:
        """A cancel from another process (it cannot reach this one): the marker in the job's folder."""
        if not self.cancelled and (self.folder.path / CANCEL_MARKER).exists():
            self.cancelled = True
            self._abort_all()
        return self.cancelled

    async def run(self) -> dict:
        """Run the rows without a result; the job's final record: completed, failed (its model cannot
        load, or its results cannot be stored), cancelled, or still in_progress when interrupted (the
        engine closed under it, a model busy: the manager runs it again later)."""
        self.loop = asyncio.get_running_loop()
        folder = self.folder
        done = folder.results()
        rows = list(folder.inputs())
        p = self.progress
        p.total, p.started = len(rows), time.time()
        for line in done.values():
            p.done += 1
            p.errors += failed(line)
        p.resumed_from = p.done
        pending = iter([r for r in rows if r["row"] not in done])
        del rows, done
        record = await asyncio.to_thread(folder.update, status="in_progress",
                                         in_progress_at=folder.record().get("in_progress_at") or int(time.time()))
        log = await asyncio.to_thread(folder.open_results)
        finished: list[dict] = []
        writing = asyncio.Lock()
        stops: list[BaseException] = []  # why rows stopped being taken: Interrupted, ModelLoadFailure, ...
        last_record = time.monotonic()

        async def worker() -> None:  # `window` of these: a row each at a time, never a task per row
            nonlocal last_record
            for row in pending:
                if self._cancel_asked() or stops:
                    return
                try:
                    line = await run_row(row, self.target, folder.id, self.source, self._track)
                except Exception as exc:  # Interrupted, ModelLoadFailure, or the engine closing under it
                    stops.append(exc)
                    return
                finished.append(line)
                async with writing:  # rows that finished while the last write ran go in one fsync
                    batch = finished[:]
                    finished.clear()
                    if batch:
                        await asyncio.to_thread(log.append, batch)  # on disk before it counts as done
                    for line in batch:
                        p.note(line)
                if time.monotonic() - last_record >= RECORD_EVERY_S:
                    last_record = time.monotonic()
                    await asyncio.to_thread(folder.update, request_counts=self.counts())

        try:
            await asyncio.gather(*(worker() for _ in range(self.window)), return_exceptions=True)
        finally:
            log.close()  # every worker has ended: none writes after this
        load_failures = [e for e in stops if isinstance(e, ModelLoadFailure)]
        if load_failures:
            return await asyncio.to_thread(self._end, "failed", errors={"object": "list", "data": [
                {"code": "model_load_failed", "message": str(load_failures[0]), "line": None, "param": "model"}]})
        if self.cancelled:
            return await asyncio.to_thread(self._end, "cancelled")
        if stops or p.done < p.total:
            if not any(isinstance(e, Interrupted) for e in stops):
                log_stop(folder.id, stops)
            return await asyncio.to_thread(folder.update, request_counts=self.counts())
        return record | await asyncio.to_thread(self._end, "completed")

    def counts(self) -> dict:
        p = self.progress
        return {"total": p.total, "completed": p.done - p.errors, "failed": p.errors}

    def _end(self, status: str, **more) -> dict:
        """The job's last record: its output and error files (a batch's, with the rows it finished, as
        OpenAI gives a cancelled batch's), then its status. A store past its budget fails it, saying so."""
        from mlx_nb.jobs.store import StoreFull

        now = time.time()
        changes = {"status": status, "ended_at": now, f"{status}_at": int(now), "request_counts": self.counts(),
                   **more}
        try:
            changes.update(self._files())
        except StoreFull as exc:
            changes.update(status="failed", failed_at=int(now), errors={"object": "list", "data": [
                {"code": "storage_full", "message": str(exc), "line": None, "param": None}]})
        (self.folder.path / CANCEL_MARKER).unlink(missing_ok=True)
        return self.folder.update(**changes)

    def _files(self) -> dict:
        import json

        from mlx_nb.jobs.lines import public

        if self.folder.record().get("kind") != "batch" or self.store is None:
            return {}
        out = {"finalizing_at": int(time.time())}
        results = sorted(self.folder.results().values(), key=lambda r: r["row"])
        good = [json.dumps(public(r), ensure_ascii=False) for r in results if not failed(r)]
        bad = [json.dumps(public(r), ensure_ascii=False) for r in results if failed(r)]
        del results
        for key, lines in (("output_file_id", good), ("error_file_id", bad)):
            if lines:
                meta = self.store.create_file(("\n".join(lines) + "\n").encode(), f"{self.folder.id}_{key[:-8]}.jsonl",
                                              "batch_output")
                out[key] = meta["id"]
        return out

    def _track(self, handles: list) -> None:
        for handle in handles:
            self._handles.add(handle)
            if self.cancelled:
                handle.abort()
        self._handles = {h for h in self._handles if not h.done}


def log_stop(job_id: str, stops: list) -> None:
    import logging

    logging.getLogger("mlx_nb.jobs").warning("job %s stopped (it runs again later): %s: %s", job_id,
                                             type(stops[0]).__name__, stops[0])
