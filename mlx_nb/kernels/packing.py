"""Quantized weights -> the kernels' packed layout (outputs in tiles of 16, four inputs of one output
per 32-bit lane, 4/5/6/8-bit q; see csrc/isa.h).

Packing is a one-time reshuffle of the same q and scales: nothing is re-quantized, so the packed
weight is the source's weight exactly.
- MLX's affine weights (`pack`, here in NumPy): scales and biases become float16 when that is exact,
  else float32.
- GGUF's blocks (`pack_ggml`, in C++: a 3B model's worth of blocks is repacked in about a second):
  each block type keeps its bits and its own scales (csrc/ggml_pack.cpp).
"""

from __future__ import annotations

import numpy as np

LANES = 16
BLOCK = 32
BITS = (4, 5, 6, 8)

# GGUF block types with a kernel: name -> ggml's type id (ggml.h's enum ggml_type)
GGML_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
SCHEMES = ("affine", "symmetric", "k-quant", "q6_k")


def unpack_q(w, scales, biases, group_size: int, bits: int) -> np.ndarray:
    """MLX's affine q as uint8 [N, K]: 4 and 8 bits read from the packed words (little-endian, low
    bits first), other widths recovered from the dequantized weights (exact: w = s * q + b)."""
    if bits == 8:
        return np.ascontiguousarray(np.array(w)).view(np.uint8)
    if bits == 4:
        b = np.ascontiguousarray(np.array(w)).view(np.uint8)
        return np.stack([b & 0x0F, b >> 4], axis=-1).reshape(b.shape[0], -1)
    if bits not in BITS:
        raise ValueError(f"{bits}-bit weights have no kernel: 4, 5, 6 and 8 do")
    import mlx.core as mx

    dq = np.array(mx.dequantize(w, scales, biases, group_size=group_size, bits=bits).astype(mx.float32))
    s = np.repeat(np.array(scales.astype(mx.float32)), group_size, axis=1)
    b = np.repeat(np.array(biases.astype(mx.float32)), group_size, axis=1)
    q = np.where(s != 0, np.rint((dq - b) / np.where(s != 0, s, 1)), 0)
    return np.clip(q, 0, (1 << bits) - 1).astype(np.uint8)


def pack_q(q: np.ndarray, bits: int) -> np.ndarray:
    """q uint8 [N, K] (N a multiple of 16) -> packed uint8 [N / 16, K / 32, 64 * bits] (isa.h)."""
    n, k = q.shape
    tiles, nb = n // LANES, k // BLOCK
    qt = q.reshape(tiles, LANES, nb, BLOCK)  # [tile, lane, block, input]
    if bits == 8:
        # [tile, lane, block, chunk j, byte i] -> [tile, block, chunk, lane, byte]
        return np.ascontiguousarray(qt.reshape(tiles, LANES, nb, 8, 4).transpose(0, 2, 3, 1, 4)).reshape(tiles, nb, -1)
    # input 4j + i in the low nibble, 16 + 4j + i in the high nibble
    halves = (qt & 0x0F).reshape(tiles, LANES, nb, 2, 4, 4).transpose(0, 2, 4, 1, 5, 3)
    parts = [(halves[..., 0] | (halves[..., 1] << 4)).reshape(tiles, nb, 256)]
    if bits == 5:  # bit j of byte (lane, i) = bit 4 of input 4j + i
        hb = ((qt >> 4) & 1).reshape(tiles, LANES, nb, 8, 4)
        plane = sum(hb[:, :, :, j, :] << j for j in range(8))  # [tile, lane, block, i]
        parts.append(plane.transpose(0, 2, 1, 3).reshape(tiles, nb, 64))
    elif bits == 6:  # bits 2(j - 4p), +1 of byte (p, lane, i) = bits 4, 5 of input 4j + i
        hb = ((qt >> 4) & 3).reshape(tiles, LANES, nb, 2, 4, 4)
        plane = sum(hb[:, :, :, :, j, :] << (2 * j) for j in range(4))  # [tile, lane, block, p, i]
        parts.append(plane.transpose(0, 2, 3, 1, 4).reshape(tiles, nb, 128))
    return np.ascontiguousarray(np.concatenate(parts, axis=-1).astype(np.uint8))


def _exact_half(a: np.ndarray) -> bool:
    a32 = a.astype(np.float32)
    return bool(np.array_equal(a32.astype(np.float16).astype(np.float32), a32, equal_nan=True))


def pack(w, scales, biases, group_size: int, bits: int):
    """MLX affine (w, scales, biases) -> (packed uint8 [T, K/32, 64*bits], scales [T, K/gs, 16], biases)
    as mx arrays; T = ceil(N/16)."""
    import mlx.core as mx

    q = unpack_q(w, scales, biases, group_size, bits)
    n, k = q.shape
    if k % group_size or group_size % BLOCK:
        raise ValueError(f"group size {group_size} does not divide {k} inputs in blocks of {BLOCK}")
    tiles = -(-n // LANES)
    qp = np.zeros((tiles * LANES, k), np.uint8)
    qp[:n] = q
    packed = pack_q(qp, bits)

    s, b = np.array(scales.astype(mx.float32)), np.array(biases.astype(mx.float32))
    dtype = np.float16 if _exact_half(s) and _exact_half(b) else np.float32

    def tile(a):
        out = np.zeros((tiles * LANES, a.shape[1]), dtype)
        out[:n] = a
        return np.ascontiguousarray(out.reshape(tiles, LANES, -1).transpose(0, 2, 1))

    return mx.array(packed), mx.array(tile(s)), mx.array(tile(b))


def ggml_format(ggml_type: str) -> dict:
    """How a GGUF block type is packed: {bits, group_size, scheme, zero} (QLinear's arguments)."""
    from mlx_nb.kernels import native

    if ggml_type not in GGML_TYPES:
        raise ValueError(f"GGUF {ggml_type} blocks have no kernel: {', '.join(GGML_TYPES)} do")
    block, _, bits, scheme, zero = native().ggml_format(GGML_TYPES[ggml_type])
    return {"bits": bits, "group_size": 32, "scheme": scheme, "zero": zero}


def pack_ggml(raw, ggml_type: str, k: int) -> tuple[dict, dict]:
    """GGUF blocks (uint8 [N, bytes a row], a NumPy or mx array) -> (the packed arrays, their format)."""
    import mlx.core as mx
    from mlx_nb.kernels import native

    fmt = ggml_format(ggml_type)
    packed, scales, biases, sub = native().pack_ggml(mx.array(raw) if isinstance(raw, np.ndarray) else raw,
                                                     GGML_TYPES[ggml_type], k)
    scheme = SCHEMES[fmt["scheme"]]
    parts = {"packed": packed, "scales": scales,
             "biases": biases if scheme in ("affine", "k-quant") else None,
             "sub": sub if scheme in ("k-quant", "q6_k") else None}
    mx.eval([a for a in parts.values() if a is not None])
    return parts, fmt
