"""Float64 NumPy references for the CPU kernels: what each kernel must compute, written plainly."""

from __future__ import annotations

import numpy as np

def unpack_q(w: np.ndarray, bits: int) -> np.ndarray:
    b = np.ascontiguousarray(w).view(np.uint8)
    if bits == 8:
        return b.astype(np.int64)
    return np.stack([b & 0x0F, b >> 4], axis=-1).reshape(b.shape[0], -1).astype(np.int64)


def dequantized(w, scales, biases, group_size: int, bits: int) -> np.ndarray:
    q = unpack_q(np.asarray(w), bits).astype(np.float64)
    s = np.repeat(np.asarray(scales, np.float64), group_size, axis=1)
    b = np.repeat(np.asarray(biases, np.float64), group_size, axis=1)
    return q * s + b


FINE = 254  # the second int8 digit's scale (kernels/csrc/isa.h)


def activations(x: np.ndarray, digits: int = 1):
    """The kernels' quantization of x [M, K] in blocks of 32 to one or two int8 digits, done in
    float32 as the kernels do: (q as int64 [M, K/32, 32] (254 * hi + lo with two), scale d float32
    [M, K/32])."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32).astype(np.float32)
    amax = np.abs(xb).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    v = (xb * inv).astype(np.float32)
    hi = np.rint(v)
    if digits == 1:
        return hi.astype(np.int64), (amax[..., 0] / np.float32(127)).astype(np.float32)
    lo = np.rint(((v - hi).astype(np.float32) * np.float32(FINE)).astype(np.float32))
    d = (amax[..., 0] / np.float32(127 * FINE)).astype(np.float32)
    return FINE * hi.astype(np.int64) + lo.astype(np.int64), d


def as_quantized(x: np.ndarray, digits: int = 1) -> np.ndarray:
    """x as the kernels read it (d * q), in float64 [M, K]: with any weight W, x_q @ W.T is what a
    kernel computes, up to its float32 sums."""
    q, d = activations(x, digits)
    return (q * d[..., None].astype(np.float64)).reshape(x.shape)


def qmatmul(x: np.ndarray, w, scales, biases, group_size: int, bits: int, digits: int = 1) -> np.ndarray:
    """x @ W.T with x as its int8 quantization, in float64, summed as the kernels sum (per block,
    the bias term from the block's quantized sum)."""
    q, d = activations(x, digits)
    m, nb, _ = q.shape
    wq = unpack_q(np.asarray(w), bits).reshape(-1, nb, 32)
    s = np.repeat(np.asarray(scales, np.float64), group_size // 32, axis=1)
    b = np.repeat(np.asarray(biases, np.float64), group_size // 32, axis=1)
    isum = np.einsum("nbk,mbk->mnb", wq, q).astype(np.float64)
    qsum = (d.astype(np.float64) * q.sum(-1))  # the block's sum as quantized
    return (isum * s[None] * d[:, None, :]).sum(-1) + (b[None] * qsum[:, None, :]).sum(-1)


def rms_norm(x, w, eps):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * np.asarray(w, np.float64)


def rope(x, dims, traditional, base, scale, offsets, freqs=None):
    """mx.fast.rope's contract on x [B, H, L, D] with one offset per batch row (or one for all)."""
    x = np.asarray(x, np.float64)
    b_, h_, l_, d_ = x.shape
    half = dims // 2
    inv = 1.0 / np.asarray(freqs, np.float64) if freqs is not None else base ** (-np.arange(half) / half)
    offsets = np.broadcast_to(np.asarray(offsets).reshape(-1), (b_,))
    out = x.copy()
    for b in range(b_):
        pos = (np.arange(l_) + offsets[b]) * scale
        th = pos[:, None] * inv[None]
        c, s = np.cos(th), np.sin(th)
        if traditional:
            x1, x2 = x[b, :, :, 0:dims:2], x[b, :, :, 1:dims:2]
            out[b, :, :, 0:dims:2] = x1 * c - x2 * s
            out[b, :, :, 1:dims:2] = x1 * s + x2 * c
        else:
            x1, x2 = x[b, :, :, :half], x[b, :, :, half:dims]
            out[b, :, :, :half] = x1 * c - x2 * s
            out[b, :, :, half:dims] = x1 * s + x2 * c
    return out


def softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def logsumexp(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return m + np.log(np.exp(x - m).sum(-1, keepdims=True))


def silu(x):
    x = np.asarray(x, np.float64)
    return x / (1 + np.exp(-x))


def attention(q, k, v, scale, mask=None, causal=False):
    """softmax(q k^T scale + mask) v for q [B, H, L, D], k/v [B, Hk, S, D] -> [B, L, H * D]."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b_, h_, l_, d_ = q.shape
    group = h_ // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("bhld,bhsd->bhls", q, k) * scale
    s_len = k.shape[2]
    if causal:
        keep = np.arange(s_len)[None, :] <= (np.arange(l_)[:, None] + s_len - l_)
        s = np.where(keep, s, -np.inf)
    if mask is not None:
        mask = np.asarray(mask)
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask.astype(np.float64)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhls,bhsd->blhd", p, v).reshape(b_, l_, h_ * d_)
