"""The machine's limits for this model: memory bandwidth and sgemm peak, and what the model needs.

Batch 1 decode is bandwidth-bound (every weight is read once per token); a large batch is
compute-bound (2 FLOPs per weight per token). Ratios against these tell how close we are.
"""

from __future__ import annotations

import time

import numpy as np


def copy_bandwidth_gbs(mb: int = 512, repeats: int = 5) -> float:
    src = np.ones(mb * (1 << 20) // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.nbytes / best / 1e9  # read + write


def sgemm_gflops(m: int = 512, k: int = 576, n: int = 1536, seconds: float = 2.0) -> float:
    import mlx.core as mx

    a, b = mx.random.normal((m, k)), mx.random.normal((k, n))
    mx.eval(a @ b)
    count, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        mx.eval(a @ b)
        count += 1
    return count * 2 * m * k * n / (time.perf_counter() - t) / 1e9


def model_costs(loaded) -> dict:
    """Weight bytes read and FLOPs spent per generated token (matmul weights incl. the LM head)."""
    from mlx.utils import tree_flatten

    matmul_params = 0
    for name, p in tree_flatten(loaded.model.parameters()):
        if p.ndim == 2 and "norm" not in name:
            matmul_params += p.size  # the tied embedding counts once: it is the LM head
    bytes_per = 4 if loaded.dtype == "float32" else 2
    return {"matmul_params": matmul_params, "bytes_per_token": matmul_params * bytes_per,
            "flops_per_token": 2 * matmul_params}
