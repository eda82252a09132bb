"""Speculative decoding by prompt lookup, per row of the shared batch.

Notebooks and coding agents ask for text that repeats what the prompt holds (an edited function, a
quoted paragraph, a renamed variable). Such a row's next tokens can be guessed with no second
model: find the latest earlier place in the row's own tokens (prompt and answer) where its last few
tokens occurred, and propose what followed there. A row that has been copying looks first just past
where its copy stood (its copy pointer), so the copy resumes after a renamed name and a common
n-gram is found at its place in the text being copied. One forward pass of the batch then reads each
row's pending token and its proposal together. A greedy row keeps a proposed token while it equals
the greedy token the model gives at its place, so its tokens are exactly those it gives without
speculation; a sampled row keeps it with the probability its settings give it and draws the
replacement of the first one refused from that distribution without it (speculative sampling, the
proposal being certain), so its tokens keep their distribution. Either way several tokens can come
for the cost of one step when the guess is right.

Whether it pays is measured, not assumed. On a CPU, reading L tokens at once costs more than one
(two cores run out of arithmetic long before a GPU would: a 135M model reads 5 tokens in about
twice the time of one, a 1B model in much less). `PromptLookup` times the batch's steps as they
happen (plain steps by batch size, verifying steps by batch size and width) and keeps each row's
acceptance rate; a step proposes the number of tokens that maximises the expected tokens per second
(each row's expected run from its rate, against the measured or extrapolated time of that width),
and none when no width beats a plain step. A width not measured yet is estimated from the widths
that were (a prior slope until then), so the choice corrects itself on each machine and model.

What `DecodeBatch` asks of this module:
- `plan(...)`: whether this step speculates, and each row's proposal. Only rows without logits
  processors, logprobs, a seed or their own sampler speculate, only on caches that can be cut back
  (plain KV caches, float or quantized), and only while the batch is small (`row_budget`). A row whose lookups find
  nothing or whose proposals fail is asked again after 2, then 4 steps, so free text costs next
  to nothing.
- `PromptLookup.step_started(...)` and `verified(...)`: the time of plain and of verifying steps,
  for the cost model.
- `cut_back(caches, drops)`: each row's rejected positions taken off the batch's KV cache, through
  the cache's public trim, and for rows that dropped more than others its right-padding roll
  (`prepare(right_padding=...)` + `finalize()`, what mlx_lm uses after right-padded prompts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

MAX_BACKOFF = 4  # steps a row waits at most between lookups that find nothing
DRAFT_BACKOFF = 32  # ... between tries of a draft model no width paid for (each try costs its forwards)
PRIOR_SLOPE = 0.35  # a verifying step of L tokens a row costs ~1 + 0.35 (L - 1) plain steps until measured
PRIOR_RATE = 0.6  # a row's chance that its next proposed token is right, before it has proposed any
DECAY = 0.8  # how fast a row's acceptance rate and the step timings follow what happens now
GAIN = 1.1  # speculate only when the expected tokens per second beat a plain step by this much
FOLLOW = 16  # how far past where a row's copy stood a lookup looks first for where it resumes


@dataclass
class RowState:
    due: int = 0  # the step at which this row may look up again
    failures: int = 0  # lookups in a row that found nothing
    hits: float = PRIOR_RATE  # decayed count of guessed tokens that were right ...
    trials: float = 1.0  # ... and of those plus first wrong ones: hits / trials estimates the rate
    shadow: Optional[tuple] = None  # (where in its tokens, guess): a guess not verified, scored as tokens come
    copying: Optional[tuple] = None  # (its length at its last guess, where that guess was copied from)

    @property
    def rate(self) -> float:
        return self.hits / self.trials

    def score(self, right: int, guessed: int) -> None:
        self.hits = DECAY * self.hits + right
        self.trials = DECAY * self.trials + right + (right < guessed)

    def copy_pointer(self, tokens: list[int]) -> Optional[int]:
        """Where the text this row last copied from stands now: past the tokens that came since its
        last guess as far as they agree with that text (at a renamed name, the place of the old
        one). None before its first guess."""
        if self.copying is None:
            return None
        at, start = self.copying
        came = tokens[at:]
        source = tokens[start:min(at, start + len(came))]
        same = next((i for i, (a, b) in enumerate(zip(came, source)) if a != b), len(source))
        return start + same

    def settle_shadow(self, tokens: list[int]) -> None:
        """Score the unverified guess against the tokens that came since: a refuted guess by its right
        run, one they have confirmed so far as that many right. Either way it is let go and the row
        looks up again: waiting for a whole guess (17 tokens at one stream) to come true kept a row
        that had started copying from proposing for that many steps."""
        if self.shadow is None:
            return
        start, guess = self.shadow
        came = tokens[start:start + len(guess)]
        right = next((i for i, (a, b) in enumerate(zip(came, guess)) if a != b), len(came))
        if right < len(came):
            self.score(right, len(guess))
        elif right:
            self.score(right, right)
        else:
            return  # no token came yet
        self.shadow = None


@dataclass
class PromptLookup:
    """Prompt-lookup speculation's settings, cost model and counters (one per decode batch)."""

    max_draft: int = 16  # most tokens a row proposes in one step
    row_budget: int = 24  # rows x (1 + proposal) read in one verifying step, at most
    max_ngram: int = 4
    min_ngram: int = 2
    steps: int = 0  # decode steps seen
    speculative_steps: int = 0  # of them, steps that verified proposals
    proposed: int = 0
    accepted: int = 0
    rows: dict = field(default_factory=dict)  # uid -> RowState
    drafter: Optional[object] = None  # a DraftModel (engine/speculation/draft.py): guesses where the row does not repeat itself
    # with a drafter: where each row's proposal in flight came from, and per source the tokens
    # proposed and accepted ("lookup": the row repeated itself; "draft": the draft model's)
    sources: dict = field(default_factory=dict)
    by_source: dict = field(default_factory=lambda: {"lookup": [0, 0], "draft": [0, 0]})
    draft_note: Optional[str] = None  # why a draft model asked for is not used
    plain_s: dict = field(default_factory=dict)  # batch size -> seconds a plain step takes (decayed mean)
    verify_s: dict = field(default_factory=dict)  # (batch size, width) -> seconds a verifying step takes
    _last: Optional[tuple] = None  # (when the previous step started, its kind)

    def draft_limit(self, rows: int) -> int:
        return min(self.max_draft, self.row_budget // max(rows, 1) - 1)

    def due(self, uid: int) -> bool:
        return self.rows.setdefault(uid, RowState()).due <= self.steps

    def record(self, uid: int, proposed: int, accepted: int) -> None:
        """A verified proposal's outcome (the row's rate learns from it)."""
        self.proposed += proposed
        self.accepted += accepted
        source = self.sources.pop(uid, None)
        if source is not None:
            self.by_source[source][0] += proposed
            self.by_source[source][1] += accepted
        self.rows.setdefault(uid, RowState()).score(accepted, proposed)

    def found_nothing(self, state: RowState, longest: int = MAX_BACKOFF) -> None:
        """A lookup found no earlier occurrence: the row waits 2, then 4 steps before the next (a
        lookup costs ~0.1 ms at 4k tokens; a row that starts copying again is caught soon). A draft
        model's row no width paid for waits up to `longest` = DRAFT_BACKOFF."""
        state.failures += 1
        state.due = self.steps + min(2 ** state.failures, longest)

    def forget(self, live_uids: list[int]) -> None:
        for uid in [u for u in self.rows if u not in live_uids]:
            del self.rows[uid]
            self.sources.pop(uid, None)
        if self.drafter is not None:
            self.drafter.forget(live_uids)

    # -- the cost model -------------------------------------------------------------------------
    def step_started(self, now: float, kind: tuple) -> None:
        """A decode step starts (`kind`: ("plain", rows) or ("verify", rows, width)): when the previous
        step was a plain one, the time since it started is what it took, bookkeeping included. Only a
        plain step that followed a plain step of as many rows counts (the first after a change waited
        for an extend, for a batch that had emptied, or for nothing after a verifying step), and no
        interval far above the estimate (a prompt chunk read in the same step). A verifying step is
        timed by `verified`: its interval also holds the wait for the step before it, whose forward a
        plain step would have waited for too."""
        if self._last is not None:
            started, previous, before = self._last
            if previous[0] == "plain" and before == previous:
                self._learn(self.plain_s, previous[1], now - started, self.plain_s.get(previous[1]))
        self._last = (now, kind, None if self._last is None else self._last[1])

    def verified(self, rows: int, width: int, seconds: float) -> None:
        """A verifying step's own time: from its pending tokens' arrival to its runs' being known
        (the draft model's guesses, the forward of `width` tokens a row, the acceptance, the cut-back)."""
        key = (rows, width)
        self._learn(self.verify_s, key, seconds, self.verify_s.get(key) or self.verify_cost(rows, width))

    @staticmethod
    def _learn(table: dict, key, took: float, estimate: Optional[float]) -> None:
        """`took` into table[key]'s decayed mean, unless it is far above the estimate."""
        if estimate is None or took < 1.5 * estimate:
            known = table.get(key)
            table[key] = took if known is None else DECAY * known + (1 - DECAY) * took

    def verify_cost(self, rows: int, width: int) -> Optional[float]:
        """Seconds a verifying step of `width` tokens a row takes: measured, or extrapolated from the
        widths measured at this batch size (the prior slope when none is); None before any plain step."""
        plain = self.plain_s.get(rows)
        if plain is None:
            return None
        measured = self.verify_s.get((rows, width))
        if measured is not None:
            return measured
        slopes = [(t / plain - 1) / (w - 1) for (r, w), t in self.verify_s.items() if r == rows and w > 1]
        slope = sorted(slopes)[len(slopes) // 2] if slopes else PRIOR_SLOPE
        return plain * (1 + max(slope, 0.0) * (width - 1))

    def best_width(self, rates: list[float], lengths: list[int], pending_known: bool = False) -> int:
        """How many tokens a row this step proposes: the number that maximises the expected tokens
        per second, or 0 when no number beats a plain step by GAIN. A lookup's guess begins with the
        row's pending token (right with chance rates[i], else the row proposes nothing) and keeps its
        j-th proposed token with chance rates[i] ** (j + 1); a draft model's starts after the pending
        token (`pending_known`), its j-th kept with chance rates[i] ** j."""
        rows = len(rates)
        plain = self.plain_s.get(rows)
        if plain is None:
            return 0
        best, best_speed, shift = 0, GAIN * rows / plain, 0 if pending_known else 1
        for k in range(1, max(lengths) + 1):
            cost = self.verify_cost(rows, k + 1)
            expected = sum(1 + sum(p ** (j + shift) for j in range(1, min(k, n) + 1)) for p, n in zip(rates, lengths))
            if expected / cost > best_speed:
                best, best_speed = k, expected / cost
        return best

    def status(self) -> dict:
        method = "prompt lookup" if self.drafter is None else "draft model"
        return {"method": method,
                **({**self.drafter.status(), "by_source": {k: {"proposed_tokens": p, "accepted_tokens": a}
                                                            for k, (p, a) in self.by_source.items()}}
                   if self.drafter is not None else {}),
                **({"draft_note": self.draft_note} if self.draft_note else {}),
                "max_draft": self.max_draft, "steps": self.steps,
                "speculative_steps": self.speculative_steps, "proposed_tokens": self.proposed,
                "accepted_tokens": self.accepted,
                "acceptance": round(self.accepted / self.proposed, 3) if self.proposed else None,
                "plain_step_s": {r: round(t, 5) for r, t in sorted(self.plain_s.items())},
                "verify_step_s": {f"{r}x{w}": round(t, 5) for (r, w), t in sorted(self.verify_s.items())}}


def propose(context: list[int], k: int, max_n: int = 4, min_n: int = 2) -> list[int]:
    """k tokens that followed the latest earlier occurrence of the context's last n tokens (the
    longest n from max_n down to min_n that occurred before); [] if none did. A continuation that
    runs into the end goes on copying itself, as a loop does (LZ77's overlapping copy)."""
    start = continuation(context, max_n, min_n) if k >= 1 else None
    return [] if start is None else copy_from(context, start, k)


def continuation(context: list[int], max_n: int, min_n: int, follow: Optional[int] = None) -> Optional[int]:
    """Where in `context` the tokens to guess next start: just after an earlier occurrence of its last
    n tokens. With `follow` (where the row's copy of earlier text stood: see RowState.copy_pointer),
    first the nearest occurrence of its last n tokens (n down to 1) ending within FOLLOW tokens past
    it: after a rename the copy resumes there, where the latest occurrence of the new name's tokens
    is the instruction or an earlier line, and a common n-gram ("self.") is found at its own place
    in the text being copied. Then the latest occurrence, longest n from max_n down to min_n."""
    a = np.asarray(context, dtype=np.int64)
    size = len(a)
    if size <= min_n:
        return None
    if follow is not None:
        for n in range(min(max_n, size - 1), 0, -1):
            found = _starts_after_tail(a, n, max(follow, n), min(follow + FOLLOW, size - 1))
            if found.size:
                return int(found[0])
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        found = _starts_after_tail(a, n, n, size - 1)
        if found.size:
            return int(found[-1])
    return None


def _starts_after_tail(a: np.ndarray, n: int, lo: int, hi: int) -> np.ndarray:
    """The places s in [lo, hi] just after an earlier occurrence of a's last n tokens (a[s - n:s]
    equals them; s = len(a), the tail itself, is never in range), in order."""
    if lo > hi:
        return np.empty(0, dtype=np.int64)
    hits = np.ones(hi - lo + 1, dtype=bool)
    for j in range(n):
        hits &= a[lo - n + j:hi - n + j + 1] == a[len(a) - n + j]
    return lo + np.flatnonzero(hits)


def copy_from(context: list[int], start: int, k: int) -> list[int]:
    """k tokens of `context` from `start`; past its end, the copy goes on copying itself."""
    out = list(context[start:start + k])
    while len(out) < k:
        out.append(out[len(out) - (len(context) - start)])
    return out


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
    """Plain batch KV caches, float or quantized (engine/caches/kv_quant.py): trim and the right-padding roll
    take positions off any row's end."""
    from mlx_lm.models.cache import BatchKVCache

    from mlx_nb.engine.caches.kv_quant import BatchQuantizedKV

    return bool(caches) and all(type(c) in (BatchKVCache, BatchQuantizedKV) for c in caches)


def speculable(sampler, processors) -> bool:
    """A row that may speculate: our own sampler, greedy or sampled but not seeded (a seed's draws stay
    the ones it makes without speculation), no logits processors, no logprobs."""
    from mlx_nb.engine.sampling.samplers import TokenSampler

    return (isinstance(sampler, TokenSampler) and not sampler.seeded and not sampler.wants_logprobs
            and not processors)


def accept_sampled(sampler, logits, draft: list[int]) -> tuple[int, int]:
    """(how many of the draft's tokens a sampled row keeps, the token after them), keeping the row's
    distribution: draft token i (proposed with certainty) is kept with the probability p_i the row's
    settings give it, and the first one refused is replaced by a draw from p_i without it
    (speculative sampling with a point-mass draft); after a fully kept draft, a draw from the next p.
    `logits`: the verifying forward's len(draft) + 1 positions of this row."""
    import mlx.core as mx

    probs = sampler.distribution(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
    kept = 0
    if draft:
        chance = probs[mx.arange(len(draft)), mx.array(draft)].tolist()
        draws = sampler.uniform(len(draft)).tolist()
        while kept < len(draft) and draws[kept] < chance[kept]:
            kept += 1
    row = probs[kept]
    if kept < len(draft):
        row = mx.where(mx.arange(row.shape[0]) == draft[kept], 0.0, row)
    return kept, int(mx.random.categorical(mx.log(row)).item())


def plan(spec: PromptLookup, uids: list[int], tokens: list[list[int]], budgets: list[int],
         read_pending: Callable[[], list[int]]) -> Optional[tuple[list[int], list[list[int]]]]:
    """(each row's pending token, each row's proposal) for this step, or None when no row proposes
    or no width pays. A row's lookup reads only its tokens in the cache: what followed their last
    n tokens before is a guess for its pending token and then its proposal. The pending tokens
    (still being computed: reading them waits for the step before) are read only when a width
    pays; a row whose guess for its pending token is wrong proposes nothing. A guess not verified
    is scored against the tokens as they come, so a row's rate follows its text at no cost.
    `budgets[i]`: tokens row i may still give after its pending one."""
    if spec.drafter is not None:
        return _plan_drafts(spec, uids, tokens, budgets, read_pending)
    limit = spec.draft_limit(len(uids))
    guesses = []
    for uid, row, budget in zip(uids, tokens, budgets):
        state = spec.rows.setdefault(uid, RowState())
        state.settle_shadow(row)
        guess = []
        if state.shadow is None and state.due <= spec.steps and limit > 0:
            start = continuation(row, spec.max_ngram, spec.min_ngram, state.copy_pointer(row))
            guess = [] if start is None else copy_from(row, start, min(limit, budget) + 1)
            if len(guess) < 2:
                spec.found_nothing(state)
                guess = []
            else:
                state.failures, state.shadow, state.copying = 0, (len(row), guess), (len(row), start)
        guesses.append(guess)
    if not any(guesses):
        return None
    width = spec.best_width([spec.rows[u].rate if g else 0.0 for u, g in zip(uids, guesses)],
                            [max(len(g) - 1, 0) for g in guesses])
    if not width:
        return None  # the guesses stay shadows, scored as the tokens come
    pending = read_pending()
    drafts = []
    for uid, guess, nxt in zip(uids, guesses, pending):
        if guess:
            spec.rows[uid].shadow = None  # this step verifies it
            if guess[0] != nxt:
                spec.record(uid, 1, 0)
                guess = []
        drafts.append(guess[1:width + 1])
    return (pending, drafts) if any(drafts) else None


def _plan_drafts(spec: PromptLookup, uids: list[int], tokens: list[list[int]], budgets: list[int],
                 read_pending: Callable[[], list[int]]) -> Optional[tuple[list[int], list[list[int]]]]:
    """`plan` with a draft model (engine/speculation/draft.py): the width comes first, from the rows' rates (the
    draft's cost grows with it), then each row whose turn it is proposes that many tokens after its
    pending one: prompt lookup's where the row repeats itself, else the draft's. A row no width pays
    for waits 2, 4, ... 32 steps and is then tried once at the prior rate (its rate is learnt only
    from verified drafts, so a row that once drafted badly would otherwise never draft again); a row
    back at the prior rate stops waiting."""
    limit = spec.draft_limit(len(uids))
    states = [spec.rows.setdefault(u, RowState()) for u in uids]
    due = [st.due <= spec.steps and b > 0 for st, b in zip(states, budgets)]
    if not any(due):
        return None
    for st in states:
        if st.failures and st.rate >= PRIOR_RATE:
            st.failures = 0
    rates = [(PRIOR_RATE if st.failures else st.rate) if d else 0.0 for st, d in zip(states, due)]
    width = spec.best_width(rates, [min(limit, b) if d else 0 for b, d in zip(budgets, due)], pending_known=True)
    for st, d in zip(states, due):
        if d and not width:
            spec.found_nothing(st, DRAFT_BACKOFF)
        elif d and st.failures:  # this step is its one try
            st.due = spec.steps + min(2 ** st.failures, DRAFT_BACKOFF)
    if not width:
        return None
    pending = read_pending()
    drafts = [_lookup_or_draft(spec, u, [*row, p], min(width, b)) if d else []
              for u, row, p, b, d in zip(uids, tokens, pending, budgets, due)]
    return (pending, drafts) if any(drafts) else None


def _lookup_or_draft(spec: PromptLookup, uid: int, context: list[int], k: int) -> list[int]:
    """The row's k guesses after `context` (its tokens, the pending one last): prompt lookup's when its
    last max_ngram tokens occurred before, which costs nothing (text the row repeats: an edit, a
    quote), else the draft's."""
    guess = propose(context, k, spec.max_ngram, spec.max_ngram)  # only a long repeat: a short one is often chance
    source = "lookup" if guess else "draft"
    if not guess:
        guess = spec.drafter.draft(uid, context, k)
    if guess:
        spec.sources[uid] = source
    return guess
