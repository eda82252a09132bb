"""The sampler kernel: argmax at temperature 0, and otherwise the inverse CDF of mlx_lm's filtered,
tempered distribution (top-p, then min-p, then top-k, on the untempered probabilities), each row
with its own settings in one call."""

import mlx.core as mx
import numpy as np
import pytest


def _distribution(logits, temp, top_p, top_k, min_p):
    """mlx_lm's make_sampler distribution in float64 (ties broken by the lower id, as the kernel)."""
    x = np.asarray(logits, np.float64)
    p = np.exp(x - x.max())
    keep = np.ones_like(p, bool)
    order = sorted(range(len(p)), key=lambda i: (-p[i], i))
    if 0 < top_p < 1:
        above, total = 0.0, p.sum()
        for rank, i in enumerate(order):
            if above >= top_p * total:
                keep[i] = False
            above += p[i]
    if min_p > 0:
        keep &= p >= min_p
    if 0 < top_k < len(p):
        kept = [i for i in order if keep[i]][:top_k]
        keep[:] = False
        keep[kept] = True
    w = np.where(keep, np.exp((x - x.max()) / temp), 0.0)
    return w / w.sum()


SETTINGS = [(1.0, 1.0, 0, 0.0), (0.7, 0.9, 0, 0.0), (1.3, 1.0, 5, 0.0), (0.5, 1.0, 0, 0.05), (0.8, 0.6, 7, 0.02),
            (2.0, 0.95, 0, 0.0)]


def test_temperature_zero_is_argmax(native):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 1000)).astype(np.float32)
    zeros = mx.zeros((6,))
    got = native.sample(mx.array(logits), temperature=zeros, top_p=mx.ones((6,)), top_k=mx.zeros((6,), mx.int32),
                        min_p=zeros, uniform=mx.full((6,), 0.5))
    assert np.array_equal(np.asarray(got), logits.argmax(-1))


def test_draws_follow_mlx_lm_distribution(isa, native):
    rng = np.random.default_rng(1)
    vocab, grid = 60, 2000
    logits = (rng.standard_normal((len(SETTINGS), vocab)) * 2).astype(np.float32)
    u = (np.arange(grid) + 0.5) / grid
    rows = np.repeat(logits, grid, axis=0)
    cols = lambda i: np.repeat(np.array([s[i] for s in SETTINGS]), grid)  # noqa: E731
    got = np.asarray(native.sample(
        mx.array(rows), temperature=mx.array(cols(0), mx.float32), top_p=mx.array(cols(1), mx.float32),
        top_k=mx.array(cols(2), mx.int32), min_p=mx.array(cols(3), mx.float32),
        uniform=mx.array(np.tile(u, len(SETTINGS)), mx.float32))).reshape(len(SETTINGS), grid)
    for r, (temp, top_p, top_k, min_p) in enumerate(SETTINGS):
        p = _distribution(logits[r], temp, top_p, top_k, min_p)
        cdf = np.cumsum(p)
        want = np.minimum(np.searchsorted(cdf, u, side="right"), vocab - 1)
        near_edge = np.abs(cdf[np.clip(want - 1, 0, None)] - u) < 1e-5
        assert np.all((got[r] == want) | near_edge), (temp, top_p, top_k, min_p)
        assert set(got[r]) <= set(np.flatnonzero(p))  # never a filtered token


@pytest.mark.parametrize("vocab", [1, 2, 49152])
def test_any_vocabulary_size(native, vocab):
    logits = mx.array(np.random.default_rng(vocab).standard_normal((2, vocab)).astype(np.float32))
    got = native.sample(logits, temperature=mx.array([0.0, 1.0]), top_p=mx.array([1.0, 0.5]),
                        top_k=mx.array([0, 3], mx.int32), min_p=mx.array([0.0, 0.1]), uniform=mx.array([0.3, 0.999]))
    assert got.shape == (2,) and all(0 <= t < vocab for t in np.asarray(got))
