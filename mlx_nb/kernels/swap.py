"""Put a loaded model's layers on the kernels, through MLX's public module API (as `nn.quantize`
does): a module is replaced by one that computes the same thing, found by its class and checked
where the class alone does not prove it.

- `nn.QuantizedLinear` / `nn.QuantizedEmbedding` (affine, 4 or 8 bits) -> packed `QLinear` /
  `QEmbedding`: the same q, scales and biases, never dequantized. A tied output layer
  (`embed_tokens.as_linear`) runs on the matmul kernel too.
- With `quantize=4|8`, float `nn.Linear` / `nn.Embedding` of the language model are quantized first
  (group size 32, as GGUF's Q4/Q8 blocks), for checkpoints shipped in float.
- A gate / up / down MLP whose output is down(silu(gate(x)) * up(x)) -> `SwiGLU` with gate and up
  fused; accepted only if it matches the original module on a random input.
- `nn.RMSNorm`, `nn.RoPE` -> fused kernels. Anything else is left as it is and runs on MLX's ops.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn

from mlx_nb.kernels.layers import QEmbedding, QLinear, RMSNorm, RoPE, SwiGLU

BITS = (4, 8)


def _packable(m: nn.Module) -> Optional[str]:
    """None if the kernels can take this quantized module, else why not."""
    mode = getattr(m, "mode", "affine")
    if mode != "affine":
        return f"{mode} quantization"
    if m.bits not in BITS:
        return f"{m.bits}-bit weights"
    if m.group_size % 32:
        return f"group size {m.group_size}"
    return None


def _dequantized(m: nn.Module) -> nn.Module:
    """A float32 module for a quantized one the kernels can't take (what the float32 path does)."""
    w = mx.dequantize(m.weight, m.scales, m.get("biases"), group_size=m.group_size, bits=m.bits,
                      mode=getattr(m, "mode", "affine")).astype(mx.float32)
    if isinstance(m, nn.QuantizedEmbedding):
        out = nn.Embedding(*w.shape)
    else:
        out = nn.Linear(w.shape[1], w.shape[0], bias="bias" in m)
        if "bias" in m:
            out.bias = m.bias.astype(mx.float32)
    out.weight = w
    return out


def _replace_children(module: nn.Module, fn: Callable[[str, nn.Module], Optional[nn.Module]], path: str = "") -> None:
    """Depth-first: each child module (also inside lists and dicts) for which fn returns a module is
    replaced by it; the others are walked into."""

    def visit(key: str, child):
        if isinstance(child, nn.Module):
            new = fn(key, child)
            if new is not None:
                return new
            _replace_children(child, fn, key)
        elif isinstance(child, list):
            for i, c in enumerate(child):
                child[i] = visit(f"{key}.{i}", c)
        elif isinstance(child, dict):
            for k in list(child):
                child[k] = visit(f"{key}.{k}", child[k])
        return child

    for name in list(module.keys()):
        value = module[name]
        if isinstance(value, (nn.Module, list, dict)) and not isinstance(value, mx.array):
            new = visit(f"{path}.{name}" if path else name, value)
            if new is not value:
                setattr(module, name, new)


def _linear_parts(m: nn.Module):
    if isinstance(m, QLinear):
        return "q", m
    if isinstance(m, nn.Linear) and not isinstance(m, nn.QuantizedLinear):
        return "f", m
    return None, m


def _fused_swiglu(m: nn.Module) -> Optional[SwiGLU]:
    """A SwiGLU for an MLP made of gate_proj / up_proj / down_proj and nothing else, if it computes
    down(silu(gate(x)) * up(x)); its children are already swapped."""
    names = set(m.keys())
    if names != {"gate_proj", "up_proj", "down_proj"}:
        return None
    (kg, gate), (ku, up) = _linear_parts(m["gate_proj"]), _linear_parts(m["up_proj"])
    if kg is None or kg != ku or "bias" in gate or "bias" in up:
        return None
    if kg == "q":
        if (gate.bits, gate.group_size, gate.input_dims, gate.scales.dtype) != (
                up.bits, up.group_size, up.input_dims, up.scales.dtype) or gate.output_dims % 16:
            return None
        gate_up = QLinear(mx.concatenate([gate.packed, up.packed]), mx.concatenate([gate.scales, up.scales]),
                          mx.concatenate([gate.biases, up.biases]), input_dims=gate.input_dims,
                          output_dims=gate.output_dims + up.output_dims, group_size=gate.group_size, bits=gate.bits)
        hidden, dims = gate.output_dims, gate.input_dims
    else:
        if gate.weight.shape != up.weight.shape:
            return None
        gate_up = nn.Linear(gate.weight.shape[1], 2 * gate.weight.shape[0], bias=False)
        gate_up.weight = mx.concatenate([gate.weight, up.weight])
        hidden, dims = gate.weight.shape[0], gate.weight.shape[1]
    fused = SwiGLU(gate_up, m["down_proj"], hidden)
    x = mx.random.normal((2, 3, dims), key=mx.random.key(0))
    want, got = m(x), fused(x)
    err = float(mx.linalg.norm(want - got) / (mx.linalg.norm(want) + 1e-12))
    return fused if err < 0.05 else None


def swap_model(model: nn.Module, quantize: Optional[int] = None, language_model: Optional[nn.Module] = None) -> dict:
    """Swap `model`'s modules onto the kernels in place; returns what was swapped and what was not
    (with reasons). `quantize` (4 or 8) first quantizes `language_model`'s float linears."""
    done: Counter = Counter()
    left: Counter = Counter()

    def quantized(path: str, m: nn.Module):
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            why = _packable(m)
            if why is None:
                done["quantized " + ("embedding" if isinstance(m, nn.QuantizedEmbedding) else "linear")] += 1
                return QEmbedding.from_quantized(m) if isinstance(m, nn.QuantizedEmbedding) else QLinear.from_quantized(m)
            left[f"{why} (dequantized to float32)"] += 1
            return _dequantized(m)
        return None

    _replace_children(model, quantized)

    if quantize:
        if quantize not in BITS:
            raise ValueError(f"quantize must be 4 or 8, not {quantize!r}")

        def floats(path: str, m: nn.Module):
            if type(m) is nn.Linear and m.weight.shape[1] % 32 == 0:
                done[f"float linear quantized to {quantize} bits"] += 1
                return QLinear.from_linear(m, quantize)
            if type(m) is nn.Embedding and m.weight.shape[1] % 32 == 0:
                done[f"float embedding quantized to {quantize} bits"] += 1
                return QEmbedding.from_embedding(m, quantize)
            return None

        _replace_children(language_model if language_model is not None else model, floats)

    def fused(path: str, m: nn.Module):
        if type(m) is nn.RMSNorm:
            done["rms_norm"] += 1
            return RMSNorm(m.weight, m.eps)
        if type(m) is nn.RoPE:
            done["rope"] += 1
            return RoPE(m.dims, m.traditional, m.base, m.scale)
        if "gate_proj" in m and "down_proj" in m:
            f = _fused_swiglu(m)
            if f is not None:
                done["swiglu mlp"] += 1
                return f
            left["mlp kept (not a plain SwiGLU)"] += 1
        return None

    _replace_children(model, fused)
    mx.eval(model.parameters())
    return {"swapped": dict(done), "kept": dict(left)}
