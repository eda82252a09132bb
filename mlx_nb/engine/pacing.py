"""PrefillPacer: how many prompt tokens a row reads per step, so decoding streams keep flowing.

One BatchGenerator step runs a decode step for every decoding row and one prefill chunk, so every
running stream waits for the chunk. With attention, chunk cost grows with the context already
read: late in an 8,000-token prompt a 512-token chunk takes seconds, and the streams stall.

While rows are decoding, the pacer sizes the next chunk from the last step's measured time so a
step lasts about `budget_s`. The cost per token changes as the context grows, and measuring it
each step follows that (a FLOP model would guess). A prompt that arrives while rows decode is
first read in a small probe chunk, since nothing is measured yet; the chunk then grows at most
2x a step while steps stay under budget. With nothing decoding, nobody is waiting, so prompts
are read in full `max_chunk` chunks, the fastest way through. BatchGenerator reads its public
`prefill_step_size` at every step, so the runner sets that between steps.
"""

from __future__ import annotations

from typing import Optional

MIN_CHUNK = 8  # late in a long prompt attention dominates, so even tiny chunks read at full speed
PROBE_CHUNK = 64  # the first chunk of a prompt read while others decode: its cost is not known yet
MAX_GROWTH = 2.0  # per step: one noisy measurement must not swing the chunk wildly
MAX_SHRINK = 0.25


class PrefillPacer:
    def __init__(self, max_chunk: int, budget_s: Optional[float]):
        self.max_chunk = max_chunk
        self.budget_s = budget_s
        self.min_chunk = min(MIN_CHUNK, max_chunk)
        self.probe_chunk = min(PROBE_CHUNK, max_chunk)
        self.chunk = max_chunk

    def next_chunk(self, step_s: float, read_prompt: bool, decoding: int) -> int:
        """The chunk for the next step, from the last step's time and whether it read a prompt chunk."""
        if self.budget_s is None or decoding == 0:
            self.chunk = self.max_chunk
        elif read_prompt:
            scale = min(MAX_GROWTH, max(MAX_SHRINK, self.budget_s / max(step_s, 1e-6)))
            self.chunk = int(min(self.max_chunk, max(self.min_chunk, self.chunk * scale)))
        else:  # decoding, no prompt being read: the next prompt starts with a probe
            self.chunk = min(self.chunk, self.probe_chunk)
        return self.chunk
