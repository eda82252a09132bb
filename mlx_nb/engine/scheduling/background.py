"""The background lane: rows of dataset jobs, which fill the batch slots interactive requests leave.

A job (mlx_nb/jobs) submits its rows with `job=<id>`. They do not enter mlx_lm's generator at
submit, as an interactive request does: they wait here, and between two steps the runner asks
`room()` how many may join.

- With no interactive row in the batch a job fills up to `batch` slots (Engine(job_batch=), 16), in
  *waves*: rows join when all of those have room for them (or the lane has no more), so their prompts
  are read as one prompt batch and the batch's cache is extended once, not once per row; on the
  default model a 2,000-row job runs ~25% faster in waves than row by row (bench/jobs.py). Room left
  unused for `WAVE_WAIT_S` (a long row still running) is filled without waiting for the wave; yielded
  rows come back without waiting. Half waves (rows joining once half the job batch is free, their
  prompts read beside the other half's decoding) ran ~20% slower on the default model (400-row jobs,
  alternated in one process: 126 against 145-163 tokens/s).
- Why narrower than `max_batch`: a chat arriving during a job waits for the job's step under way,
  and a decode step's time grows with its rows. On the default model on a 2-core CPU a step of 32
  schema-constrained rows takes ~140 ms and one of 16 ~70 ms, decoding as many tokens a second: at
  16 rows a chat's first token came 1.4x its idle time, at 32 rows 3.3x (bench/jobs.py, one run).
- When an interactive request arrives, every background row *yields*, decoding or still reading its
  prompt: the runner takes it out of the batch with its cache (`Parked`) and puts it back, exactly
  where it stopped, when there is room again; its text stream, constraint state and budget go on as
  if it had never left. With no background row left, the step they had under way is dropped rather
  than finished, so the request starts at the next step.
- A job is never starved: once interactive rows have held the batch for `STARVED_S` while the job
  waits, `under_load` of its rows (its minimum share) run beside them until they are gone. A chat of
  a few seconds runs alone; a stream of chats still lets the job finish rows.

Parked rows come back first, then the jobs take turns (round robin), so several jobs share fairly.
A vision model's requests are read by their own prefill lane (engine/scheduling/vision_prefill.py): there a
job's rows are admitted as interactive requests are, not held here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

UNDER_LOAD_ROWS = 1  # rows beside interactive ones once the job waited STARVED_S (Engine(job_rows_under_load=))
JOB_BATCH = 16  # most background rows in the batch at once (Engine(job_batch=)): see the module docstring
STARVED_S = 1.0  # how long interactive rows hold the batch alone before a waiting job gets its minimum share
WAVE_WAIT_S = 2.0  # room left unused this long: waiting rows join without waiting for a whole wave


@dataclass
class Parked:
    """A background row taken out of the batch (decode.Generator.park): its cache, the tokens that
    cache holds, and the prompt segments it has still to read when it comes back (a decoding row:
    its last token)."""

    live: object
    cache: Optional[list]
    tokens: list
    rest: list
    decoding: bool = True


class BackgroundLane:
    def __init__(self, under_load: int = UNDER_LOAD_ROWS, batch: int = JOB_BATCH):
        if not isinstance(under_load, int) or isinstance(under_load, bool) or under_load < 0:
            raise ValueError(f"job_rows_under_load must be a whole number of rows >= 0, not {under_load!r}")
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"job_batch must be a whole number of rows >= 1, not {batch!r}")
        self.under_load = under_load
        self.batch = batch
        self.waiting: dict[str, deque] = {}  # job id -> its rows not started yet, in order
        self.parked: deque[Parked] = deque()
        self._turn: deque[str] = deque()  # the jobs' order for the next row (round robin)
        self.yielded = 0  # rows taken out of the batch for interactive ones, since the engine started
        self.crowded_since: Optional[float] = None  # when interactive rows last began to hold the batch
        self.room_since: Optional[float] = None  # since when the batch has had room a wave did not fill

    def __len__(self) -> int:
        return len(self.parked) + sum(len(q) for q in self.waiting.values())

    def add(self, live) -> None:
        job = live.extra["job"]
        if job not in self.waiting:
            self.waiting[job] = deque()
            self._turn.append(job)
        self.waiting[job].append(live)

    def park(self, parked: Parked) -> None:
        self.parked.append(parked)
        self.yielded += 1

    def room(self, interactive: int, background: int, max_batch: int, now: float) -> int:
        """How many more background rows the batch may hold now (negative: how many must yield)."""
        if interactive == 0:
            self.crowded_since = None
            return min(max_batch, self.batch) - background
        if self.crowded_since is None:
            self.crowded_since = now
        starved = now - self.crowded_since >= STARVED_S
        share = min(self.under_load, max(0, max_batch - interactive)) if starved else 0
        return share - background

    def wave(self, max_batch: int, room: int, now: float) -> int:
        """How much room the batch needs before waiting rows join it (see the module docstring):
        none for parked rows (they were in the batch already), none once room has been waiting for
        `WAVE_WAIT_S` (one long row must not hold the rest of the batch empty), else a whole wave."""
        if self.parked:
            return 1
        if room <= 0:
            self.room_since = None
        elif self.room_since is None:
            self.room_since = now
        if self.room_since is not None and now - self.room_since >= WAVE_WAIT_S:
            return 1
        return max(1, min(len(self), max_batch, self.batch))

    def take(self, n: int) -> list:
        """Up to `n` rows to (re)join the batch: parked ones first, then one per job in turn."""
        out: list = []
        while len(out) < n and self.parked:
            out.append(self.parked.popleft())
        while len(out) < n and self._turn:
            job = self._turn[0]
            self._turn.rotate(-1)
            rows = self.waiting[job]
            live = rows.popleft()
            if not rows:
                del self.waiting[job]
                self._turn.remove(job)
            if not live.handle.done:  # aborted while it waited
                out.append(live)
        return out

    def remove(self, request_id: str) -> Optional[object]:
        """The waiting or parked row with this id, taken out of the lane (None if it is not here)."""
        for i, p in enumerate(self.parked):
            if p.live.id == request_id:
                del self.parked[i]
                return p.live
        for job, rows in self.waiting.items():
            for live in rows:
                if live.id == request_id:
                    rows.remove(live)
                    if not rows:
                        del self.waiting[job]
                        self._turn.remove(job)
                    return live
        return None

    def rows(self) -> list:
        """Every row in the lane (for status and close)."""
        return [p.live for p in self.parked] + [lv for q in self.waiting.values() for lv in q]

    def clear(self) -> list:
        out = self.rows()
        self.waiting.clear()
        self.parked.clear()
        self._turn.clear()
        return out
