"""Speculative decoding by prompt lookup, per row of the shared batch.

Notebooks and coding agents ask for text that repeats what the prompt holds (an edited function, a
quoted paragraph, a renamed variable). Such a row's next tokens can be guessed with no second
model: find the latest earlier place in the row's own tokens (prompt and answer) where its last few
tokens occurred, and propose what followed there. One forward pass of the batch then reads each
row's pending token and its proposal together; a proposed token is kept while it equals the greedy
token the model gives at its place, so a row's tokens are exactly those it gives without
speculation, several of them for the cost of one step when the guess is right.

What `DecodeBatch` asks of this module:
- `PromptLookup.plan(...)`: whether this step speculates, and each row's proposal. Only greedy rows
  without logits processors, logprobs or their own sampler speculate (a sampled row would need
  rejection sampling against its distribution: those steps run as before), only on caches that can
  be cut back (plain KV caches), and only while the batch is small: verifying proposals costs
  compute, which a batch of many rows has none of to spare. A row whose proposals keep failing (or
  finding nothing) is asked again after 1, 2, 4, ... 32 steps, so free text costs next to nothing.
- `cut_back(caches, drops)`: each row's rejected positions taken off the batch's KV cache, through
  the cache's public trim, and for rows that dropped more than others its right-padding roll
  (`prepare(right_padding=...)` + `finalize()`, what mlx_lm uses after right-padded prompts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

MAX_BACKOFF = 32


@dataclass
class RowState:
    due: int = 0  # the step at which this row may propose again
    failures: int = 0  # proposals in a row that found nothing or had nothing accepted


@dataclass
class PromptLookup:
    """Prompt-lookup speculation's settings and counters (one per decode batch)."""

    max_draft: int = 8  # most tokens a row proposes in one step
    row_budget: int = 24  # rows x (1 + proposal) read in one verifying step, at most
    max_ngram: int = 4
    min_ngram: int = 2
    steps: int = 0  # decode steps seen
    speculative_steps: int = 0  # of them, steps that verified proposals
    proposed: int = 0
    accepted: int = 0
    rows: dict = field(default_factory=dict)  # uid -> RowState

    def draft_limit(self, rows: int) -> int:
        return min(self.max_draft, self.row_budget // max(rows, 1) - 1)

    def due(self, uid: int) -> bool:
        return self.rows.setdefault(uid, RowState()).due <= self.steps

    def record(self, uid: int, proposed: int, accepted: int) -> None:
        """One row's outcome: a hit makes it ask again next step, a miss waits longer each time."""
        state = self.rows.setdefault(uid, RowState())
        self.proposed += proposed
        self.accepted += accepted
        if accepted:
            state.failures, state.due = 0, self.steps + 1
        else:
            state.failures += 1
            state.due = self.steps + min(2 ** state.failures, MAX_BACKOFF)

    def forget(self, live_uids: list[int]) -> None:
        for uid in [u for u in self.rows if u not in live_uids]:
            del self.rows[uid]

    def status(self) -> dict:
        return {"method": "prompt lookup", "max_draft": self.max_draft, "steps": self.steps,
                "speculative_steps": self.speculative_steps, "proposed_tokens": self.proposed,
                "accepted_tokens": self.accepted,
                "acceptance": round(self.accepted / self.proposed, 3) if self.proposed else None}


def propose(context: list[int], k: int, max_n: int = 4, min_n: int = 2) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the context's last n tokens
    (the longest n from max_n down to min_n that occurred before); [] if none did."""
    if k < 1 or len(context) <= min_n:
        return []
    a = np.asarray(context, dtype=np.int64)
    size = len(a)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        tail = a[size - n:]
        hits = np.ones(size - n, dtype=bool)  # where an earlier n tokens start (the tail itself excluded)
        for j in range(n):
            hits &= a[j:size - n + j] == tail[j]
        found = np.flatnonzero(hits)
        if found.size:
            start = int(found[-1]) + n
            return a[start:start + k].tolist()
    return []


def cut_back(caches: list, drops: list[int]) -> None:
    """Take `drops[i]` positions off the end of row i of every layer's batch KV cache."""
    import mlx.core as mx

    least = min(drops)
    if least:
        for c in caches:
            c.trim(least)
    rest = [d - least for d in drops]
    if any(rest):
        for c in caches:  # rows that dropped more shift right: the freed places become left padding
            c.prepare(right_padding=rest)
            c.finalize()
        mx.eval([c.state for c in caches])


def cache_can_cut_back(caches: list) -> bool:
    from mlx_lm.models.cache import BatchKVCache

    return bool(caches) and all(type(c) is BatchKVCache for c in caches)


def speculable(sampler, processors) -> bool:
    """A row that may speculate: greedy through our own sampler, no logits processors, no logprobs."""
    from mlx_nb.engine.sampling import TokenSampler

    return (isinstance(sampler, TokenSampler) and sampler.temperature == 0 and not sampler.wants_logprobs
            and not processors)


def plan(spec: PromptLookup, uids: list[int], tokens: list[list[int]], pending: Optional[list[int]],
         budgets: list[int]) -> Optional[list[list[int]]]:
    """Each row's proposal for this step (given its tokens so far and its pending token), or None
    when no row proposes anything. `budgets[i]`: tokens row i may still give after the pending one."""
    limit = spec.draft_limit(len(uids))
    drafts = []
    for uid, row, nxt, budget in zip(uids, tokens, pending, budgets):
        if not spec.due(uid):
            drafts.append([])
            continue
        draft = propose(row + [nxt], min(limit, budget), spec.max_ngram, spec.min_ngram)
        if not draft:
            spec.record(uid, 0, 0)
        drafts.append(draft)
    return drafts if any(drafts) else None
