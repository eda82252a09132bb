"""Modules that run on the kernels, called exactly like the MLX / mlx_lm modules they replace.

Their arrays are ordinary parameters (so `model.parameters()` counts what is really held), and their
plain attributes say what the packed weights are. `swap.py` builds them from a loaded model's modules.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache, KVCache

from mlx_nb.kernels import native
from mlx_nb.kernels.packing import pack, pack_ggml


class Packed(nn.Module):
    """The arrays and plain attributes of a weight in the kernels' packed layout (csrc/isa.h): the q
    (`packed`), `scales`, and where the scheme has them `biases` and `sub`; `bits` (4, 5, 6, 8),
    `scheme` (0 affine, 1 symmetric, 2 k-quant, 3 Q6_K), `zero` and `group_size` say how q becomes
    a weight. `ggml_type` names the GGUF block type it came from (None for MLX's affine weights)."""

    def _set_packed(self, parts: dict, *, bits: int, group_size: int, scheme: int = 0, zero: int = 0,
                    ggml_type: Optional[str] = None) -> None:
        self.packed, self.scales = parts["packed"], parts["scales"]
        for name in ("biases", "sub"):
            if parts.get(name) is not None:
                setattr(self, name, parts[name])
        self.bits, self.group_size, self.scheme, self.zero, self.ggml_type = bits, group_size, scheme, zero, ggml_type
        self.digits = 1  # the activations' int8 digits in its matmuls (kernels.precision sets it per model)

    def weight_args(self) -> dict:
        """The keyword arguments qmatmul and qgather take for this weight (beyond x, n and k)."""
        return dict(group_size=self.group_size, bits=self.bits, scheme=self.scheme, zero=self.zero,
                    sub=self.get("sub"))

    @property
    def weights(self) -> int:
        """How many weights it holds."""
        raise NotImplementedError

    def _format(self) -> str:
        return self.ggml_type or f"bits={self.bits}, group_size={self.group_size}"


class QLinear(Packed):
    """y = x W^T (+ bias) for a quantized W in the kernels' packed layout."""

    def __init__(self, parts: dict, *, input_dims: int, output_dims: int, bits: int, group_size: int = 32,
                 scheme: int = 0, zero: int = 0, ggml_type: Optional[str] = None, bias: Optional[mx.array] = None):
        super().__init__()
        self._set_packed(parts, bits=bits, group_size=group_size, scheme=scheme, zero=zero, ggml_type=ggml_type)
        if bias is not None:
            self.bias = bias
        self.input_dims, self.output_dims = input_dims, output_dims

    @classmethod
    def from_quantized(cls, m: nn.QuantizedLinear) -> "QLinear":
        return cls.from_parts(m.weight, m.scales, m.biases, m.group_size, m.bits, m.get("bias"))

    @classmethod
    def from_linear(cls, m: nn.Linear, bits: int, group_size: int = 32) -> "QLinear":
        w, s, b = mx.quantize(m.weight.astype(mx.float16), group_size=group_size, bits=bits)
        return cls.from_parts(w, s, b, group_size, bits, m.get("bias"))

    @classmethod
    def from_parts(cls, w, scales, biases, group_size: int, bits: int, bias=None) -> "QLinear":
        """From MLX's affine quantization (w, scales, biases as mx.quantize makes them)."""
        packed, s, b = pack(w, scales, biases, group_size, bits)
        return cls({"packed": packed, "scales": s, "biases": b}, input_dims=w.shape[1] * 32 // bits,
                   output_dims=w.shape[0], group_size=group_size, bits=bits,
                   bias=None if bias is None else bias.astype(mx.float32))

    @classmethod
    def from_ggml(cls, raw, ggml_type: str, input_dims: int, bias=None) -> "QLinear":
        """From a GGUF tensor's blocks (uint8 [outputs, bytes a row]), repacked, never re-quantized."""
        parts, fmt = pack_ggml(raw, ggml_type, input_dims)
        return cls(parts, input_dims=input_dims, output_dims=raw.shape[0], ggml_type=ggml_type, **fmt,
                   bias=None if bias is None else bias.astype(mx.float32))

    @classmethod
    def concat(cls, parts: list["QLinear"]) -> Optional["QLinear"]:
        """One projection computing `parts` side by side (q, k and v; gate and up), or None when
        their formats differ (a Q4_K_M file's Q6_K v beside Q4_K q and k) or a part's outputs end
        inside a tile of 16."""
        first = parts[0]

        def key(p):
            return (p.bits, p.group_size, p.scheme, p.zero, p.input_dims, p.scales.dtype, "biases" in p, "sub" in p,
                    "bias" in p)

        if any(key(p) != key(first) for p in parts) or any(p.output_dims % 16 for p in parts[:-1]):
            return None
        cat = {name: mx.concatenate([p[name] for p in parts]) for name in ("packed", "scales", "biases", "sub", "bias")
               if name in first}
        bias = cat.pop("bias", None)
        return cls(cat, input_dims=first.input_dims, output_dims=sum(p.output_dims for p in parts), bits=first.bits,
                   group_size=first.group_size, scheme=first.scheme, zero=first.zero,
                   ggml_type=first.ggml_type, bias=bias)

    def __call__(self, x: mx.array, norm: Optional["RMSNorm"] = None, residual: Optional[mx.array] = None,
                 gate: bool = False) -> mx.array:
        """x W^T (+ bias); of norm(x) with `norm`, of silu(g) * u for x = [g, u] with `gate`; plus
        `residual` (bias first): one op."""
        # self[...] reads the parameter dict directly: this runs ~120 times a decode step
        return native().qmatmul(x, self["packed"], self["scales"], self.get("biases"), n=self.output_dims,
                                group_size=self.group_size, bits=self.bits, scheme=self.scheme, zero=self.zero,
                                sub=self.get("sub"), digits=self.digits,
                                norm_weight=None if norm is None else norm["weight"],
                                eps=0.0 if norm is None else norm.eps, residual=residual, gate=gate,
                                bias=self.get("bias"))

    @property
    def weights(self) -> int:
        return self.input_dims * self.output_dims

    def _extra_repr(self) -> str:
        return f"{self.input_dims}, {self.output_dims}, {self._format()}"


class QSwitchLinear(Packed):
    """mlx_lm's SwitchLinear (a weight per expert; each row through the expert it chose) on the
    packed kernel, the experts' weights stacked along the tiles: the rows that chose an expert are
    computed together, so each chosen expert's weight is read once a step."""

    def __init__(self, parts: dict, *, input_dims: int, output_dims: int, num_experts: int, bits: int,
                 group_size: int = 32, scheme: int = 0, zero: int = 0, ggml_type: Optional[str] = None,
                 bias: Optional[mx.array] = None):
        super().__init__()
        self._set_packed(parts, bits=bits, group_size=group_size, scheme=scheme, zero=zero, ggml_type=ggml_type)
        if bias is not None:
            self.bias = bias
        self.input_dims, self.output_dims, self.num_experts = input_dims, output_dims, num_experts

    @classmethod
    def from_ggml(cls, raw, ggml_type: str, input_dims: int, bias=None) -> "QSwitchLinear":
        experts, outputs = raw.shape[0], raw.shape[1]
        parts, fmt = pack_ggml(raw.reshape(experts * outputs, raw.shape[2]), ggml_type, input_dims)
        return cls(parts, input_dims=input_dims, output_dims=outputs, num_experts=experts, ggml_type=ggml_type,
                   **fmt, bias=None if bias is None else bias.astype(mx.float32))

    @classmethod
    def from_quantized(cls, m) -> "QSwitchLinear":
        """From mlx_lm's QuantizedSwitchLinear (affine)."""
        experts, outputs = m.weight.shape[0], m.weight.shape[1]
        flat = lambda a: a.reshape(experts * outputs, a.shape[-1])  # noqa: E731
        packed, s, b = pack(flat(m.weight), flat(m.scales), flat(m.biases), m.group_size, m.bits)
        bias = m.get("bias")
        return cls({"packed": packed, "scales": s, "biases": b}, input_dims=m.input_dims, output_dims=outputs,
                   num_experts=experts, bits=m.bits, group_size=m.group_size,
                   bias=None if bias is None else bias.astype(mx.float32))

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        """As mlx_lm's: x [..., M, K] broadcast against indices [...] -> [..., M, N]."""
        batch = tuple(mx.broadcast_shapes(x.shape[:-2], indices.shape))
        rows, k = x.shape[-2], x.shape[-1]
        xs = mx.broadcast_to(x, (*batch, rows, k)).reshape(-1, k)
        experts = mx.broadcast_to(mx.expand_dims(indices, -1), (*batch, rows)).reshape(-1)
        y = native().qmatmul_experts(xs, experts, self["packed"], self["scales"], self.get("biases"),
                                     n=self.output_dims, num_experts=self.num_experts, digits=self.digits,
                                     **self.weight_args())
        y = y.reshape(*batch, rows, self.output_dims)
        if "bias" in self:
            y = y + mx.expand_dims(self["bias"][indices], -2)
        return y

    @property
    def weights(self) -> int:
        return self.num_experts * self.input_dims * self.output_dims

    def _extra_repr(self) -> str:
        return f"{self.input_dims}, {self.output_dims}, experts={self.num_experts}, {self._format()}"


class Stacked(nn.Module):
    """Projections of one input computed side by side when their formats keep them apart (a
    Q4_K_M file's Q6_K v beside Q4_K q and k): one matmul each, outputs concatenated."""

    def __init__(self, parts: list[QLinear]):
        super().__init__()
        self.parts = parts
        self.input_dims, self.output_dims = parts[0].input_dims, sum(p.output_dims for p in parts)

    def __call__(self, x: mx.array, norm: Optional["RMSNorm"] = None) -> mx.array:
        return mx.concatenate(self.outputs(x, norm), axis=-1)

    def outputs(self, x: mx.array, norm: Optional["RMSNorm"] = None) -> list[mx.array]:
        """Each part's output, not concatenated (qkv_rope reads them side by side)."""
        return [p(x, norm) for p in self.parts]


class QEmbedding(Packed):
    """A quantized embedding on the packed layout: lookups dequantize rows, `as_linear` is the tied
    output layer on the matmul kernel."""

    def __init__(self, parts: dict, *, num_embeddings: int, dims: int, bits: int, group_size: int = 32,
                 scheme: int = 0, zero: int = 0, ggml_type: Optional[str] = None):
        super().__init__()
        self._set_packed(parts, bits=bits, group_size=group_size, scheme=scheme, zero=zero, ggml_type=ggml_type)
        self.num_embeddings, self.dims = num_embeddings, dims

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
        return cls({"packed": packed, "scales": s, "biases": b}, num_embeddings=w.shape[0],
                   dims=w.shape[1] * 32 // bits, group_size=group_size, bits=bits)

    @classmethod
    def from_ggml(cls, raw, ggml_type: str, dims: int) -> "QEmbedding":
        parts, fmt = pack_ggml(raw, ggml_type, dims)
        return cls(parts, num_embeddings=raw.shape[0], dims=dims, ggml_type=ggml_type, **fmt)

    def __call__(self, ids: mx.array) -> mx.array:
        return native().qgather(ids, self.packed, self.scales, self.get("biases"), n=self.num_embeddings, k=self.dims,
                                **self.weight_args())

    def as_linear(self, x: mx.array) -> mx.array:
        return native().qmatmul(x, self.packed, self.scales, self.get("biases"), n=self.num_embeddings,
                                digits=self.digits, **self.weight_args())

    @property
    def weights(self) -> int:
        return self.num_embeddings * self.dims

    def _extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.dims}, {self._format()}"


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
    that reads the cache's keys and values in place. On mlx_lm's plain float KV caches, the split
    also writes the new keys and values into the cache's buffers (`_write_at`)."""

    def __init__(self, qkv: nn.Module, o_proj: nn.Module, rope: RoPE, n_heads: int, n_kv_heads: int,
                 head_dim: int, scale: float):
        super().__init__()
        self.qkv = qkv
        self.o_proj = o_proj
        self.rope = rope
        self.n_heads, self.n_kv_heads, self.head_dim, self.scale = n_heads, n_kv_heads, head_dim, scale

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        return self.o_proj(self._attend(self._project(x), mask, cache))

    def residual_block(self, x: mx.array, norm: "RMSNorm", mask=None, cache=None) -> mx.array:
        """x + self(norm(x)), with the norm and the addition fused into the packed projections."""
        return self.o_proj(self._attend(self._project(x, norm), mask, cache), residual=x)

    def _project(self, x: mx.array, norm: Optional["RMSNorm"] = None) -> list[mx.array]:
        """q, k and v side by side, as one array or (Stacked) its parts: no concatenation op."""
        if isinstance(self.qkv, Stacked):
            return self.qkv.outputs(x, norm)
        return [self.qkv(x) if norm is None else self.qkv(x, norm=norm)]

    def _attend(self, parts: list[mx.array], mask, cache) -> mx.array:
        offset = 0 if cache is None else cache.offset
        if not isinstance(offset, mx.array):
            offset = mx.array(offset, dtype=mx.int32)
        r = self.rope
        split = dict(heads=self.n_heads, kv_heads=self.n_kv_heads, head_dim=self.head_dim, dims=r.dims,
                     traditional=r.traditional, base=r.base, scale=r.scale, offset=offset, freqs=r.get("_freqs"))
        causal = isinstance(mask, str) and mask == "causal"
        mask = None if isinstance(mask, str) else mask
        at = _write_at(cache, parts[0].shape[1])
        if at is not None:
            q, cache.keys, cache.values = native().qkv_rope(parts, k_cache=cache.keys, v_cache=cache.values,
                                                            write_at=at, **split)
            length = _advance(cache, parts[0].shape[1])
            return native().attention(q, cache.keys, cache.values, scale=self.scale, causal=causal, mask=mask,
                                      kv_len=length)
        q, k, v = native().qkv_rope(parts, **split)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        if isinstance(getattr(cache, "bits", None), int):  # quantized keys and values (engine/caches/kv_quant.py)
            return native().quantized_attention(q, *k, *v, scale=self.scale, bits=cache.bits,
                                                group_size=cache.group_size, causal=causal, mask=mask)
        return native().attention(q, k, v, scale=self.scale, causal=causal, mask=mask)


def _write_at(cache, tokens: int) -> Optional[int]:
    """The column where `tokens` new keys go in an mlx_lm KVCache or BatchKVCache (exactly those
    classes) when its float32 buffers already have room for them; None when mlx_lm's own
    update_and_fetch must run (no cache, another kind, or the buffers must grow)."""
    kind = type(cache)
    if kind is not KVCache and kind is not BatchKVCache:
        return None
    keys = cache.keys
    if keys is None or keys.dtype != mx.float32 or cache.values.dtype != mx.float32:
        return None
    at = cache._idx if kind is BatchKVCache else cache.offset
    return at if at + tokens <= keys.shape[2] else None


def _advance(cache, tokens: int) -> int:
    """The bookkeeping mlx_lm's update_and_fetch does after writing `tokens` keys (offsets moved
    on); returns how many keys the cache now holds."""
    cache.offset = cache.offset + tokens
    if type(cache) is BatchKVCache:
        cache._idx += tokens
        return cache._idx
    return cache.offset


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
