"""PromptBatch (engine/decode.py) on mlx_lm's own prompt batch: when every row's prompt ends in one
step its cache moves to the decode batch instead of being deep-copied; when some rows stay, mlx_lm's
copy still happens; and the per-row fields it empties are exactly the ones mlx_lm's filter keeps
(an mlx_lm that adds one fails here). Tokens batched == alone is the engine's reference tests' job."""

import mlx.core as mx
from mlx_lm.generate import PromptProcessingBatch

from mlx_nb.engine.decode import ROW_FIELDS, DecodeBatch, PromptBatch
from mlx_nb.models import load_model


def batch(cls, loaded, rows: int):
    b = cls(loaded.model, list(range(rows)), [loaded.make_cache() for _ in range(rows)],
            tokens=[[] for _ in range(rows)], samplers=[None] * rows, logits_processors=[[] for _ in range(rows)],
            max_tokens=[8] * rows)  # every per-row field, as BatchGenerator._make_batch gives them
    b.prompt([[1 + r, 2, 3, 4] for r in range(rows)])
    return b


def test_every_row_done_moves_the_cache_and_some_rows_staying_copies_it():
    loaded = load_model("tiny-llama")
    whole = batch(PromptBatch, loaded, 2)
    caches = list(whole.prompt_cache)
    moved = whole.split([1, 0])
    assert all(a is b for a, b in zip(moved.prompt_cache, caches)) and len(moved.prompt_cache) == len(caches)
    assert moved.uids == [0, 1] and all(getattr(whole, f) == [] for f in ROW_FIELDS)
    decode = moved.generate([[5], [6]])
    assert isinstance(decode, DecodeBatch) and decode.uids == [0, 1]
    assert [t[-1] for t in decode.tokens] == [5, 6]  # the last prompt tokens read by its first step

    part = batch(PromptBatch, loaded, 2)
    kept = list(part.prompt_cache)
    leaving = part.split([1])
    assert leaving.uids == [1] and part.uids == [0]
    assert all(a is not b for a, b in zip(leaving.prompt_cache, kept))  # mlx_lm's copy for the row that stays
    mx.eval([c.state for c in leaving.prompt_cache], [c.state for c in part.prompt_cache])


def test_the_row_fields_are_mlx_lms():
    loaded = load_model("tiny-llama")
    upstream = batch(PromptProcessingBatch, loaded, 3)
    per_row = {name for name, value in vars(upstream).items() if isinstance(value, list) and len(value) == 3}
    per_row |= {"prompt_cache"}  # one entry a layer, not a row: filter() narrows each to the kept rows
    assert per_row == set(ROW_FIELDS), f"mlx_lm's prompt batch fields changed: {sorted(per_row ^ set(ROW_FIELDS))}"
