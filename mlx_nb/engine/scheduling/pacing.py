"""PrefillPacer: how many prompt tokens each step reads, so decoding streams keep flowing.

One BatchGenerator step runs a decode step for every decoding row and one prefill chunk, so every
running stream waits for the chunk. With attention, chunk cost grows with the context already
read: late in an 8,000-token prompt a 512-token chunk takes seconds, and the streams stall.

While rows are decoding, the pacer keeps a budget of prompt tokens per step, sized from the last
step's measured time so a step lasts about `budget_s` (the cost per token changes as the context
grows; measuring each step follows that, a FLOP model would guess), and splits it among the rows
about to read (BatchGenerator's `prefill_step_size` is per row: the runner sets it between steps).
A prompt arriving while rows decode starts from a small probe, since nothing is measured yet;
the budget then grows at most 2x a step while steps stay under time.

When more requests wait for their first token than are decoding (a burst of new chats), their
wait matters as much as the running streams' pace: the step time stretches with the ratio, up to
`MAX_STRETCH` x `budget_s`. With nothing decoding, nobody is waiting on a stream, so prompts are
read in full `max_chunk` chunks, the fastest way through, unless the batch holds only a dataset
job's rows (engine/scheduling/background.py): an interactive request arriving then waits for the step under
way, so their prompts are read in steps of about `BACKGROUND_STEP_S`, from a wave's first step on
and down to one token a row (reading is compute-bound on the CPU: 32 rows of 1–3 tokens a step read
as fast per token as whole prompts, bench/jobs.py).
"""

from __future__ import annotations

from typing import Optional

MIN_CHUNK = 8  # per row; late in a long prompt attention dominates, so even tiny chunks read at full speed
PROBE_TOKENS = 64  # the first step's budget when prompts join decoding rows: their cost is not known yet
MAX_STRETCH = 4.0  # step time, in budgets, when many more requests wait than decode
MAX_GROWTH = 2.0  # per step: one noisy measurement must not swing the budget wildly
MAX_SHRINK = 0.25
BACKGROUND_STEP_S = 0.1  # a step reading only job rows' prompts: what an arriving chat may wait for it


class PrefillPacer:
    def __init__(self, max_chunk: int, budget_s: Optional[float]):
        self.max_chunk = max_chunk
        self.budget_s = budget_s
        self.min_chunk = min(MIN_CHUNK, max_chunk)
        self.tokens: Optional[int] = None  # prompt tokens per step while rows decode; None: unpaced
        self.chunk = max_chunk

    def next_chunk(self, step_s: float, read_tokens: int, decoding: int, waiting: int, rows: int,
                   background: bool = False) -> int:
        """Per-row chunk for the next step, given the last step's time and prompt tokens read, the
        decoding rows, the requests waiting for their first token, and the rows about to read;
        `background`: the batch holds only job rows."""
        if background and self.budget_s is not None:
            return self._paced(step_s, read_tokens, rows, BACKGROUND_STEP_S, min_chunk=1)
        if self.budget_s is None or decoding == 0:
            self.tokens = None
            self.chunk = self.max_chunk
            return self.chunk
        return self._paced(step_s, read_tokens, rows, self.budget_s * min(MAX_STRETCH, max(1.0, waiting / decoding)))

    def _paced(self, step_s: float, read_tokens: int, rows: int, target_s: float, min_chunk: Optional[int] = None) -> int:
        rows = max(rows, 1)
        min_chunk = self.min_chunk if min_chunk is None else min_chunk
        if self.tokens is None or read_tokens == 0:  # no measurement: (back to) a probe
            self.tokens = min(self.tokens or PROBE_TOKENS, PROBE_TOKENS)
        else:
            scale = min(MAX_GROWTH, max(MAX_SHRINK, target_s / max(step_s, 1e-6)))
            self.tokens = int(min(self.max_chunk * rows, max(min_chunk, self.tokens * scale)))
        self.chunk = int(min(self.max_chunk, max(min_chunk, self.tokens // rows)))
        return self.chunk
