"""Attention over a quantized KV cache (`quantized_attention`, csrc/attn_block.h) against float64
NumPy on every instruction set: the keys and values unpacked from MLX's words by NumPy's own bit
operations, 4 and 8 bits, every group size that divides the head, odd sizes, every mask kind, keys
as the strided views a cache hands out; and each query row the same bit for bit alone, left-padded
in a batch, and among other rows of a prompt chunk."""

import mlx.core as mx
import numpy as np
import pytest
import kernel_reference as ref

SHAPES = [(2, 6, 2, 1, 37, 64), (1, 4, 4, 5, 9, 32), (3, 9, 3, 7, 70, 64), (1, 2, 1, 1, 1, 128), (1, 8, 2, 33, 130, 96)]


def _close(got, want, tol=2e-5):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= tol * (np.abs(want).max() + 1e-30)


def unpack(words, scales, biases, bits: int, group: int) -> np.ndarray:
    """MLX's affine quantization read back in float64: value i of a uint32 word at bits [bits*i, bits*(i+1))."""
    w = np.asarray(words).astype(np.uint64)
    per = 32 // bits
    q = (w[..., None] >> (np.arange(per, dtype=np.uint64) * bits)) & ((1 << bits) - 1)
    q = q.reshape(*w.shape[:-1], -1).astype(np.float64)
    s = np.repeat(np.asarray(scales, np.float64), group, axis=-1)
    b = np.repeat(np.asarray(biases, np.float64), group, axis=-1)
    return q * s + b


def _cache(rng, b, hk, s, d, bits, group, extra=5):
    """Quantized keys or values as a cache holds them: slices of a longer buffer."""
    full = mx.quantize(mx.array(rng.standard_normal((b, hk, s + extra, d)).astype(np.float32)), group_size=group, bits=bits)
    view = tuple(a[:, :, :s] for a in full)
    return view, unpack(*view, bits, group)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("b,h,hk,l,s,d", SHAPES)
def test_quantized_attention_against_numpy(isa, native, bits, b, h, hk, l, s, d):
    rng = np.random.default_rng(b * 1000 + s * 10 + bits)
    for group in [g for g in (32, 64, 128) if d % g == 0]:
        q = rng.standard_normal((b, h, l, d)).astype(np.float32)
        (k, kn), (v, vn) = _cache(rng, b, hk, s, d, bits, group), _cache(rng, b, hk, s, d, bits, group)

        def run(**kw):
            return native.quantized_attention(mx.array(q), *k, *v, scale=0.2, bits=bits, group_size=group, **kw)

        _close(run(), ref.attention(q, kn, vn, 0.2))
        if l <= s:
            _close(run(causal=True), ref.attention(q, kn, vn, 0.2, causal=True))
        keep = rng.uniform(size=(b, 1, l, s)) > 0.3
        keep[..., 0] = True
        _close(run(mask=mx.array(keep)), ref.attention(q, kn, vn, 0.2, mask=keep))
        strided = mx.array(np.ascontiguousarray(keep.transpose(0, 1, 3, 2))).transpose(0, 1, 3, 2)
        _close(run(mask=strided), ref.attention(q, kn, vn, 0.2, mask=keep))
        add = rng.standard_normal((l, s)).astype(np.float32)
        _close(run(mask=mx.array(add)), ref.attention(q, kn, vn, 0.2, mask=add))


@pytest.mark.parametrize("bits", [0, 4, 8])  # 0: float keys and values (the same blocks)
def test_a_row_is_the_same_alone_left_padded_and_among_a_chunks_rows(isa, native, bits):
    rng = np.random.default_rng(5 + bits)
    h, hk, s, d, pad, group = 6, 2, 150, 64, 70, 32
    keys = mx.array(rng.standard_normal((1, hk, pad + s, d)).astype(np.float32))
    vals = mx.array(rng.standard_normal((1, hk, pad + s, d)).astype(np.float32))
    kq = (keys,) if bits == 0 else mx.quantize(keys, group_size=group, bits=bits)
    vq = (vals,) if bits == 0 else mx.quantize(vals, group_size=group, bits=bits)
    own_k, own_v = (tuple(a[:, :, pad:] for a in t) for t in (kq, vq))
    q = mx.array(rng.standard_normal((1, h, 5, d)).astype(np.float32))

    def attend(qr, k, v, **kw):
        if bits == 0:
            return np.asarray(native.attention(qr, *k, *v, scale=0.125, **kw))
        return np.asarray(native.quantized_attention(qr, *k, *v, scale=0.125, bits=bits, group_size=group, **kw))

    chunk = attend(q, own_k, own_v, causal=True)  # five query rows, the last five positions
    keep = np.ones((1, 1, 1, pad + s), bool)
    keep[..., :pad] = False
    for row in range(5):
        limit = s - 5 + row + 1
        alone = attend(q[:, :, row:row + 1], tuple(a[:, :, :limit] for a in own_k), tuple(a[:, :, :limit] for a in own_v))
        assert np.array_equal(alone[0, 0], chunk[0, row]), row
        if row == 4:  # the same row behind 70 masked keys of padding, in a batch of three
            batch_q = mx.concatenate([q[:, :, 4:5]] * 3)
            batch_k, batch_v = (tuple(mx.concatenate([a] * 3) for a in t) for t in (kq, vq))
            padded = attend(batch_q, batch_k, batch_v, mask=mx.array(np.concatenate([keep] * 3)))
            assert all(np.array_equal(alone[0], p) for p in padded)


def test_bad_arguments_are_refused_in_one_line(native):
    q = mx.zeros((1, 2, 1, 32))
    k = mx.quantize(mx.zeros((1, 1, 4, 32)), group_size=32, bits=8)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        native.quantized_attention(q, *k, *k, scale=1.0, bits=3, group_size=32)
    with pytest.raises(ValueError, match="words must be uint32"):
        native.quantized_attention(q, *k, *k, scale=1.0, bits=4, group_size=32)
    with pytest.raises(ValueError, match="the mask must broadcast"):
        native.quantized_attention(q, *k, *k, scale=1.0, bits=8, group_size=32, mask=mx.ones((3, 4), dtype=mx.bool_))
