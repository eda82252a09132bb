"""The float kernels (RMSNorm, RoPE, the SiLU gates, the softmax family, GELU, attention, q/k/v split)
against float64 NumPy on every instruction set, with odd sizes; and each row's result the same
alone and in a batch."""

import mlx.core as mx
import numpy as np
import pytest
import kernel_reference as ref

SIZES = [1, 7, 16, 33, 100, 576, 1000]


def _close(got, want, tol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= tol * (np.abs(want).max() + 1e-30)


@pytest.mark.parametrize("n", SIZES)
def test_row_ops(isa, native, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((3, n)) * 4).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    up = rng.standard_normal((3, n)).astype(np.float32)
    _close(native.rms_norm(mx.array(x), mx.array(w), 1e-5), ref.rms_norm(x, w, 1e-5), 1e-5)
    _close(native.silu_mul(mx.array(x), mx.array(up)), ref.silu(x) * up, 1e-5)
    _close(native.silu_gate(mx.array(np.concatenate([x, up], -1))), ref.silu(x) * up, 1e-5)
    _close(native.softmax(mx.array(x)), ref.softmax(x), 1e-5)
    _close(native.logsumexp(mx.array(x)), ref.logsumexp(x), 1e-6)
    _close(native.log_softmax(mx.array(x)), x - ref.logsumexp(x), 1e-5)
    e = np.clip(x, -80, 80)
    _close(native.exp(mx.array(e)), np.exp(e.astype(np.float64)), 1e-6)
    _close(native.gelu(mx.array(x)), gelu64(x), 1e-6)


def gelu64(x):
    """The exact GELU in float64 (math.erf)."""
    import math

    x = np.asarray(x, np.float64)
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


@pytest.mark.parametrize("rows", [1, 2, 7, 33, 64])
def test_gelu_rows_match_float64_and_each_row_is_the_same_alone(isa, native, rows):
    rng = np.random.default_rng(rows)
    x = (rng.standard_normal((rows, 37)) * 3).astype(np.float32)
    batch = np.asarray(native.gelu(mx.array(x)))
    _close(batch, gelu64(x), 1e-6)
    for r in range(rows):
        assert np.array_equal(np.asarray(native.gelu(mx.array(x[r:r + 1])))[0], batch[r])


def test_gelu_elementwise_error_over_its_whole_range(isa, native):
    """Every value from -12 to 12 (and a few far out) within 1e-7 |x| of float64, plus a float's
    rounding: the erfc approximation's error (<= 1.5e-7, halved) scaled by x, as the next layer's sum
    sees it (a negative x's tiny GELU is not held to its own relative precision)."""
    x = np.concatenate([np.linspace(-12, 12, 48001), [-1e4, -50.0, -0.0, 0.0, 1e-30, 50.0, 1e4]]).astype(np.float32)
    got = np.asarray(native.gelu(mx.array(x[None])), np.float64)[0]
    want = gelu64(x)
    assert np.all(np.abs(got - want) <= 1e-7 * np.maximum(1, np.abs(x)) + 2 * np.spacing(np.abs(want).astype(np.float32)))
    assert np.all(np.isfinite(got))


def test_masked_entries_are_exact_zeros(native):
    x = np.array([[0.0, -np.inf, 1.0, -1e30, 2.0]], np.float32)
    p = np.asarray(native.softmax(mx.array(x)))
    assert p[0, 1] == 0.0 and p[0, 3] == 0.0
    assert np.isfinite(np.asarray(native.log_softmax(mx.array(x)))[0, [0, 2, 4]]).all()
    assert np.array_equal(np.asarray(native.softmax(mx.array(np.full((1, 4), -np.inf, np.float32)))), np.zeros((1, 4)))


def test_elementwise_result_does_not_depend_on_position(isa, native):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(37).astype(np.float32)
    alone = np.asarray(native.exp(mx.array(x[None, :5])))
    for start in range(0, 30, 3):  # the same values at every offset of a longer row
        row = np.concatenate([rng.standard_normal(start).astype(np.float32), x[:5]])
        assert np.array_equal(np.asarray(native.exp(mx.array(row[None])))[0, start:], alone[0])


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims,head_dim", [(64, 64), (32, 64), (16, 24)])
def test_rope(isa, native, traditional, dims, head_dim):
    rng = np.random.default_rng(dims + head_dim)
    x = rng.standard_normal((3, 4, 5, head_dim)).astype(np.float32)
    for offset in (mx.array(0, dtype=mx.int32), mx.array(17, dtype=mx.int32), mx.array([3, 0, 250], dtype=mx.int32)):
        got = native.rope(mx.array(x), dims, traditional=traditional, base=10000.0, scale=0.5, offset=offset)
        _close(got, ref.rope(x, dims, traditional, 10000.0, 0.5, np.asarray(offset)), 2e-5)
        want = mx.fast.rope(mx.array(x), dims, traditional=traditional, base=10000.0, scale=0.5, offset=offset)
        _close(got, want, 2e-5)
    freqs = rng.uniform(1, 100, dims // 2).astype(np.float32)
    got = native.rope(mx.array(x), dims, traditional=traditional, base=None, scale=1.0,
                      offset=mx.array(5, dtype=mx.int32), freqs=mx.array(freqs))
    _close(got, ref.rope(x, dims, traditional, None, 1.0, 5, freqs), 2e-5)


def test_qkv_rope_splits_heads(native):
    rng = np.random.default_rng(2)
    b, l, h, hk, d = 2, 3, 6, 2, 32
    qkv = rng.standard_normal((b, l, (h + 2 * hk) * d)).astype(np.float32)
    off = np.array([4, 9], np.int32)
    q, k, v = native.qkv_rope([mx.array(qkv)], heads=h, kv_heads=hk, head_dim=d, dims=d, traditional=True,
                              base=10000.0, scale=1.0, offset=mx.array(off))
    heads = qkv.reshape(b, l, h + 2 * hk, d).transpose(0, 2, 1, 3)
    _close(q, ref.rope(heads[:, :h], d, True, 10000.0, 1.0, off), 2e-5)
    _close(k, ref.rope(heads[:, h:h + hk], d, True, 10000.0, 1.0, off), 2e-5)
    assert np.array_equal(np.asarray(v), heads[:, h + hk:])
    # given as parts side by side (a Stacked projection's outputs), the same arrays come out
    bounds = [0, 2 * d, (h + hk) * d, (h + 2 * hk) * d]
    parts = [mx.array(qkv[..., a:b]) for a, b in zip(bounds, bounds[1:])]
    split = native.qkv_rope(parts, heads=h, kv_heads=hk, head_dim=d, dims=d, traditional=True, base=10000.0,
                            scale=1.0, offset=mx.array(off))
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(split, (q, k, v)))
    with pytest.raises(ValueError, match="multiple of head_dim"):
        native.qkv_rope([mx.array(qkv[..., :5]), mx.array(qkv[..., 5:])], heads=h, kv_heads=hk, head_dim=d, dims=d,
                        traditional=True, base=10000.0, scale=1.0, offset=mx.array(off))


@pytest.mark.parametrize("held", [False, True])
def test_qkv_rope_writes_into_the_caches_in_place_unless_another_array_holds_them(native, held):
    """With caches, k and v come back as the caches with the new keys and values written at
    `write_at`, everything else as it was; in the caches' own buffers when nothing else holds them
    (no copy counted), else in a copy, and the array still held is left unchanged."""
    rng = np.random.default_rng(3)
    b, l, h, hk, d, s, at = 2, 3, 4, 2, 16, 40, 11
    qkv = rng.standard_normal((b, l, (h + 2 * hk) * d)).astype(np.float32)
    kc, vc = (rng.standard_normal((b, hk, s, d)).astype(np.float32) for _ in range(2))
    off = mx.array(np.array([at, at - 4], np.int32))
    args = dict(heads=h, kv_heads=hk, head_dim=d, dims=d, traditional=False, base=10000.0, scale=1.0, offset=off)
    q0, k0, v0 = (np.asarray(a) for a in native.qkv_rope([mx.array(qkv)], **args))
    k_cache, v_cache = mx.array(kc), mx.array(vc)
    mx.eval(k_cache, v_cache)
    kept = (k_cache, v_cache) if held else ()
    before = native.qkv_rope_cache_copies()
    q, k_cache, v_cache = native.qkv_rope([mx.array(qkv)], k_cache=k_cache, v_cache=v_cache, write_at=at, **args)
    mx.eval(q, k_cache, v_cache)
    assert native.qkv_rope_cache_copies() - before == (2 if held else 0)
    want_k, want_v = kc.copy(), vc.copy()
    want_k[:, :, at:at + l], want_v[:, :, at:at + l] = k0, v0
    assert np.array_equal(np.asarray(q), q0)
    assert np.array_equal(np.asarray(k_cache), want_k) and np.array_equal(np.asarray(v_cache), want_v)
    if held:
        assert np.array_equal(np.asarray(kept[0]), kc) and np.array_equal(np.asarray(kept[1]), vc)
    with pytest.raises(ValueError, match="must fit"):
        native.qkv_rope([mx.array(qkv)], k_cache=k_cache, v_cache=v_cache, write_at=s - 2, **args)
    with pytest.raises(ValueError, match="float32"):
        native.qkv_rope([mx.array(qkv)], k_cache=k_cache.astype(mx.float16), v_cache=v_cache, write_at=0, **args)


def test_attention_reads_only_the_first_kv_len_keys(native):
    rng = np.random.default_rng(4)
    q, k, v = (mx.array(rng.standard_normal(shape).astype(np.float32))
               for shape in ((2, 4, 3, 16), (2, 2, 20, 16), (2, 2, 20, 16)))
    keep = mx.array(rng.random((2, 1, 3, 9)) < 0.7)
    for kw in (dict(), dict(causal=True), dict(mask=keep)):
        got = native.attention(q, k, v, scale=0.25, kv_len=9, **kw)
        want = native.attention(q, k[:, :, :9], v[:, :, :9], scale=0.25, **kw)
        assert np.array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(ValueError, match="kv_len"):
        native.attention(q, k, v, scale=0.25, kv_len=21)


@pytest.mark.parametrize("b,h,hk,l,s,d", [(2, 6, 2, 1, 37, 64), (1, 4, 4, 5, 9, 32), (3, 9, 3, 7, 7, 24), (1, 2, 1, 1, 1, 16)])
def test_attention(isa, native, b, h, hk, l, s, d):
    rng = np.random.default_rng(b * 100 + s)
    q = rng.standard_normal((b, h, l, d)).astype(np.float32)
    # keys and values as a cache hands them out: a strided slice of a longer buffer
    kbuf = rng.standard_normal((b, hk, s + 5, d)).astype(np.float32)
    vbuf = rng.standard_normal((b, hk, s + 5, d)).astype(np.float32)
    k, v = mx.array(kbuf)[:, :, :s], mx.array(vbuf)[:, :, :s]
    kn, vn = kbuf[:, :, :s], vbuf[:, :, :s]
    _close(native.attention(mx.array(q), k, v, scale=0.2), ref.attention(q, kn, vn, 0.2), 2e-5)
    _close(native.attention(mx.array(q), k, v, scale=0.2, causal=True), ref.attention(q, kn, vn, 0.2, causal=True), 2e-5)
    keep = rng.uniform(size=(b, 1, l, s)) > 0.3
    keep[..., 0] = True
    _close(native.attention(mx.array(q), k, v, scale=0.2, mask=mx.array(keep)),
           ref.attention(q, kn, vn, 0.2, mask=keep), 2e-5)
    strided = mx.array(np.ascontiguousarray(keep.transpose(0, 1, 3, 2))).transpose(0, 1, 3, 2)  # a view
    _close(native.attention(mx.array(q), k, v, scale=0.2, mask=strided), ref.attention(q, kn, vn, 0.2, mask=keep), 2e-5)
    add = rng.standard_normal((l, s)).astype(np.float32)
    _close(native.attention(mx.array(q), k, v, scale=0.2, mask=mx.array(add)), ref.attention(q, kn, vn, 0.2, mask=add), 2e-5)
    with pytest.raises(ValueError, match="the mask must broadcast"):
        native.attention(mx.array(q), k, v, scale=0.2, mask=mx.ones((l + 1, s), dtype=mx.bool_))


def test_attention_row_ignores_left_padding_exactly(isa, native):
    """A row of a batch whose keys are left-padded (and masked) gives bit for bit what it gives alone."""
    rng = np.random.default_rng(9)
    h, hk, s, d, pad = 4, 2, 23, 64, 6
    q = mx.array(rng.standard_normal((1, h, 1, d)).astype(np.float32))
    k = rng.standard_normal((1, hk, s, d)).astype(np.float32)
    v = rng.standard_normal((1, hk, s, d)).astype(np.float32)
    alone = np.asarray(native.attention(q, mx.array(k), mx.array(v), scale=0.125))
    kp = np.concatenate([rng.standard_normal((1, hk, pad, d)).astype(np.float32), k], axis=2)
    vp = np.concatenate([rng.standard_normal((1, hk, pad, d)).astype(np.float32), v], axis=2)
    keep = np.ones((1, 1, 1, s + pad), bool)
    keep[..., :pad] = False
    padded = np.asarray(native.attention(q, mx.array(kp), mx.array(vp), scale=0.125, mask=mx.array(keep)))
    assert np.array_equal(alone, padded)
