"""PromptBatch (engine/batch/decode.py) on mlx_lm's own prompt batch: when every row's prompt ends in one
step its cache moves to the decode batch instead of being deep-copied; when some rows stay, mlx_lm's
copy still happens; and the per-row fields it empties are exactly the ones mlx_lm's filter keeps
(an mlx_lm that adds one fails here). Tokens batched == alone is the engine's reference tests' job."""

import mlx.core as mx
import pytest
from mlx_lm.generate import PromptProcessingBatch

from mlx_nb.engine.batch.decode import ROW_FIELDS, DecodeBatch, PromptBatch
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


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3.5", "tiny-gemma3", "tiny-falcon-h1"])
def test_a_decode_step_starts_only_the_next_steps_first_layers_and_tokens_stay_the_same(name, monkeypatch):
    """A step hands its tokens out with only the next step's first layers started (the rest waits
    in `_pending` until the next step begins, a joining batch's rest comes along, and a batch left
    without rows drops it), over every kind of cache; the tokens are those of steps handed to MLX
    whole."""
    import mlx_nb.engine.batch.decode as decode_module

    loaded = load_model(name)

    def run(early: bool) -> list:
        if not early:
            monkeypatch.setattr(decode_module, "early_layers", lambda cache: [])
        first = batch(PromptBatch, loaded, 2).generate([[5], [6]])
        assert (first._pending is not None) == early
        joining = batch(PromptBatch, loaded, 1).generate([[7]])
        first.extend(joining)  # the joining row's first step goes on with the batch's
        assert joining._pending is None and (first._pending is not None) == early
        out = []
        for _ in range(6):
            out.append([(r.uid, r.token) for r in first.next()])
            assert (first._pending is not None) == early
        first.filter([])  # every row gone: nothing is left to compute
        assert first._pending is None
        monkeypatch.undo()
        return out

    assert decode_module.early_layers(batch(PromptBatch, loaded, 1).generate([[5]]).prompt_cache)
    assert run(early=True) == run(early=False)
