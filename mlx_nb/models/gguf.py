"""Convert a llama-architecture GGUF file into a model directory that `mlx_lm.load` opens.

mlx_lm can export GGUF but cannot import it, and `mx.load` only returns raw tensors and metadata
under llama.cpp's names. This module renames the tensors to mlx_lm's llama layout, rebuilds
config.json and a Hugging Face fast tokenizer from the metadata, and writes the directory
atomically (see `atomic`), so an interrupted conversion leaves nothing behind.

Weights stay as stored: MLX reads Q4_0/Q4_1/Q8_0 blocks as affine 4- or 8-bit with group size 32,
so the quantization config names every layer with its own bits; other GGUF block types come back
from `mx.load` as float16 and are written unquantized. llama.cpp permutes the q/k rows for
interleaved RoPE, hence `rope_traditional: true` instead of undoing the permutation.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from mlx_nb.models.atomic import COMPLETE_MARKER, build_atomically, is_complete
from mlx_nb.models.gguf_meta import GGUFError
from mlx_nb.models.gguf_meta import corrupt as _corrupt
from mlx_nb.models.gguf_meta import meta as _meta
from mlx_nb.models.gguf_meta import value as _value
from mlx_nb.models.gguf_tokenizer import write_tokenizer as _write_tokenizer
from mlx_nb.models.progress import report

GROUP_SIZE = 32  # every GGUF block type MLX keeps quantized (Q4_0, Q4_1, Q8_0) has 32 weights a block

_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TENSOR = re.compile(r"^(?:blk\.(\d+)\.)?(\w+)\.(weight|bias|scales|biases)$")
_OUTPUT_FILES = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    COMPLETE_MARKER,
}
_SAFETENSORS_DTYPES = {
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "uint32": "U32",
    "int32": "I32",
    "uint8": "U8",
    "int8": "I8",
    "uint16": "U16",
    "int16": "I16",
}



def convert_gguf(gguf_path: str | Path, dest_dir: str | Path, *, progress: bool = True) -> Path:
    """Convert `gguf_path` into `dest_dir` (unless it already holds a finished conversion); returns `dest_dir`."""
    src, dest = Path(gguf_path).expanduser(), Path(dest_dir).expanduser()
    if is_complete(dest):
        return dest
    _check_dest(dest)
    _check_magic(src)
    weights, meta = _load(src)
    arch = _value(meta.get("general.architecture"))
    if arch != "llama":
        raise GGUFError(
            f"{src} is a {arch!r} model and only 'llama' GGUF files can be converted: "
            "pass a llama-architecture GGUF or load the model's MLX/Hugging Face directory instead"
        )
    config, tensors = _model(src, weights, meta)
    return build_atomically(dest, lambda tmp: _write(tmp, src, config, tensors, meta, progress))


def _check_dest(dest: Path) -> None:
    if dest.exists() and not dest.is_dir():
        raise GGUFError(f"{dest} exists and is not a directory: pick another destination")
    if dest.is_dir() and any(p.name not in _OUTPUT_FILES for p in dest.iterdir()):
        raise GGUFError(f"{dest} exists and is not a converted model: remove it or pick another destination")


def _check_magic(src: Path) -> None:
    if not src.exists():
        raise GGUFError(f"GGUF file not found: {src}: check the path")
    if src.is_dir():
        raise GGUFError(f"{src} is a directory, not a GGUF file: pass the .gguf file itself")
    try:
        with open(src, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise GGUFError(f"cannot read {src} ({exc.strerror or exc}): check its permissions") from exc
    if magic != b"GGUF":
        raise GGUFError(f"{src} is not a GGUF file (no GGUF magic bytes): pass a .gguf model file")


def _load(src: Path) -> tuple[dict, dict]:
    import mlx.core as mx

    try:
        return mx.load(str(src), return_metadata=True)
    except Exception as exc:
        reason = " ".join(str(exc).replace("[load_gguf]", "").split()).split(". ")[0].rstrip(".")
        reason = reason or type(exc).__name__
        raise GGUFError(
            f"{src} is not a valid GGUF file (truncated or corrupt: {reason}): re-download it or pass another file"
        ) from exc


def _model(src: Path, weights: dict, meta: dict) -> tuple[dict, dict]:
    """The mlx_lm config and the renamed tensors (insertion order = write order)."""
    if _meta(src, meta, "llama.expert_count", 0):
        raise GGUFError(
            f"{src} is a mixture-of-experts llama (Mixtral-style), which is not supported: pass a dense llama GGUF"
        )
    n_layers = int(_meta(src, meta, "llama.block_count"))
    hidden = int(_meta(src, meta, "llama.embedding_length"))
    heads = int(_meta(src, meta, "llama.attention.head_count"))
    kv_heads = int(_meta(src, meta, "llama.attention.head_count_kv", heads))
    head_dim = int(_meta(src, meta, "llama.attention.key_length", hidden // heads))
    rope_dim = int(_meta(src, meta, "llama.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise GGUFError(
            f"{src} uses partial RoPE ({rope_dim} of {head_dim} dims), which mlx_lm's llama does not support: "
            "pass another file"
        )

    tensors: dict[str, Any] = {}
    rope_freqs = None
    unknown = []
    for name in sorted(weights, key=_tensor_order):
        if name == "rope_freqs.weight":
            rope_freqs = weights[name]
            continue
        m = _TENSOR.match(name)
        block, base, suffix = (m.groups() if m else (None, None, None))
        target = (_BLOCK_NAMES.get(base) if block is not None else _TOP_NAMES.get(base)) if m else None
        if target is None or (block is not None and int(block) >= n_layers):
            unknown.append(name)
            continue
        prefix = f"model.layers.{block}." if block is not None else ""
        tensors[f"{prefix}{target}.{suffix}"] = weights[name]
    if unknown:
        raise GGUFError(
            f"{src} has tensors a llama model does not ({', '.join(unknown[:3])}{', ...' * (len(unknown) > 3)}): "
            "it is not a standard llama GGUF; pass another file"
        )

    required = ["model.embed_tokens.weight", "model.norm.weight"] + [
        f"model.layers.{i}.{t}.weight" for i in range(n_layers) for t in _BLOCK_NAMES.values()
    ]
    missing = [n for n in required if n not in tensors]
    if missing:
        raise _corrupt(src, f"{len(missing)} tensors missing, e.g. {missing[0]}")

    quantization = _quantization(src, tensors)
    embed = tensors["model.embed_tokens.weight"]
    vocab_size = embed.shape[0]
    meta_vocab = _meta(src, meta, "llama.vocab_size", None)
    if meta_vocab is None and "tokenizer.ggml.tokens" in meta:
        meta_vocab = len(meta["tokenizer.ggml.tokens"])
    if meta_vocab is not None and int(meta_vocab) != vocab_size:
        raise _corrupt(src, f"vocab_size {meta_vocab} but token_embd has {vocab_size} rows")

    rope_theta = float(_meta(src, meta, "llama.rope.freq_base", 10000.0))
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": int(_meta(src, meta, "llama.feed_forward_length")),
        "num_hidden_layers": n_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(_meta(src, meta, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": rope_theta,
        "rope_traditional": True,
        "max_position_embeddings": int(_meta(src, meta, "llama.context_length", 4096)),
        "vocab_size": vocab_size,
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in tensors,
        "mlp_bias": "model.layers.0.mlp.up_proj.bias" in tensors,
    }
    rope_scaling = _rope_scaling(src, meta, rope_freqs, head_dim, rope_theta)
    if rope_scaling:
        config["rope_scaling"] = rope_scaling
    if quantization:
        config["quantization"] = quantization
        config["quantization_config"] = quantization
    return config, tensors


def _tensor_order(name: str) -> tuple:
    m = re.match(r"^blk\.(\d+)\.", name)
    return (1, int(m.group(1)), name) if m else (0 if name.startswith("token_embd") else 2, 0, name)


def _quantization(src: Path, tensors: dict) -> dict:
    """mlx_lm's `quantization` config: a default plus one entry per quantized module path.

    GGUF files mix bit widths (here the embedding is 8-bit, the rest 4-bit), and mlx_lm's loader
    takes `config["quantization"][module_path]` as that module's `to_quantized` arguments.
    """
    layers = {}
    for name, scales in tensors.items():
        if not name.endswith(".scales"):
            continue
        path = name[: -len(".scales")]
        weight = tensors.get(f"{path}.weight")
        if weight is None or f"{path}.biases" not in tensors:
            raise _corrupt(src, f"{path} has scales but no packed weight or biases")
        in_dims = scales.shape[-1] * GROUP_SIZE
        bits, rest = divmod(weight.shape[-1] * 32, in_dims)
        if rest or bits not in (2, 3, 4, 5, 6, 8):
            raise _corrupt(src, f"{path} has inconsistent quantized shapes")
        layers[path] = {"group_size": GROUP_SIZE, "bits": bits, "mode": "affine"}
    if not layers:
        return {}
    default_bits = Counter(q["bits"] for q in layers.values()).most_common(1)[0][0]
    return {"group_size": GROUP_SIZE, "bits": default_bits, "mode": "affine", **layers}


def _rope_scaling(src: Path, meta: dict, rope_freqs: Any, head_dim: int, base: float) -> dict | None:
    kind = _meta(src, meta, "llama.rope.scaling.type", "none")
    factor = float(_meta(src, meta, "llama.rope.scaling.factor", 1.0) or 1.0)
    if kind == "linear" and factor != 1.0:
        return {"type": "linear", "factor": factor}
    if kind not in ("none", "linear"):
        raise GGUFError(f"{src} uses {kind!r} RoPE scaling, which this converter does not map: pass another file")
    if rope_freqs is None:
        return None
    return _llama3_scaling(src, meta, _value(rope_freqs), head_dim, base)


def _llama3_scaling(src: Path, meta: dict, factors: list, head_dim: int, base: float) -> dict | None:
    """Llama 3.1+ files store the per-dimension RoPE factors (`rope_freqs`) instead of their parameters.

    Recover the parameters mlx_lm's `Llama3RoPE` takes and check they reproduce the table exactly.
    """
    if len(factors) != head_dim // 2:
        raise _corrupt(src, f"rope_freqs has {len(factors)} entries for head_dim {head_dim}")
    if all(abs(f - 1.0) < 1e-6 for f in factors):
        return None
    scaling = {
        "rope_type": "llama3",
        "factor": float(max(factors)),
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": int(
            _meta(src, meta, "llama.rope.scaling.original_context_length", 8192)
        ),
    }
    expected = llama3_rope_factors(scaling, head_dim, base)
    if not all(math.isclose(a, b, rel_tol=1e-3) for a, b in zip(factors, expected)):
        raise GGUFError(
            f"{src} has a rope_freqs table that is not Llama 3 RoPE scaling, which this converter cannot map: "
            "pass another file"
        )
    return scaling


def llama3_rope_factors(scaling: dict, head_dim: int, base: float) -> list[float]:
    """The per-dimension wavelength factors llama.cpp stores as `rope_freqs` for Llama 3 scaling."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def _write(out: Path, src: Path, config: dict, tensors: dict, meta: dict, progress: bool) -> None:
    from tqdm.auto import tqdm

    tokenizer_info = _write_tokenizer(out, src, meta, config["max_position_embeddings"])
    for key in ("bos_token_id", "eos_token_id"):
        if tokenizer_info.get(key) is not None:
            config[key] = tokenizer_info[key]
    (out / "config.json").write_text(json.dumps(dict(sorted(config.items())), indent=2))
    generation = {k: v for k, v in tokenizer_info.items() if v is not None}
    if generation:
        (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    with tqdm(total=len(tensors), desc=f"Converting {src.name}", unit="tensor", disable=not progress) as bar:
        _write_safetensors(out / "model.safetensors", tensors, bar)


def _write_safetensors(path: Path, tensors: dict, bar) -> None:
    """Stream the tensors one by one into a safetensors file, so the progress bar follows the writing."""
    header: dict[str, Any] = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for name, arr in tensors.items():
        dtype = _SAFETENSORS_DTYPES.get(str(arr.dtype).rsplit(".", 1)[-1])
        if dtype is None:
            raise GGUFError(f"tensor {name} has dtype {arr.dtype}, which cannot be saved: pass another file")
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for i, arr in enumerate(tensors.values()):
            _write_tensor(f, arr)
            bar.update(1)
            report("converting GGUF", i + 1, len(tensors))


def _write_tensor(f, arr) -> None:
    import mlx.core as mx

    mx.eval(arr)
    f.write(memoryview(arr))
