"""Where a step's time goes, measured in this process on the real model.

- forward-only: the model alone on a batch cache, one token per row, argmax, eval;
- matmul-only: the same step's matmuls (every weight of the model, the LM head included) on the
  real weights and nothing else: what a perfect implementation around the same BLAS would take;
- engine: B chats decoding together, timed from the engine's own step events while all B rows are
  in the batch (prefill excluded), so it measures the same thing as forward-only;
- prefill chunk: 512 prompt tokens read at the start of a prompt and 4,096 tokens into it; the
  difference is attention over the context already read;
- the rest of a decode step, part by part: each kind of non-matmul work of one step (every layer's
  activation, attention, RoPE, norms, and the full-vocabulary log-probabilities BatchGenerator
  computes every step), timed alone on inputs of the model's shapes.
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
    """Seconds for one decode step's matmuls alone: x @ W.T for every 2-D weight, at batch b."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    weights = [w for name, w in tree_flatten(loaded.model.parameters()) if w.ndim == 2 and "norm" not in name]
    inputs = {w.shape[1]: mx.random.normal((b, w.shape[1])) for w in weights}
    mx.eval(list(inputs.values()))
    return _best(lambda: mx.eval([inputs[w.shape[1]] @ w.T for w in weights]))


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


def decode_parts_s(loaded, b: int, context: int = 64) -> dict:
    """Seconds per decode step for each kind of non-matmul work, all layers together, at batch b."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.activations import swiglu

    c = loaded.config
    layers, hidden, vocab = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
    heads, kv_heads = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    dim = c.get("head_dim") or hidden // heads
    def each(shape, n=layers):
        return [mx.random.normal(shape) for _ in range(n)]

    gate, up, q, k1 = each((b, 1, c["intermediate_size"])), each((b, 1, c["intermediate_size"])), \
        each((b, heads, 1, dim)), each((b, kv_heads, 1, dim))
    # Keys and values as a batch KV cache hands them to attention: the filled part of a larger buffer.
    k = [a[..., :context, :] for a in each((b, kv_heads, 256, dim))]
    v = [a[..., :context, :] for a in each((b, kv_heads, 256, dim))]
    x, w = each((b, 1, hidden), 2 * layers), mx.ones((hidden,))
    logits, offsets = mx.random.normal((b, vocab)), mx.array([context] * b)
    rope = nn.RoPE(dim, traditional=bool(c.get("rope_traditional", False)), base=c.get("rope_theta", 10000.0))
    mx.eval(gate, up, q, k, v, k1, x, logits, offsets)
    scale = dim ** -0.5
    parts = {
        "activation (SwiGLU)": lambda: [swiglu(gate[i], up[i]) for i in range(layers)],
        "attention": lambda: [mx.fast.scaled_dot_product_attention(q[i], k[i], v[i], scale=scale) for i in range(layers)],
        "RoPE": lambda: [rope(t[i], offset=offsets) for i in range(layers) for t in (q, k1)],
        "norms": lambda: [mx.fast.rms_norm(x[i], w, 1e-5) for i in range(2 * layers)],
        "log-probabilities": lambda: logits - mx.logsumexp(logits, axis=-1, keepdims=True),
    }
    return {name: _best(lambda fn=fn: mx.eval(fn())) for name, fn in parts.items()}


def elementwise_ns() -> dict:
    """Nanoseconds per element of MLX CPU `exp` and `multiply` (SwiGLU, softmax and the
    log-probabilities are made of exps)."""
    import mlx.core as mx

    x = mx.random.normal((1 << 20,))
    mx.eval(x)
    return {"exp": _best(lambda: mx.eval(mx.exp(x))) / x.size * 1e9,
            "multiply": _best(lambda: mx.eval(x * x)) / x.size * 1e9}


def profile(model: str, levels=(1, 8, 32)) -> dict:
    """Every measurement above, for the report's "where the time goes" section."""
    from mlx_nb import Engine
    from mlx_nb.models import load_model

    loaded = load_model(model)
    out = {"decode": {}, "prefill": {}}
    for b in levels:
        out["decode"][b] = {"forward_s": forward_only_s(loaded, b), "matmul_s": matmul_only_s(loaded, b),
                            "parts_s": decode_parts_s(loaded, b)}
    out["elementwise_ns"] = elementwise_ns()
    prefill_chunk_s(loaded, 0)  # warm-up
    out["prefill"] = {"chunk": 512, "at_0_s": prefill_chunk_s(loaded, 0), "at_4096_s": prefill_chunk_s(loaded, 4096)}
    del loaded
    with Engine(model, prefix_cache=False, max_batch=max(levels), wait=True) as engine:
        engine.submit(prompt="warm up", max_tokens=8).result()
        for b in levels:
            out["decode"][b]["engine_tps"] = engine_decode_tps(engine, b)
    return out
