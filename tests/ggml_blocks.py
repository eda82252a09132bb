"""Random valid GGUF blocks of every block type the kernels hold, and gguf-py's dequantization of
them: the weights a kernel or a converted model must compute with.

Random bytes are valid quants of every type; only the float16 scales are set, to sane magnitudes,
so every bit pattern of the quants (and of the 6-bit K-quant scales) is exercised.
"""

from __future__ import annotations

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

QUANT_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


def block_weights(kind: str) -> int:
    return gguf.GGML_QUANT_SIZES[T[kind]][0]


def _half(rng, shape, scale):
    return (scale * rng.uniform(0.5, 1.0, shape)).astype(np.float16).view(np.uint8)


def random_blocks(kind: str, shape: tuple, rng, amp: float = 0.06) -> np.ndarray:
    """Random valid blocks of `kind` for a tensor of `shape` (rows..., k): uint8 [rows..., bytes a row],
    weights of magnitude about `amp`."""
    t = T[kind]
    block, size = gguf.GGML_QUANT_SIZES[t]
    *rows, k = shape
    raw = rng.integers(0, 256, size=(*rows, k // block, size), dtype=np.uint8)
    lead = (*rows, k // block, 1)
    if kind in ("Q4_0", "Q5_0", "Q8_0"):
        raw[..., 0:2] = _half(rng, lead, amp / {"Q4_0": 8, "Q5_0": 16, "Q8_0": 127}[kind])
    elif kind in ("Q4_1", "Q5_1"):
        raw[..., 0:2] = _half(rng, lead, 2 * amp / (15 if kind == "Q4_1" else 31))
        raw[..., 2:4] = (-_half(rng, lead, amp).view(np.float16)).view(np.uint8)
    elif kind in ("Q4_K", "Q5_K"):
        raw[..., 0:2] = _half(rng, lead, 2 * amp / (63 * (15 if kind == "Q4_K" else 31)))
        raw[..., 2:4] = _half(rng, lead, amp / 63)
    elif kind == "Q6_K":
        raw[..., 208:210] = _half(rng, lead, amp / (127 * 32))
    return raw.reshape(*rows, -1)


def dequantize(kind: str, raw: np.ndarray, shape: tuple) -> np.ndarray:
    return gguf.quants.dequantize(raw, T[kind]).reshape(shape).astype(np.float32)


