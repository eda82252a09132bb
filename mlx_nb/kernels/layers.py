"""Modules that run on the kernels, called exactly like the MLX / mlx_lm modules they replace.

Their arrays are ordinary parameters (so `model.parameters()` counts what is really held), and their
plain attributes say what the packed weights are. `swap.py` builds them from a loaded model's modules.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from mlx_nb.kernels import native
from mlx_nb.kernels.packing import pack


class QLinear(nn.Module):
    """y = x W^T (+ bias) for a 4/8-bit affine W in the kernels' packed layout."""

    def __init__(self, packed: mx.array, scales: mx.array, biases: mx.array, *, input_dims: int,
                 output_dims: int, group_size: int, bits: int, bias: Optional[mx.array] = None):
        super().__init__()
        self.packed, self.scales, self.biases = packed, scales, biases
        if bias is not None:
            self.bias = bias
        self.input_dims, self.output_dims = input_dims, output_dims
        self.group_size, self.bits = group_size, bits

    @classmethod
    def from_quantized(cls, m: nn.QuantizedLinear) -> "QLinear":
        return cls.from_parts(m.weight, m.scales, m.biases, m.group_size, m.bits, m.get("bias"))

    @classmethod
    def from_linear(cls, m: nn.Linear, bits: int, group_size: int = 32) -> "QLinear":
        w, s, b = mx.quantize(m.weight.astype(mx.float16), group_size=group_size, bits=bits)
        return cls.from_parts(w, s, b, group_size, bits, m.get("bias"))

    @classmethod
    def from_parts(cls, w, scales, biases, group_size: int, bits: int, bias=None) -> "QLinear":
        packed, s, b = pack(w, scales, biases, group_size, bits)
        return cls(packed, s, b, input_dims=w.shape[1] * 32 // bits, output_dims=w.shape[0],
                   group_size=group_size, bits=bits, bias=None if bias is None else bias.astype(mx.float32))

    def __call__(self, x: mx.array, norm: Optional["RMSNorm"] = None, residual: Optional[mx.array] = None,
                 gate: bool = False) -> mx.array:
        """x W^T (+ bias); of norm(x) with `norm`, of silu(g) * u for x = [g, u] with `gate` (fused:
        one op); plus `residual`."""
        bias = self.get("bias")
        if bias is not None and residual is not None:  # keep the order bias, then residual
            return self(x, norm, gate=gate) + residual
        # self[...] reads the parameter dict directly: this runs ~120 times a decode step
        y = native().qmatmul(x, self["packed"], self["scales"], self["biases"], n=self.output_dims,
                             group_size=self.group_size, bits=self.bits,
                             norm_weight=None if norm is None else norm["weight"], eps=0.0 if norm is None else norm.eps,
                             residual=residual, gate=gate)
        return y if bias is None else y + bias

    def _extra_repr(self) -> str:
        return f"{self.input_dims}, {self.output_dims}, bits={self.bits}, group_size={self.group_size}"


class QEmbedding(nn.Module):
    """A quantized embedding on the packed layout: lookups dequantize rows, `as_linear` is the tied
    output layer on the matmul kernel."""

    def __init__(self, packed: mx.array, scales: mx.array, biases: mx.array, *, num_embeddings: int, dims: int,
                 group_size: int, bits: int):
        super().__init__()
        self.packed, self.scales, self.biases = packed, scales, biases
        self.num_embeddings, self.dims = num_embeddings, dims
        self.group_size, self.bits = group_size, bits

    @classmethod
    def from_quantized(cls, m: nn.QuantizedEmbedding) -> "QEmbedding":
        return cls.from_parts(m.weight, m.scales, m.biases, m.group_size, m.bits)

    @classmethod
    def from_embedding(cls, m: nn.Embedding, bits: int, group_size: int = 32) -> "QEmbedding":
        w, s, b = mx.quantize(m.weight.astype(mx.float16), group_size=group_size, bits=bits)
        return cls.from_parts(w, s, b, group_size, bits)

    @classmethod
    def from_parts(cls, w, scales, biases, group_size: int, bits: int) -> "QEmbedding":
        packed, s, b = pack(w, scales, biases, group_size, bits)
        return cls(packed, s, b, num_embeddings=w.shape[0], dims=w.shape[1] * 32 // bits,
                   group_size=group_size, bits=bits)

    def __call__(self, ids: mx.array) -> mx.array:
        return native().qgather(ids, self.packed, self.scales, self.biases, n=self.num_embeddings, k=self.dims,
                                group_size=self.group_size, bits=self.bits)

    def as_linear(self, x: mx.array) -> mx.array:
        return native().qmatmul(x, self.packed, self.scales, self.biases, n=self.num_embeddings,
                                group_size=self.group_size, bits=self.bits)

    def _extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.dims}, bits={self.bits}, group_size={self.group_size}"


class RMSNorm(nn.Module):
    """nn.RMSNorm in one fused kernel (MLX's CPU fallback is six ops)."""

    def __init__(self, weight: mx.array, eps: float):
        super().__init__()
        self.weight = weight
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return native().rms_norm(x, self.weight, self.eps)


class RoPE(nn.Module):
    """nn.RoPE (mx.fast.rope's contract, per-row offsets included) in one kernel; the angles are
    computed once per step and shared by every layer's queries and keys."""

    def __init__(self, dims: int, traditional: bool, base: Optional[float], scale: float,
                 freqs: Optional[mx.array] = None):
        super().__init__()
        self.dims, self.traditional, self.base, self.scale = dims, traditional, base, scale
        if freqs is not None:
            self._freqs = freqs

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        if not isinstance(offset, mx.array):
            offset = mx.array(offset, dtype=mx.int32)
        return native().rope(x, self.dims, traditional=self.traditional, base=self.base, scale=self.scale,
                             offset=offset, freqs=self.get("_freqs"))

    def _extra_repr(self) -> str:
        return f"{self.dims}, traditional={self.traditional}"


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up as one projection and one activation kernel."""

    def __init__(self, gate_up: nn.Module, down_proj: nn.Module, hidden: int):
        super().__init__()
        self.gate_up = gate_up
        self.down_proj = down_proj
        self.hidden = hidden

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(native().silu_gate(self.gate_up(x)))

    def residual_block(self, h: mx.array, norm: "RMSNorm") -> mx.array:
        """h + self(norm(h)), with the norm and the addition fused into the packed projections."""
        return self.down_proj(self.gate_up(h, norm=norm), residual=h, gate=True)


class Attention(nn.Module):
    """mlx_lm's llama-family attention (q/k/v/o projections, RoPE, grouped heads, any KV cache) with
    q, k and v as one projection, their split and RoPE as one kernel, and attention as one kernel
    that reads the cache's keys and values in place."""

    def __init__(self, qkv: nn.Module, o_proj: nn.Module, rope: RoPE, n_heads: int, n_kv_heads: int,
                 head_dim: int, scale: float):
        super().__init__()
        self.qkv = qkv
        self.o_proj = o_proj
        self.rope = rope
        self.n_heads, self.n_kv_heads, self.head_dim, self.scale = n_heads, n_kv_heads, head_dim, scale

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        return self.o_proj(self._attend(self.qkv(x), mask, cache))

    def residual_block(self, x: mx.array, norm: "RMSNorm", mask=None, cache=None) -> mx.array:
        """x + self(norm(x)), with the norm and the addition fused into the packed projections."""
        return self.o_proj(self._attend(self.qkv(x, norm=norm), mask, cache), residual=x)

    def _attend(self, qkv: mx.array, mask, cache) -> mx.array:
        offset = 0 if cache is None else cache.offset
        if not isinstance(offset, mx.array):
            offset = mx.array(offset, dtype=mx.int32)
        r = self.rope
        q, k, v = native().qkv_rope(qkv, heads=self.n_heads, kv_heads=self.n_kv_heads,
                                    head_dim=self.head_dim, dims=r.dims, traditional=r.traditional, base=r.base,
                                    scale=r.scale, offset=offset, freqs=r.get("_freqs"))
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        causal = isinstance(mask, str) and mask == "causal"
        return native().attention(q, k, v, scale=self.scale, causal=causal, mask=None if isinstance(mask, str) else mask)


class Block(nn.Module):
    """mlx_lm's llama-family decoder layer (pre-norm attention and MLP, each with a skip connection)
    with both norms and both additions fused into the packed projections: four fewer ops a layer."""

    def __init__(self, self_attn: Attention, mlp: SwiGLU, input_layernorm: RMSNorm, post_attention_layernorm: RMSNorm):
        super().__init__()
        self.self_attn, self.mlp = self_attn, mlp
        self.input_layernorm, self.post_attention_layernorm = input_layernorm, post_attention_layernorm

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        h = self.self_attn.residual_block(x, self.input_layernorm, mask, cache)
        return self.mlp.residual_block(h, self.post_attention_layernorm)
