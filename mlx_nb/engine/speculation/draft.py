"""A draft model: a small model of the same tokenizer guesses each speculating row's next tokens.

Prompt lookup (engine/speculation/prompt_lookup.py) guesses only text the conversation already holds. A draft
model guesses any text, at the cost of running it: for each row that speculates, the draft reads
the row's tokens it has not seen and then proposes `k` tokens greedily, one forward of one token
each. Where the row repeats itself (its last few tokens occurred before) the lookup's guess is
taken instead, for free, and the draft catches up on those tokens at its next draft. The served
model verifies every row's proposal in the batch's one forward, as it does prompt lookup's, so a
greedy row's tokens are exactly its tokens without a draft, and a sampled row keeps its
distribution (a greedy draft is a certain proposal: `speculation.accept_sampled`).

Each row keeps its own draft cache (mlx_lm's plain KV cache, one row each: the rows that speculate
are few by the time a step can afford it, see `PromptLookup.row_budget`). What the draft proposed
and the served model refused is cut off its cache at the row's next draft, by comparing the tokens
the cache holds with the row's tokens then. A row's draft cache is dropped when the row leaves.

Refused at load, in one line each: a draft whose vocabulary differs from the model's (its tokens
would mean other text), a vision draft, and a draft whose cache cannot be cut back (SSM state, a
sliding window): a rejected guess must come off it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

PREFILL_CHUNK = 512  # draft tokens read per forward while it catches up on a row's prompt


class DraftRefused(ValueError):
    """This draft cannot serve this model; the message says why and what to pick instead."""


def check_draft(target, draft) -> None:
    """Raise DraftRefused unless `draft` (a LoadedModel) can propose tokens for `target`."""
    from mlx_lm.models.cache import KVCache

    if draft.kind != "text":
        raise DraftRefused(f"draft model {draft.name} is a vision model: pick a text model of {target.name}'s tokenizer")
    mine, theirs = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if mine != theirs:
        raise DraftRefused(f"draft model {draft.name}'s tokenizer differs from {target.name}'s ({len(theirs)} "
                           f"tokens against {len(mine)}): a draft must share the model's tokenizer")
    kinds = {type(c).__name__ for c in draft.make_cache()}
    if kinds != {KVCache.__name__}:
        raise DraftRefused(f"draft model {draft.name} keeps {', '.join(sorted(kinds))} caches, which a rejected "
                           "guess cannot be cut off: pick a draft with plain attention in every layer")


@dataclass
class _Row:
    cache: list
    tokens: list = field(default_factory=list)  # the tokens the cache holds, in order


class DraftModel:
    """The draft's weights and one cache per speculating row (`draft`), dropped as rows leave."""

    def __init__(self, loaded, vocab_size: Optional[int]):
        from mlx_nb.engine.scheduling.memory import weights_bytes

        self.loaded = loaded
        self.weights_bytes = weights_bytes(loaded)  # held beside the model's: the memory budget counts it
        self.vocab_size = vocab_size  # a draft's id past the model's embedding ends its proposal
        self.rows: dict[int, _Row] = {}
        self.drafted = 0  # tokens proposed, over the engine's life

    @property
    def name(self) -> str:
        return self.loaded.name

    def draft(self, uid: int, context: list[int], k: int) -> list[int]:
        """The draft's `k` greedy tokens after `context` (the row's tokens, its pending one last)."""
        import mlx.core as mx
        from mlx_lm.models.cache import trim_prompt_cache

        row = self.rows.get(uid)
        if row is None:
            row = self.rows[uid] = _Row(self.loaded.make_cache())
        same = 0
        for a, b in zip(row.tokens, context):
            if a != b:
                break
            same += 1
        same = min(same, len(context) - 1)  # at least one token is read: its logits give the first guess
        if len(row.tokens) > same:
            trim_prompt_cache(row.cache, len(row.tokens) - same)
        model, fresh = self.loaded.model, context[same:]
        for start in range(0, len(fresh) - 1, PREFILL_CHUNK):  # the catch-up, but for the last token
            chunk = fresh[start:min(start + PREFILL_CHUNK, len(fresh) - 1)]
            model(mx.array([chunk]), cache=row.cache)
            mx.eval([c.state for c in row.cache])
        logits = model(mx.array([fresh[-1:]]), cache=row.cache)
        out = []
        for j in range(k):
            token = int(mx.argmax(logits[0, -1]).item())
            if self.vocab_size is not None and token >= self.vocab_size:
                break
            out.append(token)
            if j + 1 < k:
                logits = model(mx.array([[token]]), cache=row.cache)
        fed = len(out) if len(out) < k else k - 1  # the last guess was never read into the cache
        row.tokens = list(context) + out[:fed]
        self.drafted += len(out)
        return out

    def forget(self, live_uids) -> None:
        for uid in [u for u in self.rows if u not in live_uids]:
            del self.rows[uid]

    def cache_bytes(self) -> int:
        return sum(c.nbytes for row in self.rows.values() for c in row.cache if not c.empty())

    def status(self) -> dict:
        return {"draft_model": self.name, "draft_weights_bytes": self.weights_bytes,
                "draft_rows": len(self.rows), "draft_cache_bytes": self.cache_bytes()}


def load_draft(target, source: str):
    """(a DraftModel for `target`, None) or (None, why not): a draft that cannot serve is left out
    and the model served without it, the reason in its status and the log."""
    from mlx_nb.models import load_model

    try:
        draft = load_model(source)
        check_draft(target, draft)
    except Exception as exc:  # not found, not loadable, or refused by check_draft: one line either way
        return None, f"draft model {source} not used: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return DraftModel(draft, vocab_size(target)), None


def vocab_size(loaded) -> Optional[int]:
    """How many token ids the model's embedding holds, from its config (a vision or wrapped model's
    text config), or None when the config does not say."""
    config = loaded.config
    return config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
