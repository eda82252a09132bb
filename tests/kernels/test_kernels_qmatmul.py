"""The packed quantized matmul and embedding lookup against float64 NumPy, on every instruction set
this CPU runs: shapes with odd sizes, 1..64 rows, 4- and 8-bit weights, group sizes 32..128."""

import mlx.core as mx
import numpy as np
import pytest
import kernel_reference as ref

from mlx_nb.kernels.packing import pack


def _weights(rng, n, k, bits, group_size, half):
    w = mx.array((rng.standard_normal((n, k)) * rng.uniform(0.01, 0.2)).astype(np.float32))
    q, s, b = mx.quantize(w.astype(mx.float16) if half else w, group_size=group_size, bits=bits)
    return q, s.astype(mx.float32), b.astype(mx.float32)


def _cases():
    rng = np.random.default_rng(7)
    for i in range(24):
        bits = (4, 8)[i % 2]
        group_size = (32, 64, 128)[(i // 2) % 3]
        k = group_size * int(rng.integers(1, 6))
        n = int(rng.choice([1, 3, 16, 17, 40, 77, 130]))
        rows = int(rng.choice([1, 2, 3, 4, 5, 7, 9, 16, 33, 64]))
        digits = 1 + (i // 6) % 2
        yield pytest.param(bits, group_size, n, k, rows, i % 3 != 0, digits, i,
                           id=f"q{bits}-g{group_size}-{n}x{k}-m{rows}-d{digits}")


@pytest.mark.parametrize("bits,group_size,n,k,rows,half,digits,seed", list(_cases()))
def test_qmatmul_matches_float64(isa, native, bits, group_size, n, k, rows, half, digits, seed):
    rng = np.random.default_rng(seed)
    w, s, b = _weights(rng, n, k, bits, group_size, half)
    packed, ps, pb = pack(w, s, b, group_size, bits)
    assert ps.dtype == (mx.float16 if half else mx.float32)  # float16 exactly when that is lossless
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 10)).astype(np.float32)
    x[0, :7] = 0.0  # a block with zeros
    got = np.asarray(native.qmatmul(mx.array(x), packed, ps, pb, n=n, group_size=group_size, bits=bits,
                                    digits=digits), np.float64)
    want = ref.qmatmul(x, w, s, b, group_size, bits, digits)
    scale = np.abs(want).max() + 1e-30
    assert np.abs(got - want).max() / scale < 2e-6  # the same arithmetic up to float32 sums
    exact = x.astype(np.float64) @ ref.dequantized(w, s, b, group_size, bits).T
    # x in int8 blocks (llama.cpp's Q8 activations), or two digits: ~15 bits
    assert np.abs(got - exact).max() / scale < (2e-2 if digits == 1 else 2e-4)


@pytest.mark.parametrize("digits", [1, 2])
def test_row_alone_equals_row_in_batches(isa, native, digits):
    rng = np.random.default_rng(3)
    for bits in (4, 8):
        w, s, b = _weights(rng, 70, 256, bits, 64, True)
        packed, ps, pb = pack(w, s, b, 64, bits)
        x = mx.array(rng.standard_normal((32, 256)).astype(np.float32))
        run = lambda rows: np.asarray(native.qmatmul(rows, packed, ps, pb, n=70, group_size=64, bits=bits,  # noqa: E731
                                                     digits=digits))
        alone = np.concatenate([run(x[i:i + 1]) for i in range(32)])
        for size in range(2, 33):
            batched = run(x[:size])
            assert np.array_equal(batched, alone[:size]), f"{bits}-bit, batch of {size}"
        assert np.array_equal(run(x[5:13]), alone[5:13])


def test_leading_dims_and_strided_input(native):
    rng = np.random.default_rng(4)
    w, s, b = _weights(rng, 20, 64, 4, 32, True)
    packed, ps, pb = pack(w, s, b, 32, 4)
    x = mx.array(rng.standard_normal((2, 3, 64)).astype(np.float32))
    y = native.qmatmul(x, packed, ps, pb, n=20, group_size=32, bits=4)
    assert y.shape == (2, 3, 20)
    flat = native.qmatmul(x.reshape(6, 64), packed, ps, pb, n=20, group_size=32, bits=4)
    assert np.array_equal(np.asarray(y).reshape(6, 20), np.asarray(flat))
    xt = mx.array(rng.standard_normal((64, 5)).astype(np.float32)).T  # a transposed view
    assert np.array_equal(np.asarray(native.qmatmul(xt, packed, ps, pb, n=20, group_size=32, bits=4)),
                          np.asarray(native.qmatmul(mx.array(np.asarray(xt)), packed, ps, pb, n=20, group_size=32, bits=4)))
    half = native.qmatmul(x.astype(mx.float16), packed, ps, pb, n=20, group_size=32, bits=4)
    assert half.dtype == mx.float16


@pytest.mark.parametrize("bits", [4, 8])
def test_qgather_rows_match_dequantized(native, bits):
    rng = np.random.default_rng(5)
    w, s, b = _weights(rng, 37, 96, bits, 32, True)
    packed, ps, pb = pack(w, s, b, 32, bits)
    ids = rng.integers(0, 37, size=(3, 5))
    got = np.asarray(native.qgather(mx.array(ids), packed, ps, pb, n=37, k=96, group_size=32, bits=bits), np.float64)
    want = ref.dequantized(w, s, b, 32, bits)[ids]
    assert got.shape == (3, 5, 96)
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()


def test_bad_arguments_say_what_to_do(native):
    rng = np.random.default_rng(6)
    w, s, b = _weights(rng, 16, 64, 4, 32, True)
    packed, ps, pb = pack(w, s, b, 32, 4)
    x = mx.ones((1, 64))
    with pytest.raises(ValueError, match="pack"):
        native.qmatmul(x, packed[:, :1], ps, pb, n=16, group_size=32, bits=4)
    with pytest.raises(ValueError, match="4-, 5-, 6- and 8-bit"):
        native.qmatmul(x, packed, ps, pb, n=16, group_size=32, bits=3)
    with pytest.raises(ValueError, match="positive multiple of 32"):
        native.qmatmul(mx.ones((1, 60)), packed, ps, pb, n=16, group_size=32, bits=4)
    with pytest.raises(ValueError, match="floating"):
        native.qmatmul(mx.ones((1, 64), dtype=mx.int32), packed, ps, pb, n=16, group_size=32, bits=4)


def test_fused_norm_gate_and_residual_equal_the_separate_ops(native):
    """A decoder layer's norm, SiLU gate and skip connection fused into the matmul give exactly what
    the separate kernels give."""
    rng = np.random.default_rng(8)
    w, s, b = _weights(rng, 48, 96, 4, 32, True)
    packed, ps, pb = pack(w, s, b, 32, 4)
    x = mx.array(rng.standard_normal((5, 96)).astype(np.float32))
    gu = mx.array(rng.standard_normal((5, 192)).astype(np.float32))
    nw = mx.array(rng.standard_normal(96).astype(np.float32))
    res = mx.array(rng.standard_normal((5, 48)).astype(np.float32))
    mm = lambda a, **kw: native.qmatmul(a, packed, ps, pb, n=48, group_size=32, bits=4, **kw)  # noqa: E731
    same = lambda a, b: np.array_equal(np.asarray(a), np.asarray(b))  # noqa: E731
    assert same(mm(x, norm_weight=nw, eps=1e-5), mm(native.rms_norm(x, nw, 1e-5)))
    assert same(mm(gu, gate=True), mm(native.silu_gate(gu)))
    assert same(mm(x, residual=res), mm(x) + res)
    assert same(mm(gu, gate=True, residual=res), mm(native.silu_gate(gu)) + res)
    bias = mx.array(rng.standard_normal(48).astype(np.float32))
    assert same(mm(x, bias=bias), mm(x) + bias)  # qwen2's q/k/v bias
    assert same(mm(x, norm_weight=nw, eps=1e-5, bias=bias, residual=res), (mm(native.rms_norm(x, nw, 1e-5)) + bias) + res)
    with pytest.raises(ValueError, match=r"bias must be \[n\]"):
        mm(x, bias=mx.ones((47,)))
