"""The background lane: rows of dataset jobs, which fill the batch slots interactive requests leave.

A job (mlx_nb/jobs) submits its rows with `job=<id>`. They do not enter mlx_lm's generator at
submit, as an interactive request does: they wait here, and between two steps the runner asks
`room()` how many may join. With no interactive row in the batch a job fills it up to `max_batch`;
while interactive rows are in it, background rows keep at most `under_load` slots (their minimum
share: a job still finishes rows under sustained interactive load, and an interactive row's step
is barely longer than alone). A running background row past that share *yields*: the runner
takes it out of the batch with its cache (`Parked`) and puts it
back, exactly where it stopped, when there is room again; its text stream, constraint state and
budget go on as if it had never left. Parked rows come back first, then the jobs take turns
(round robin), so several jobs share the lane fairly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

UNDER_LOAD_ROWS = 2  # background rows kept in the batch while interactive rows run (Engine(job_rows_under_load=))


@dataclass
class Parked:
    """A background row taken out of the batch mid-answer: its tokens (prompt and answer so far) and
    its cache of all but the last, which it resumes from (decode.Generator.park)."""

    live: object
    cache: list
    tokens: list


class BackgroundLane:
    def __init__(self, under_load: int = UNDER_LOAD_ROWS):
        if not isinstance(under_load, int) or under_load < 0:
            raise ValueError(f"job_rows_under_load must be a whole number of rows >= 0, not {under_load!r}")
        self.under_load = under_load
        self.waiting: dict[str, deque] = {}  # job id -> its rows not started yet, in order
        self.parked: deque[Parked] = deque()
        self._turn: deque[str] = deque()  # the jobs' order for the next row (round robin)
        self.yielded = 0  # rows taken out of the batch for interactive ones, since the engine started

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

    def room(self, interactive: int, background: int, max_batch: int) -> int:
        """How many background rows the batch may hold now (negative: how many must yield)."""
        share = max_batch - interactive if interactive == 0 else min(self.under_load, max(0, max_batch - interactive))
        return share - background

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
