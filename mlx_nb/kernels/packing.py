"""MLX affine-quantized weights -> the kernels' packed layout (outputs in tiles of 16, four inputs of
one output per 32-bit lane; see csrc/isa.h), and back.

Packing is a one-time reshuffle of the same q, scales and biases: nothing is re-quantized, so the
packed weight is the MLX weight exactly. Scales and biases become float16 when that is exact
(GGUF's are float16 already), else float32.
"""

from __future__ import annotations

import numpy as np

LANES = 16
BLOCK = 32


def unpack_q(w: np.ndarray, bits: int) -> np.ndarray:
    """MLX's packed uint32 [N, K * bits / 32] -> q as uint8 [N, K] (little-endian, low bits first)."""
    b = np.ascontiguousarray(w).view(np.uint8)
    if bits == 8:
        return b
    if bits == 4:
        return np.stack([b & 0x0F, b >> 4], axis=-1).reshape(b.shape[0], -1)
    raise ValueError(f"{bits}-bit weights have no kernel: 4 and 8 do")


def _exact_half(a: np.ndarray) -> bool:
    a32 = a.astype(np.float32)
    return bool(np.array_equal(a32.astype(np.float16).astype(np.float32), a32, equal_nan=True))


def pack(w, scales, biases, group_size: int, bits: int):
    """(packed uint8 [T, K/32, 16*32*bits/8], scales [T, K/gs, 16], biases) as mx arrays; T = ceil(N/16)."""
    import mlx.core as mx

    q = unpack_q(np.array(w), bits)
    n, k = q.shape
    if k % group_size or group_size % BLOCK:
        raise ValueError(f"group size {group_size} does not divide {k} inputs in blocks of {BLOCK}")
    tiles = -(-n // LANES)
    qp = np.zeros((tiles * LANES, k), np.uint8)
    qp[:n] = q
    nb = k // BLOCK
    if bits == 8:
        # [tile, lane, block, chunk j, byte i] -> [tile, block, chunk, lane, byte]
        packed = qp.reshape(tiles, LANES, nb, 8, 4).transpose(0, 2, 3, 1, 4)
    else:
        # input 4j + i in the low nibble, 16 + 4j + i in the high nibble
        halves = qp.reshape(tiles, LANES, nb, 2, 4, 4).transpose(0, 2, 4, 1, 5, 3)
        packed = halves[..., 0] | (halves[..., 1] << 4)
    packed = np.ascontiguousarray(packed).reshape(tiles, nb, LANES * BLOCK * bits // 8)

    s, b = np.array(scales.astype(mx.float32)), np.array(biases.astype(mx.float32))
    dtype = np.float16 if _exact_half(s) and _exact_half(b) else np.float32

    def tile(a):
        out = np.zeros((tiles * LANES, a.shape[1]), dtype)
        out[:n] = a
        return np.ascontiguousarray(out.reshape(tiles, LANES, -1).transpose(0, 2, 1))

    return mx.array(packed), mx.array(tile(s)), mx.array(tile(b))
