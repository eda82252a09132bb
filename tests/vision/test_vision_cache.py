"""RopeDeltaCache has the batching verbs of mlx_lm's caches, so BatchGenerator carries it row by row."""

import copy

import mlx.core as mx

from mlx_nb.engine.caches.layout import is_batchable
from mlx_nb.models.cache_layout import is_trimmable
from mlx_nb.models.rope_delta_cache import RopeDeltaCache


def rows(c):
    return c.deltas.reshape(-1).tolist()


def test_rope_delta_cache_verbs():
    a, b, c = RopeDeltaCache.of(-2), RopeDeltaCache.of(0), RopeDeltaCache.of(mx.array([[-5]]))
    batch = a.merge([a, b, c])  # BatchGenerator calls merge on the first row's object
    assert rows(batch) == [-2, 0, -5] and batch.deltas.dtype == mx.int32
    batch.filter([0, 2])
    assert rows(batch) == [-2, -5]
    batch.extend(RopeDeltaCache.merge([RopeDeltaCache()]))  # a fresh cache is one text row
    assert rows(batch) == [-2, -5, 0]
    assert rows(batch.extract(1)) == [-5]
    batch.prepare(lengths=[1, 1, 1], right_padding=[0, 0, 0])
    batch.finalize()
    twin = copy.deepcopy(batch)  # BatchGenerator deep-copies caches when it splits a prompt batch
    assert rows(RopeDeltaCache.from_state(twin.state)) == [-2, -5, 0]
    assert is_batchable(batch) and not is_trimmable(batch) and batch.size() == 0 and not batch.empty()
    assert batch.nbytes == 12
