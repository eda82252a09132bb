"""GGUF's block types on the kernels (csrc/ggml_pack.cpp and the 5/6-bit, symmetric, k-quant and
Q6_K schemes of the matmul), on every instruction set this CPU runs: random valid blocks of each
type against gguf-py's own dequantization and a float64 matmul, odd shapes, 1..64 rows, a row
bit-identical alone and in any batch; the experts' matmul of a mixture-of-experts layer; MLX's
5- and 6-bit affine weights."""

import mlx.core as mx
import numpy as np
import pytest

import kernel_reference as ref
from ggml_blocks import QUANT_TYPES, block_weights, dequantize, random_blocks
from mlx_nb.kernels.layers import QEmbedding, QLinear, QSwitchLinear
from mlx_nb.kernels.packing import pack_ggml


def _cases():
    rng = np.random.default_rng(11)
    for i in range(32):
        kind = QUANT_TYPES[i % len(QUANT_TYPES)]
        k = block_weights(kind) * int(rng.integers(1, 4 if block_weights(kind) == 256 else 9))
        n = int(rng.choice([1, 5, 16, 17, 40, 77, 130]))
        rows = int(rng.choice([1, 2, 3, 4, 5, 7, 9, 16, 33, 64]))
        digits = 1 + (i // len(QUANT_TYPES)) % 2
        yield pytest.param(kind, n, k, rows, digits, i, id=f"{kind}-{n}x{k}-m{rows}-d{digits}")


@pytest.mark.parametrize("kind,n,k,rows,digits,seed", list(_cases()))
def test_block_type_matches_gguf_dequantize_in_float64(isa, kind, n, k, rows, digits, seed):
    rng = np.random.default_rng(seed)
    raw = random_blocks(kind, (n, k), rng)
    w = dequantize(kind, raw, (n, k)).astype(np.float64)
    layer = QLinear.from_ggml(raw, kind, k)
    layer.digits = digits
    held = sum(v.nbytes for name, v in layer.items() if isinstance(v, mx.array))
    padded = -(-n // 16) * 16  # outputs are packed in tiles of 16
    assert layer.ggml_type == kind and held <= 1.03 * raw.nbytes * padded / n  # the file's size: Q4_K's +2.8% the most
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 10)).astype(np.float32)
    x[0, :7] = 0.0  # a block with zeros
    got = np.asarray(layer(mx.array(x)), np.float64)
    want = ref.as_quantized(x, digits) @ w.T  # the file's weights, x as the kernels read it (int8 blocks)
    assert np.abs(got - want).max() / (np.abs(want).max() + 1e-30) < 2e-6  # the same sums, in float32
    exact = x.astype(np.float64) @ w.T
    assert np.abs(got - exact).max() / (np.abs(exact).max() + 1e-30) < (2e-2 if digits == 1 else 2e-4)


@pytest.mark.parametrize("kind", QUANT_TYPES)
def test_embedding_rows_are_gguf_dequantize(isa, kind):
    rng = np.random.default_rng(5)
    k = block_weights(kind) * 2
    raw = random_blocks(kind, (37, k), rng)
    embed = QEmbedding.from_ggml(raw, kind, k)
    ids = np.array([0, 5, 16, 36, 5])
    got = np.asarray(embed(mx.array(ids)))
    np.testing.assert_allclose(got, dequantize(kind, raw, (37, k))[ids], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("digits", [1, 2])
@pytest.mark.parametrize("kind", QUANT_TYPES)
def test_row_alone_equals_row_in_batches(isa, kind, digits):
    rng = np.random.default_rng(3)
    k = 512
    layer = QLinear.from_ggml(random_blocks(kind, (70, k), rng), kind, k)
    layer.digits = digits
    x = mx.array(rng.standard_normal((64, k)).astype(np.float32))
    alone = np.concatenate([np.asarray(layer(x[i:i + 1])) for i in range(64)])
    for size in (2, 3, 4, 5, 8, 17, 32, 64):
        assert np.array_equal(np.asarray(layer(x[:size])), alone[:size]), f"{kind}, batch of {size}"
    assert np.array_equal(np.asarray(layer(x[9:30])), alone[9:30])


@pytest.mark.parametrize("kind,digits", [("Q4_K", 1), ("Q6_K", 2), ("Q8_0", 1), ("Q5_0", 2)])
def test_experts_matmul_reads_each_rows_expert(isa, kind, digits):
    """Each row through its own expert: bit for bit the dense kernel on that expert alone, whatever
    the other rows chose; and the float64 product."""
    rng = np.random.default_rng(8)
    experts, n, k = 5, 48, 256
    raw = random_blocks(kind, (experts, n, k), rng)
    layer = QSwitchLinear.from_ggml(raw, kind, k)
    dense = [QLinear.from_ggml(raw[e], kind, k) for e in range(experts)]
    for m in [layer, *dense]:
        m.digits = digits
    w = dequantize(kind, raw, (experts, n, k)).astype(np.float64)
    for rows in (1, 3, 17, 40):
        x = rng.standard_normal((rows, k)).astype(np.float32)
        chosen = rng.integers(0, experts, rows)
        got = np.asarray(layer(mx.array(x)[:, None, :], mx.array(chosen)))[:, 0, :]
        for r in range(rows):
            assert np.array_equal(got[r], np.asarray(dense[chosen[r]](mx.array(x[r:r + 1])))[0])
        want = np.einsum("rk,rnk->rn", ref.as_quantized(x, digits), w[chosen])
        assert np.abs(got - want).max() / np.abs(want).max() < 2e-6


def test_experts_matmul_broadcasts_as_mlx_lm_gather_does(native):
    """mlx_lm's SwitchGLU calls its projections with x [B, L, 1, 1, K] and indices [B, L, top_k]."""
    rng = np.random.default_rng(2)
    raw = random_blocks("Q4_K", (4, 32, 256), rng)
    layer = QSwitchLinear.from_ggml(raw, "Q4_K", 256)
    x = mx.array(rng.standard_normal((2, 3, 1, 1, 256)).astype(np.float32))
    idx = mx.array(rng.integers(0, 4, (2, 3, 2)))
    y = layer(x, idx)
    assert y.shape == (2, 3, 2, 1, 32)
    w = dequantize("Q4_K", raw, (4, 32, 256)).astype(np.float64)
    xq = ref.as_quantized(np.asarray(x).reshape(-1, 256)).reshape(2, 3, 256)
    want = np.einsum("blk,blenk->blen", xq, w[np.asarray(idx)])
    assert np.abs(np.asarray(y)[:, :, :, 0] - want).max() / np.abs(want).max() < 2e-6


@pytest.mark.parametrize("bits", [5, 6])
def test_mlx_affine_5_and_6_bit_weights(isa, bits):
    rng = np.random.default_rng(bits)
    for group_size in (32, 64, 128):
        w = mx.array((rng.standard_normal((45, 256)) * 0.05).astype(np.float32))
        q, s, b = mx.quantize(w, group_size=group_size, bits=bits)
        layer = QLinear.from_parts(q, s, b, group_size, bits)
        exact = np.asarray(mx.dequantize(q, s, b, group_size=group_size, bits=bits), np.float64)
        x = rng.standard_normal((6, 256)).astype(np.float32)
        got, want = np.asarray(layer(mx.array(x)), np.float64), ref.as_quantized(x) @ exact.T
        assert np.abs(got - want).max() / np.abs(want).max() < 2e-6


def test_bad_blocks_get_one_line_errors(native):
    raw = random_blocks("Q4_K", (16, 256), np.random.default_rng(0))
    with pytest.raises(ValueError, match="rows must be a positive multiple of 256"):
        pack_ggml(raw[:, :100], "Q4_K", 200)
    with pytest.raises(ValueError, match="raw rows hold 144 bytes, not the 288"):
        pack_ggml(raw, "Q4_K", 512)
    with pytest.raises(ValueError, match="Q2_K blocks have no kernel"):
        pack_ggml(raw, "Q2_K", 256)
