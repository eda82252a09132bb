"""Our decode step: mlx_lm's BatchGenerator with its decode batch's `_step` replaced by one that
does only the work a request asked for.

mlx_lm's `GenerationBatch._step` normalizes every row's logits over the whole vocabulary
(`logits - logsumexp(logits)`) each step and hands the result to per-row samplers; on the CPU that
normalization and MLX's Gumbel-max categorical cost more than the model's own forward at 32 rows.
`DecodeBatch._step` keeps the rest of the step as it is (forward, logits processors, the async
pipelining, the bookkeeping the batch's other methods read) and:
- computes log-probabilities only for rows that want them (`logprobs` requests and callers' own
  samplers, which take log-probabilities), with the CPU kernels' log-softmax when they are built;
- samples every row holding a `TokenSampler` in one call: argmax at temperature 0, else the kernels'
  sampler (mlx_lm's top-p / min-p / top-k semantics, one uniform draw per row; a seeded request
  draws from its own key), and MLX's ops for these rows when the kernels are not built.
A request's first token is sampled by the same step: `PromptBatch.generate` starts the rows whose
prompts end as a DecodeBatch (mlx_lm's starts a plain GenerationBatch, normalizing every row over
the vocabulary once more). When every row of the prompt batch ends in the same step (a lone chat,
a burst of short ones), `PromptBatch.split` hands its cache over instead of deep-copying it: mlx_lm
copies the cache for the rows that stay, and here none do.

Each step's tokens go out as soon as the step has made them. mlx_lm hands the next step's whole
graph to `mx.async_eval` before reading this step's tokens, and MLX holds that call until most of
the next step has run (it keeps only a few tasks queued): every token, the first and the last
included, went out ~3/4 of a step late. `_step` starts only the next step's first layers
(`early_layers`) and hands the rest over when the next step begins, while those layers run.

Both batches build their forward inside `adapter_rows`, so a row whose request names a LoRA
adapter gets that adapter's terms (models/lora.py).
"""

from __future__ import annotations

import time
from typing import Optional

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch, PromptProcessingBatch

from mlx_nb.engine.sampling.samplers import TokenSampler
from mlx_nb.engine.speculation.prompt_lookup import (
    PromptLookup,
    accept_sampled,
    cache_can_cut_back,
    cut_back,
    plan,
    speculable,
)
from mlx_nb.kernels import ops
from mlx_nb.models.lora import adapter_rows

_log_softmax = ops.log_softmax


def sample_rows(logits: mx.array, samplers: list, logprobs: Optional[mx.array]) -> mx.array:
    """One token id per row: `samplers[e]` for row e (a TokenSampler, or any mlx_lm sampler, which
    gets that row's log-probabilities)."""
    rows = logits.shape[0]
    native = [e for e, s in enumerate(samplers) if isinstance(s, TokenSampler)]
    tokens = [None] * rows
    if native:
        picked = logits if len(native) == rows else logits[mx.array(native)]
        ts = [samplers[e] for e in native]
        if all(s.temperature == 0 for s in ts):
            out = mx.argmax(picked, axis=-1)
        else:
            def each_row():  # MLX's ops: each row's own sampler on its log-probabilities
                norm = _log_softmax(picked)
                return mx.concatenate([s(norm[i:i + 1]) for i, s in enumerate(ts)])

            out = ops.sample(
                picked,
                temperature=mx.array([s.temperature for s in ts], dtype=mx.float32),
                top_p=mx.array([s.top_p for s in ts], dtype=mx.float32),
                top_k=mx.array([s.top_k for s in ts], dtype=mx.int32),
                min_p=mx.array([s.min_p for s in ts], dtype=mx.float32),
                uniform=lambda: _uniforms(ts),
                fallback=each_row,
            )
        if len(native) == rows:
            return out.astype(mx.uint32)
        for i, e in enumerate(native):
            tokens[e] = out[i:i + 1]
    for e, s in enumerate(samplers):
        if tokens[e] is None:
            tokens[e] = s(logprobs[e:e + 1])
    return mx.concatenate([t.astype(mx.uint32) for t in tokens])


def _uniforms(ts: list[TokenSampler]) -> mx.array:
    """One uniform number per row: one draw for the unseeded rows, each seeded row from its own key."""
    if not any(s.seeded for s in ts):
        return mx.random.uniform(shape=(len(ts),))
    shared = mx.random.uniform(shape=(len(ts),))
    return mx.concatenate([s.uniform(1) if s.seeded else shared[i:i + 1] for i, s in enumerate(ts)])


EARLY_LAYERS = 8  # a step's first 1/EARLY_LAYERS of the layers start before its tokens go out


def early_layers(cache: list) -> list:
    """The arrays a step writes into the cache of a layer about an eighth of the way in: what the
    step's first layers compute.

    MLX's `async_eval` holds its caller while more than a few tasks are queued, so handing it a
    whole decode step (a few hundred ops) returns only when most of that step has run. Handed
    these arrays first, the step starts at once and the batch's tokens go out as soon as the
    previous step has made them; the rest follows when the next step begins (`dispatch_pending`),
    while the first layers run. [] when no layer holds arrays to start from."""
    if not cache:
        return []
    return _arrays_of(cache[max(0, len(cache) // EARLY_LAYERS - 1)])


def _arrays_of(layer) -> list:
    members = getattr(layer, "caches", None)
    if members is not None:  # CacheList
        return [a for m in members for a in _arrays_of(m)]
    keys = getattr(layer, "keys", None)
    if isinstance(keys, mx.array):
        return [keys]
    if isinstance(keys, (tuple, list)):  # a quantized cache's (q, scales, biases)
        return [a for a in keys if isinstance(a, mx.array)]
    state = getattr(layer, "cache", None)  # ArraysCache: SSM / conv state
    return [a for a in state if isinstance(a, mx.array)] if isinstance(state, list) else []


class DecodeBatch(GenerationBatch):
    """mlx_lm's decode batch with our `_step` (see the module docstring); merging, filtering,
    extending and the cache stay mlx_lm's. With `speculation` set (engine/speculation/prompt_lookup.py), a step
    may verify rows' prompt-lookup proposals and give a row several tokens: `next` is mlx_lm's
    bookkeeping (budgets, stop sequences, one Response per token) over each row's run of tokens."""

    speculation: Optional[PromptLookup] = None

    _pending = None  # the rest of the step under way, not yet handed to MLX (see `_step`)

    def dispatch_pending(self) -> None:
        """Hand the rest of the step under way to MLX (it waits while MLX's queue is full)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            mx.async_eval(pending)

    def next(self) -> list:
        self.dispatch_pending()
        if not self.uids:
            return []
        started, rows = time.perf_counter(), len(self.uids)
        runs = self._speculated()
        if self.speculation is not None:  # the step's time goes to the cost model when the next one starts
            kind = ("plain", rows) if runs is None else ("verify", rows, self._verify_width)
            self.speculation.step_started(started, kind)
        if runs is None:
            tokens, logprobs = self._step()
            runs, logprob_runs = [[t] for t in tokens], [[lp] for lp in logprobs]
        else:
            logprob_runs = [[None] * len(run) for run in runs]
        keep, responses = [], []
        for i, uid in enumerate(self.uids):
            finish = None
            for token, logprob in zip(runs[i], logprob_runs[i]):
                self._num_tokens[i] += 1
                if self._num_tokens[i] >= self.max_tokens[i]:
                    finish = "length"
                if self._matchers[i].advance(token):
                    finish = "stop"
                ended = finish is not None
                responses.append(self.Response(uid=uid, token=token, logprobs=logprob, finish_reason=finish,
                                               prompt_cache=self.extract_cache(i) if ended else None,
                                               all_tokens=self.tokens[i] if ended else None))
                if ended:
                    break
            if finish is None:
                keep.append(i)
        if len(keep) < len(self.uids):
            self.filter(keep)
        return responses

    def extend(self, batch) -> None:
        if getattr(batch, "_pending", None) is not None:  # the joining rows' first step goes on with ours
            self._pending = [self._pending, batch._pending] if self._pending is not None else batch._pending
            batch._pending = None
        super().extend(batch)

    def filter(self, keep) -> None:
        super().filter(keep)
        if not keep:  # no row left: the rest of the step never runs (a cache taken from it is computed when read)
            self._pending = None
        drafter = self.speculation.drafter if self.speculation is not None else None
        if drafter is not None:  # a finished row's draft cache goes with it (engine/speculation/draft.py)
            drafter.forget(self.uids)

    def _speculated(self) -> Optional[list[list[int]]]:
        """One verifying step when rows propose tokens (engine/speculation/prompt_lookup.py): each row's run of
        tokens (its pending token, then the proposed ones the model agreed with), or None for a
        plain step. The pending tokens become the first column of the forward; the token after each
        row's kept run (the greedy one, or a sampled row's draw) is its next pending token."""
        spec = self.speculation
        if spec is None:
            return None
        spec.steps += 1
        rows = len(self.uids)
        if spec.draft_limit(rows) < 1:  # a batch this large has no compute to spare
            return None
        if len(spec.rows) > 4 * max(rows, 8):
            spec.forget(self.uids)
        samplers = [self.fallback_sampler if s is None else s for s in (self.samplers or [None] * rows)]
        processors = self.logits_processors or [None] * rows
        if (not any(spec.due(u) for u in self.uids) or not all(speculable(s, p) for s, p in zip(samplers, processors))
                or not cache_can_cut_back(self.prompt_cache)):
            return None
        budgets = [m - n - 1 for m, n in zip(self.max_tokens, self._num_tokens)]
        arrived = []  # when the pending tokens were read: the verifying step's own time starts there

        def read_pending() -> list[int]:
            pending = self._next_tokens.tolist()
            arrived.append(time.perf_counter())
            return pending

        planned = plan(spec, self.uids, self.tokens, budgets, read_pending)
        if planned is None:
            return None
        pending, drafts = planned
        width = max(len(d) for d in drafts)
        self._verify_width = width + 1
        inputs = mx.array([[p, *d, *[p] * (width - len(d))] for p, d in zip(pending, drafts)])
        with adapter_rows(self.model, self.uids):
            logits = self.model(inputs, cache=self.prompt_cache)
        greedy = mx.argmax(logits, axis=-1).tolist()
        runs, bonus, drops = [], [], []
        for i, (uid, p, d, g, s) in enumerate(zip(self.uids, pending, drafts, greedy, samplers)):
            if s.temperature == 0:  # greedy: the run the model's argmax agrees with
                kept = 0
                while kept < len(d) and d[kept] == g[kept]:
                    kept += 1
                after = g[kept]
            else:  # sampled: kept with the probability the row gives it (engine/speculation/prompt_lookup.py)
                kept, after = accept_sampled(s, logits[i, :len(d) + 1].astype(mx.float32), d)
            if d:
                spec.record(uid, len(d), kept)
            runs.append([p, *d[:kept]])
            bonus.append(after)
            drops.append(width - kept)
        cut_back(self.prompt_cache, drops)
        spec.verified(rows, width + 1, time.perf_counter() - arrived[0])
        spec.speculative_steps += 1
        for row, run in zip(self.tokens, runs):
            row.extend(run)
        self._current_tokens = inputs[:, 0]
        self._next_tokens = mx.array(bonus, dtype=mx.uint32)
        self._next_logprobs = [None] * rows
        return runs

    def _step(self):
        self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        inputs = self._current_tokens

        with adapter_rows(self.model, self.uids):  # each row's own LoRA adapter, if it asked for one
            logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]

        token_context = []
        if any(self.logits_processors):
            processed = []
            for e in range(len(self.uids)):
                row = logits[e:e + 1]
                processors = self.logits_processors[e] or ()
                if processors:
                    context = self._token_context[e].update_and_fetch(inputs[e:e + 1])
                    token_context.append(context)
                    for processor in processors:
                        row = processor(context, row)
                processed.append(row)
            logits = mx.concatenate(processed, axis=0)

        samplers = [self.fallback_sampler if s is None else s for s in (self.samplers or [None] * len(self.uids))]
        wants = [not isinstance(s, TokenSampler) or s.wants_logprobs for s in samplers]
        logprobs = _log_softmax(logits) if any(wants) else None

        self._next_tokens = sample_rows(logits, samplers, logprobs)
        self._next_logprobs = [logprobs[e] if w else None for e, w in enumerate(wants)]
        rest = [self._next_tokens, [lp for lp in self._next_logprobs if lp is not None], token_context]

        mx.eval(inputs, [lp for lp in self._current_logprobs if lp is not None])
        inputs = inputs.tolist()
        # The next step's first layers start now; the rest is handed to MLX when the next step
        # begins (see `next`), after this step's tokens have gone out.
        early = early_layers(self.prompt_cache)
        if early:
            mx.async_eval(early)
            self._pending = rest
        else:
            mx.async_eval(rest)
        for sti, ti in zip(self.tokens, inputs):
            sti.append(ti)
        return inputs, self._current_logprobs


# the per-row fields of a prompt batch (what mlx_lm's PromptProcessingBatch.filter keeps or drops)
ROW_FIELDS = ("uids", "prompt_cache", "tokens", "samplers", "logits_processors", "max_tokens", "stop_sequences")


class PromptBatch(PromptProcessingBatch):
    """mlx_lm's prompt batch whose finished rows start decoding as a DecodeBatch, and whose cache
    moves rather than being copied when every row finishes at once (see the module docstring)."""

    def split(self, indices: list[int]):
        if sorted(indices) != list(range(len(self.uids))):
            return super().split(indices)  # some rows stay: mlx_lm copies the cache for them
        moved = self.__class__.__new__(self.__class__)
        moved.__dict__.update(self.__dict__)
        for name in ROW_FIELDS:  # this batch keeps none of them
            setattr(self, name, [])
        return moved

    def prompt(self, tokens: list[list[int]]):
        with adapter_rows(self.model, self.uids):  # each row's own LoRA adapter, if it asked for one
            return super().prompt(tokens)

    def generate(self, tokens: list[list[int]]) -> "DecodeBatch":
        """As mlx_lm's: the prompts but their last tokens read, then a decode batch on those."""
        if any(len(t) > 1 for t in tokens):
            self.prompt([t[:-1] for t in tokens])
        batch = DecodeBatch(self.model, self.uids, mx.array([t[-1] for t in tokens]), self.prompt_cache, self.tokens,
                            self.samplers, self.fallback_sampler, self.logits_processors, self.stop_sequences,
                            self.max_tokens)
        for name in ROW_FIELDS:
            setattr(self, name, [])
        return batch


class Generator(BatchGenerator):
    """mlx_lm's BatchGenerator (prompt batches, merge / filter / extend, stop sequences) whose
    decode batch is a DecodeBatch and whose prompt batch is a PromptBatch. The decode batch is
    created once and every prompt batch that finishes joins it through `extend`.

    mlx_lm starts new prompts while `completion_batch_size` exceeds the decode batch alone; the
    rows still in the prompt batch join it too, so with requests arriving over several steps the
    decode batch outgrew the bound (3 rows with max_batch 2). `_make_batch` counts them."""

    def _make_batch(self, n: int):
        room = self.completion_batch_size - len(self._generation_batch) - len(self._prompt_batch)
        return super()._make_batch(max(0, min(n, room)))

    def park(self, uids: list[int]) -> dict:
        """Take rows out of the batch, keeping what resumes them exactly: {uid: (cache, the tokens it
        holds, the prompt segments still to read)}; put back with those segments, a row goes on as
        if it had never left.

        - A decoding row gives back its last reported token (taken out of its cache): that token is
          its one-token prompt, recomputed, and the row samples on from there; the token it had
          sampled but not reported yet is sampled again (the same one, greedily), its logits
          processors see the tokens they saw.
        - A row still reading its prompt keeps the part it has read (its cache) and the rest to read.
        - A row not started keeps whatever it was inserted with.
        A cache that cannot be cut back (SSM state, a wrapped window) never yields: then no row does."""
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        from mlx_nb.engine.batch.upstream import extracted

        where = self._find_uids(uids)
        if not where:
            return {}
        found = self.extract_cache(list(where))
        decoding = [u for u, (stage, _) in where.items() if stage == 2]
        if not all(can_trim_prompt_cache(extracted(found, uid)[0]) for uid in decoding):
            return {}  # checked before any row leaves: such rows stay in the batch
        rest = {}
        for uid, (stage, i) in where.items():
            if stage == 0:
                rest[uid] = [list(s) for s in self._unprocessed_sequences[i][1]]
            elif stage == 1:
                rest[uid] = [list(s) for s in self._currently_processing[i][0] if len(s)]
        self.remove(list(where))
        out = {}
        for uid in where:
            cache, tokens = extracted(found, uid)
            if uid in rest:
                out[uid] = (cache, tokens, rest[uid])
            else:
                trim_prompt_cache(cache, 1)
                out[uid] = (cache, tokens[:-1], [tokens[-1:]])
        return out

    def __init__(self, model, speculation: Optional[PromptLookup] = None, **kwargs):
        from mlx_nb.engine.batch.upstream_guard import require

        require()  # the private names below are mlx_lm's: a changed mlx_lm fails here, in one line
        super().__init__(model, **kwargs)
        self._prompt_batch = PromptBatch.empty(self.model, self.sampler,
                                               prefill_step_size=self._prompt_batch.prefill_step_size)
        self._generation_batch = DecodeBatch.empty(self.model, self.sampler)
        self._generation_batch.speculation = speculation
