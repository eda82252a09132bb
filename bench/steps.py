"""Where a step's time goes, measured in this process on the real model.

- forward-only: the model alone on a batch cache, one token per row, argmax, eval;
- matmul-only: the same step's matmuls (every weight of the model, the LM head included) on the
  real weights and nothing else: what a perfect implementation around the same BLAS would take;
- engine: B chats decoding together, timed from the engine's own step events while all B rows are
  in the batch (prefill excluded), so it measures the same thing as forward-only;
- prefill chunk: 512 prompt tokens read at the start of a prompt and 4,096 tokens into it; the
  difference is attention over the context already read.
The other work of a step, op by op against MLX's own ops, is in kernel_ops.py.
"""

from __future__ import annotations

import time


def _best(fn, reps: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _batch_cache(loaded, b: int, context: int, chunk: int = 512):
    """A batch cache holding `context` tokens per row, read in chunks as the engine reads prompts."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    cache = [BatchKVCache([0] * b) for _ in loaded.make_cache()]
    for start in range(0, context, chunk):
        loaded.model(mx.ones((b, min(chunk, context - start)), dtype=mx.int32), cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def forward_only_s(loaded, b: int, context: int = 64, steps: int = 16) -> float:
    """Seconds per decode step of the bare model at batch b."""
    import mlx.core as mx

    model, cache = loaded.model, _batch_cache(loaded, b, context)
    tok = mx.ones((b, 1), dtype=mx.int32)
    for _ in range(3):
        tok = mx.argmax(model(tok, cache=cache)[:, -1:, :], axis=-1).astype(mx.int32)
        mx.eval(tok)
    t = time.perf_counter()
    for _ in range(steps):
        tok = mx.argmax(model(tok, cache=cache)[:, -1:, :], axis=-1).astype(mx.int32)
        mx.eval(tok)
    return (time.perf_counter() - t) / steps


def matmul_only_s(loaded, b: int) -> float:
    """Seconds for one decode step's matmuls alone, through the model's own projection modules
    (packed kernels or BLAS), the output layer included, at batch b."""
    import mlx.core as mx
    import mlx.nn as nn

    from mlx_nb.kernels import layers

    calls = []
    for _, m in loaded.model.named_modules():
        if isinstance(m, layers.QLinear):
            calls.append((m, m.input_dims))
        elif isinstance(m, layers.QEmbedding):
            calls.append((m.as_linear, m.dims))
        elif type(m) is nn.Linear:
            calls.append((m, m.weight.shape[1]))
        elif type(m) is nn.Embedding and getattr(loaded.model.args, "tie_word_embeddings", False):
            calls.append((m.as_linear, m.weight.shape[1]))
    inputs = {d: mx.random.normal((b, d)) for _, d in calls}
    mx.eval(list(inputs.values()))
    return _best(lambda: mx.eval([f(inputs[d]) for f, d in calls]))


def prefill_chunk_s(loaded, context: int, chunk: int = 512) -> float:
    """Seconds to read `chunk` prompt tokens of one request that has already read `context`."""
    import mlx.core as mx

    cache = _batch_cache(loaded, 1, context)
    t = time.perf_counter()
    loaded.model(mx.ones((1, chunk), dtype=mx.int32), cache=cache)
    mx.eval([c.state for c in cache])
    return time.perf_counter() - t


def engine_decode_tps(engine, b: int) -> float:
    since = engine.events()[-1]["seq"] if engine.events() else 0
    handles = [engine.submit(messages=[{"role": "user", "content": f"Tell a long story, part {i}."}],
                             max_tokens=64) for i in range(b)]
    for h in handles:
        h.result()
    full = [e for e in engine.events(since) if e["kind"] == "step" and len(e["requests"]) == b]
    return b * (len(full) - 1) / (full[-1]["time"] - full[0]["time"])


def profile(model: str, levels=(1, 8, 32)) -> dict:
    """Every measurement above, for the report's "where the time goes" section."""
    from mlx_nb import Engine
    from mlx_nb.models import load_model

    loaded = load_model(model)
    out = {"decode": {}, "prefill": {}}
    for b in levels:
        out["decode"][b] = {"forward_s": forward_only_s(loaded, b), "matmul_s": matmul_only_s(loaded, b)}
    prefill_chunk_s(loaded, 0)  # warm-up
    out["prefill"] = {"chunk": 512, "at_0_s": prefill_chunk_s(loaded, 0), "at_4096_s": prefill_chunk_s(loaded, 4096)}
    del loaded
    with Engine(model, prefix_cache=False, max_batch=max(levels), wait=True) as engine:
        engine.submit(prompt="warm up", max_tokens=8).result()
        for b in levels:
            out["decode"][b]["engine_tps"] = engine_decode_tps(engine, b)
    return out
