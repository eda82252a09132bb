"""The kernels' face for the engine: each op runs on our native kernel when it is built, and on
MLX's own ops otherwise. Callers never ask which path runs (the model's layers are swapped onto the
kernels at load, `swap.py`; these are the few ops the engine calls itself)."""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from mlx_nb import kernels


def log_softmax(logits: mx.array) -> mx.array:
    """Along the last axis."""
    if kernels.available():
        return kernels.native().log_softmax(logits)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def gelu(x: mx.array) -> mx.array:
    """The exact (erf) GELU of BERT-style encoders. MLX's CPU `erf` reads ~38M values/s here, two
    thirds of an encoder's forward; the kernel's vectorized one, across the cores, ~20x that."""
    if kernels.available():
        return kernels.native().gelu(x)
    return x * (1 + mx.erf(x / 2**0.5)) / 2


def sample(logits: mx.array, *, temperature: mx.array, top_p: mx.array, top_k: mx.array, min_p: mx.array,
           uniform: Callable[[], mx.array], fallback: Callable[[], mx.array]) -> mx.array:
    """One token per row of logits [B, V] with mlx_lm's sampler semantics and per-row settings, drawn
    by inverse CDF from `uniform()` (one number per row); `fallback()` computes the same rows with
    MLX's ops (mlx_lm's samplers) where the kernels are not built. Both are called only on their
    path, so a seeded request's random stream advances as the path it runs needs."""
    if kernels.available():
        return kernels.native().sample(logits, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                                       uniform=uniform())
    return fallback()
