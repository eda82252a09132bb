"""Our CPU kernels against the MLX operations they replace, one op at a time, on the default
model's shapes (ms per call, best of several, each call evaluated alone)."""

from __future__ import annotations

import time


def _ms(fn, reps: int = 20) -> float:
    import mlx.core as mx

    for _ in range(3):
        mx.eval(fn())
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(fn())
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def table(loaded) -> list[dict]:
    """[{op, shape, ours_ms, mlx_ms, mlx_op}] for the model's matmuls and element-wise work."""
    import mlx.core as mx
    import mlx.nn as nn

    from mlx_nb.kernels import layers, native

    from mlx_lm.sample_utils import make_sampler

    k = native()
    mlx_sampler = make_sampler(temp=0.7, top_p=0.9)
    layer = loaded.model.model.layers[0]
    mlp, attn = layer.mlp, layer.self_attn
    embed = loaded.model.model.embed_tokens
    dims, hidden = mlp.down_proj.output_dims, mlp.hidden
    rows = []

    def add(op, shape, ours, mlx, mlx_op):
        rows.append({"op": op, "shape": shape, "ours_ms": _ms(ours), "mlx_ms": _ms(mlx), "mlx_op": mlx_op})

    def dequantized(q: layers.QLinear):
        """Weights of the same shape in MLX's own layout (4/8-bit affine) and as float32."""
        w = mx.random.normal((q.output_dims, q.input_dims)) * 0.05
        wq, s, b = mx.quantize(w, group_size=q.group_size, bits=q.bits)
        mx.eval(w, wq, s, b)
        return w, wq, s, b

    for name, q in (("gate+up (q4)", mlp.gate_up), ("down (q4)", mlp.down_proj), ("output layer (q8)", embed)):
        if isinstance(q, layers.QEmbedding):
            proj = layers.QLinear({"packed": q.packed, "scales": q.scales, "biases": q.biases}, input_dims=q.dims,
                                  output_dims=q.num_embeddings, group_size=q.group_size, bits=q.bits)
        else:
            proj = q
        w, wq, s, b = dequantized(proj)
        for m in (1, 32):
            x = mx.random.normal((m, proj.input_dims))
            mx.eval(x)
            shape = f"{m} x {proj.input_dims} -> {proj.output_dims}"
            add(f"matmul {name}", shape, lambda: proj(x),
                lambda: mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=proj.group_size, bits=proj.bits),
                "mx.quantized_matmul")
            add(f"matmul {name}", shape, lambda: proj(x), lambda: x @ w.T, "float32 matmul (BLAS)")

    for b in (1, 32):
        x = mx.random.normal((b, 1, dims))
        w = mx.ones((dims,))
        add("RMSNorm", f"{b} x {dims}", lambda: k.rms_norm(x, w, 1e-5), lambda: mx.fast.rms_norm(x, w, 1e-5),
            "mx.fast.rms_norm")
        g = mx.random.normal((b, 1, 2 * hidden))
        add("SiLU gate", f"{b} x {hidden}", lambda: k.silu_gate(g),
            lambda: nn.silu(g[..., :hidden]) * g[..., hidden:], "nn.silu(g) * u")
        q = mx.random.normal((b, attn.n_heads, 1, attn.head_dim))
        off = mx.arange(b, dtype=mx.int32) + 100
        add("RoPE", f"{b} x {attn.n_heads} heads", lambda: k.rope(q, attn.head_dim, traditional=True, base=10000.0,
                                                                  scale=1.0, offset=off),
            lambda: mx.fast.rope(q, attn.head_dim, traditional=True, base=10000.0, scale=1.0, offset=off),
            "mx.fast.rope")
        kv = mx.random.normal((b, attn.n_kv_heads, 512, attn.head_dim))
        add("attention (512 keys)", f"{b} x {attn.n_heads} heads",
            lambda: k.attention(q, kv, kv, scale=attn.scale),
            lambda: mx.fast.scaled_dot_product_attention(q, kv, kv, scale=attn.scale), "mx.fast.scaled_dot_product_attention")
        logits = mx.random.normal((b, embed.num_embeddings))
        add("log-probabilities", f"{b} x {embed.num_embeddings}", lambda: k.log_softmax(logits),
            lambda: logits - mx.logsumexp(logits, axis=-1, keepdims=True), "x - mx.logsumexp(x)")
        t, p, kk, mp = mx.full((b,), 0.7), mx.full((b,), 0.9), mx.zeros((b,), mx.int32), mx.zeros((b,))
        u = mx.random.uniform(shape=(b,))
        add("sample (t 0.7, top-p 0.9)", f"{b} x {embed.num_embeddings}",
            lambda: k.sample(logits, temperature=t, top_p=p, top_k=kk, min_p=mp, uniform=u),
            lambda: mlx_sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True)),
            "mlx_lm make_sampler on log-probabilities")
    mx.eval(loaded.model.parameters())
    return rows


def markdown(rows: list[dict]) -> list[str]:
    lines = ["| op | shape | ours (ms) | MLX (ms) | MLX op | speed-up |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['shape']} | {r['ours_ms']:.3f} | {r['mlx_ms']:.3f} | {r['mlx_op']} | "
                     f"{r['mlx_ms'] / r['ours_ms']:.1f}x |")
    return lines
