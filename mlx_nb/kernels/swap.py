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
- `nn.RMSNorm`, `nn.RoPE` -> fused kernels.
- A llama-family attention (q/k/v/o projections and a RoPE, nothing else) -> `Attention`, with q/k/v
  fused and the attention kernel; accepted only if it matches the original on a random input.
- A decoder layer made of those (pre-norm attention and MLP with skip connections, packed weights)
  -> `Block`, with the norms and the additions fused into the projections; checked the same way.
Anything else is left as it is and runs on MLX's ops.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn

from mlx_nb.kernels.layers import Attention, Block, Packed, QEmbedding, QLinear, RMSNorm, RoPE, Stacked, SwiGLU

BITS = (4, 5, 6, 8)


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
        if gate.input_dims != up.input_dims:
            return None
        gate_up = QLinear.concat([gate, up]) or Stacked([gate, up])  # Stacked: their formats differ
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
    return fused if err < 1e-3 else None  # the same projections: only the activation kernel differs


def _rope_with_freqs(m: nn.Module) -> Optional[RoPE]:
    """Our RoPE for a module that is mx.fast.rope with its own frequency table (mlx_lm's Llama3RoPE:
    Llama 3.1+'s scaling), if it computes the same at a few offsets."""
    fused = RoPE(m.dims, m.traditional, None, 1.0, freqs=m["_freqs"])
    x = mx.random.normal((2, 3, 5, m.dims), key=mx.random.key(2))
    for offset in (0, 7, mx.array([3, 300])):
        want, got = m(x, offset=offset), fused(x, offset=offset)
        if float(mx.abs(want - got).max()) > 1e-4 * (float(mx.abs(want).max()) + 1e-6):
            return None
    return fused


def _concat_linears(parts: list) -> Optional[nn.Module]:
    """One projection computing `parts` side by side (all packed alike, or all float), or None."""
    kinds = {_linear_parts(p)[0] for p in parts}
    if kinds == {"q"}:
        same = QLinear.concat(parts)
        if same is None and len({p.input_dims for p in parts}) == 1 and len({"bias" in p for p in parts}) == 1:
            return Stacked(_runs_of_one_format(parts))
        return same
    if kinds == {"f"}:
        if len({p.weight.shape[1] for p in parts}) > 1 or len({"bias" in p for p in parts}) > 1:
            return None
        fused = nn.Linear(parts[0].weight.shape[1], sum(p.weight.shape[0] for p in parts), bias="bias" in parts[0])
        fused.weight = mx.concatenate([p.weight for p in parts])
        if "bias" in parts[0]:
            fused.bias = mx.concatenate([p.bias for p in parts])
        return fused
    return None


def _runs_of_one_format(parts: list) -> list:
    """`parts` with each run of neighbours QLinear.concat can join joined (a Q4_K_M file's Q4_K q
    and k as one projection beside its Q6_K v): one matmul a run."""
    runs = [parts[0]]
    for p in parts[1:]:
        joined = QLinear.concat([runs[-1], p])
        runs[-1:] = [joined] if joined is not None else [runs[-1], p]
    return runs


def _output_dims(m: nn.Module) -> Optional[int]:
    if isinstance(m, QLinear):
        return m.output_dims
    return m.weight.shape[0] if isinstance(m, nn.Linear) and "weight" in m else None


def _fused_attention(m: nn.Module) -> Optional[Attention]:
    """An Attention for a llama-family attention module, if it computes the same thing."""
    if set(m.keys()) != {"q_proj", "k_proj", "v_proj", "o_proj", "rope"} or not isinstance(m["rope"], RoPE):
        return None
    heads, kv_heads = getattr(m, "n_heads", None), getattr(m, "n_kv_heads", None)
    head_dim, scale = getattr(m, "head_dim", None), getattr(m, "scale", None)
    if head_dim is None and isinstance(heads, int) and heads:  # qwen2's keeps it in a local: the q outputs tell
        q_out = _output_dims(m["q_proj"])
        head_dim = q_out // heads if q_out and q_out % heads == 0 else None
    if not all(isinstance(v, int) for v in (heads, kv_heads, head_dim)) or not isinstance(scale, float):
        return None
    qkv = _concat_linears([m["q_proj"], m["k_proj"], m["v_proj"]])
    if qkv is None:
        return None
    fused = Attention(qkv, m["o_proj"], m["rope"], heads, kv_heads, head_dim, scale)
    dims = m["q_proj"].input_dims if isinstance(m["q_proj"], QLinear) else m["q_proj"].weight.shape[1]
    return fused if _same_with_a_cache(m, fused, dims, 1e-3) else None


def _same_with_a_cache(original: nn.Module, fused: nn.Module, dims: int, tol: float) -> bool:
    """Whether `fused` computes what `original` does, called as mlx_lm calls a layer: a causal
    prompt of 5 tokens on a fresh KV cache, then one token more (relative error within tol)."""
    from mlx_lm.models.cache import KVCache

    x = mx.random.normal((2, 5, dims), key=mx.random.key(1))
    try:
        c1, c2 = KVCache(), KVCache()
        want = [original(x, mask="causal", cache=c1), original(x[:, :1], cache=c1)]
        got = [fused(x, mask="causal", cache=c2), fused(x[:, :1], cache=c2)]
    except Exception:  # a module whose call differs from the llama family's
        return False
    return all(w.shape == g.shape and float(mx.linalg.norm(w - g) / (mx.linalg.norm(w) + 1e-12)) <= tol
               for w, g in zip(want, got))


BLOCK_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}


def _fused_block(m: nn.Module) -> Optional[Block]:
    """A Block for a llama-family decoder layer whose parts are all on the packed kernels, if it
    computes what the layer does (x + attn(norm(x)), then h + mlp(norm(h)))."""
    if set(m.keys()) != BLOCK_PARTS:
        return None
    attn, mlp, n1, n2 = m["self_attn"], m["mlp"], m["input_layernorm"], m["post_attention_layernorm"]
    if not (isinstance(attn, Attention) and isinstance(mlp, SwiGLU) and isinstance(n1, RMSNorm)
            and isinstance(n2, RMSNorm)):
        return None
    if not all(isinstance(p, (QLinear, Stacked)) for p in (attn.qkv, attn.o_proj, mlp.gate_up, mlp.down_proj)):
        return None
    fused = Block(attn, mlp, n1, n2)
    return fused if _same_with_a_cache(m, fused, attn.qkv.input_dims, 1e-4) else None


def floats_to_float32(model: nn.Module) -> None:
    """Every float parameter as float32 (the CPU's compute type), but those of weights already
    packed for the kernels: their float16 scales are part of the packed format."""
    for _, m in model.named_modules():
        if isinstance(m, Packed):
            continue
        for name, value in m.items():
            if isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating) and value.dtype != mx.float32:
                m[name] = value.astype(mx.float32)


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

    def checked(original: nn.Module, fused: Optional[nn.Module], kind: str, refused: str) -> Optional[nn.Module]:
        """A fused module that matched its original, counted, carrying the original's plain attributes
        that model code may read (a layer's `use_sliding`, say); or None (the original stays), counted."""
        (done if fused is not None else left)[kind if fused is not None else refused] += 1
        if fused is not None:
            for name, value in vars(original).items():
                if not name.startswith("_") and not hasattr(fused, name):
                    object.__setattr__(fused, name, value)
        return fused

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
        if type(m).__name__ == "Llama3RoPE" and isinstance(m.get("_freqs"), mx.array):
            return checked(m, _rope_with_freqs(m), "rope", "rope kept (not mx.fast.rope with frequencies)")
        if "gate_proj" in m and "down_proj" in m:
            return checked(m, _fused_swiglu(m), "swiglu mlp", "mlp kept (not a plain SwiGLU)")
        return None

    _replace_children(model, fused)

    def attention(path: str, m: nn.Module):
        if "q_proj" in m and "o_proj" in m and "rope" in m:
            return checked(m, _fused_attention(m), "attention", "attention kept (not a plain llama-family attention)")
        return None

    _replace_children(model, attention)

    def block(path: str, m: nn.Module):
        if BLOCK_PARTS <= set(m.keys()):
            return checked(m, _fused_block(m), "decoder layer", "decoder layer kept (not a plain llama-family layer)")
        return None

    _replace_children(model, block)
    mx.eval(model.parameters())
    from mlx_nb.kernels.precision import set_activation_digits

    return {"swapped": dict(done), "kept": dict(left), "activations": set_activation_digits(model)}
