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


def read_bandwidth_gbs(threads: int | None = None) -> float | None:
    """Memory read bandwidth with every core streaming (bench/bandwidth.c, built here with the system
    C compiler); None without one."""
    import os
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "bandwidth"
        src = Path(__file__).with_name("bandwidth.c")
        flags = ["-O2", "-march=native", "-pthread"]
        subprocess.run([cc, *flags, str(src), "-o", str(exe)], check=True, capture_output=True)
        out = subprocess.run([str(exe), str(threads or os.cpu_count() or 1)], check=True, capture_output=True, text=True)
    return float(out.stdout.strip())


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
    """Weight bytes read and FLOPs spent per generated token (every matmul weight, the LM head
    included: a tied embedding counts once), as the model is held (packed 4/8-bit on the kernels)."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from mlx_nb.kernels import layers

    weights = 0
    for _, m in loaded.model.named_modules():
        if isinstance(m, layers.QLinear):
            weights += m.input_dims * m.output_dims
        elif isinstance(m, layers.QEmbedding):
            weights += m.num_embeddings * m.dims
        elif isinstance(m, (nn.Linear, nn.Embedding)) and not isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            weights += m.weight.size
    held = sum(p.nbytes for _, p in tree_flatten(loaded.model.parameters()))
    return {"matmul_params": weights, "bytes_per_token": held, "weights_bytes": held, "flops_per_token": 2 * weights,
            "dtype": loaded.dtype}
