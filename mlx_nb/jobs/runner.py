"""Running one job: its unfinished rows through the background lane, each result on disk as it ends.

The runner keeps `window` rows submitted at a time (enough to fill a batch twice over: the lane
holds the rest back, so submitting more would only template prompts early), writes each finished
row with one fsync per group of rows that finished together, and keeps the live numbers a progress
display reads (`Progress`). Cancel aborts the rows in flight; their rows get no result, so a job
stopped by a closing engine or a killed process resumes them.
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

    def cancel(self) -> None:
        """Stop: rows in flight are aborted (the engine drops them at its next step)."""
        self.cancelled = True
        for handle in list(self._handles):
            handle.abort()

    async def run(self) -> dict:
        """Run the rows without a result; the job's final record (status completed, failed, cancelled,
        or still in_progress when interrupted)."""
        folder = self.folder
        done = folder.results()
        rows = list(folder.inputs())
        pending = [r for r in rows if r["row"] not in done]
        p = self.progress
        p.total, p.started = len(rows), time.time()
        for line in done.values():
            p.done += 1
            p.errors += failed(line)
        p.resumed_from = p.done
        record = await asyncio.to_thread(folder.update, status="in_progress",
                                         in_progress_at=folder.record().get("in_progress_at") or int(time.time()))
        log = await asyncio.to_thread(folder.open_results)
        gate = asyncio.Semaphore(self.window)
        finished: list[dict] = []
        writing = asyncio.Lock()
        interrupted: list[BaseException] = []
        last_record = time.monotonic()

        async def one(row: dict) -> None:
            nonlocal last_record
            async with gate:
                if self.cancelled or interrupted:
                    return
                try:
                    line = await run_row(row, self.target, folder.id, self.source, self._track)
                except (Interrupted, ModelLoadFailure) as exc:
                    interrupted.append(exc)
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
            await asyncio.gather(*(one(r) for r in pending))
        finally:
            log.close()
        load_failures = [e for e in interrupted if isinstance(e, ModelLoadFailure)]
        if load_failures:
            return await asyncio.to_thread(folder.update, status="failed", ended_at=time.time(),
                                           failed_at=int(time.time()), request_counts=self.counts(),
                                           errors={"object": "list", "data": [
                                               {"code": "model_load_failed", "message": str(load_failures[0]),
                                                "line": None, "param": "model"}]})
        if self.cancelled:
            return await asyncio.to_thread(folder.update, status="cancelled", ended_at=time.time(),
                                           cancelled_at=int(time.time()), request_counts=self.counts())
        if interrupted or p.done < p.total:  # the engine stopped under it: it resumes later
            return await asyncio.to_thread(folder.update, request_counts=self.counts())
        return record | await asyncio.to_thread(self._complete)

    def counts(self) -> dict:
        p = self.progress
        return {"total": p.total, "completed": p.done - p.errors, "failed": p.errors}

    def _complete(self) -> dict:
        """Every row has its result: the output and error files (for a batch), then status completed."""
        from mlx_nb.jobs.lines import public

        record = self.folder.record()
        changes = {"status": "completed", "ended_at": time.time(), "completed_at": int(time.time()),
                   "finalizing_at": int(time.time()), "request_counts": self.counts()}
        store = self.store
        if record.get("kind") == "batch" and store is not None:
            import json

            results = sorted(self.folder.results().values(), key=lambda r: r["row"])
            good = [json.dumps(public(r), ensure_ascii=False) for r in results if not failed(r)]
            bad = [json.dumps(public(r), ensure_ascii=False) for r in results if failed(r)]
            for key, lines in (("output_file_id", good), ("error_file_id", bad)):
                if lines:
                    meta = store.create_file(("\n".join(lines) + "\n").encode(), f"{self.folder.id}_{key[:-8]}.jsonl",
                                             "batch_output")
                    changes[key] = meta["id"]
        return self.folder.update(**changes)

    def _track(self, handles: list) -> None:
        for handle in handles:
            self._handles.add(handle)
            if self.cancelled:
                handle.abort()
        self._handles = {h for h in self._handles if not h.done}
