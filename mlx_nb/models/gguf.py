"""Convert a GGUF file into a model directory that mlx_nb's loader opens (mlx_lm's layout).

mlx_lm can export GGUF but cannot import it, and `mx.load` widens K-quant blocks to float16. This
module reads the file with gguf-py (`gguf_read`), maps its architecture to an mlx_lm model
(`gguf_arch`: llama / Mistral, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3), rebuilds config.json
and a Hugging Face fast tokenizer from the metadata, and writes the directory atomically (see
`atomic`), so an interrupted conversion leaves nothing behind.

Weights stay as stored: float tensors go to model.safetensors (what mlx_lm reads), and every
quantized tensor keeps its GGUF blocks byte for byte in ggml.safetensors, its block type named in
config.json's `gguf.tensors`; `gguf_load` repacks them for the CPU kernels at load (or dequantizes
them where the kernels are not built).
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from mlx_nb.models.atomic import COMPLETE_MARKER, build_atomically, is_complete
from mlx_nb.models.gguf_arch import CONFIG_TENSORS, REQUIRED_BIASES, TOP_NAMES, Arch, Meta, arch_of
from mlx_nb.models.gguf_meta import GGUFError
from mlx_nb.models.gguf_meta import corrupt as _corrupt
from mlx_nb.models.gguf_meta import meta as _meta
from mlx_nb.models.gguf_read import Tensor, read
from mlx_nb.models.gguf_tokenizer import write_tokenizer as _write_tokenizer
from mlx_nb.models.progress import report

WEIGHTS = "model.safetensors"
BLOCKS = "ggml.safetensors"  # not model*.safetensors: mlx_lm's loader must not read raw blocks as weights

_TENSOR = re.compile(r"^(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)$")
_OUTPUT_FILES = {
    "config.json",
    WEIGHTS,
    BLOCKS,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    COMPLETE_MARKER,
}
_SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "uint8": "U8"}


def convert_gguf(gguf_path: str | Path, dest_dir: str | Path, *, progress: bool = True) -> Path:
    """Convert `gguf_path` into `dest_dir` (unless it already holds a finished conversion); returns `dest_dir`."""
    src, dest = Path(gguf_path).expanduser(), Path(dest_dir).expanduser()
    if is_complete(dest):
        return dest
    _check_dest(dest)
    _check_magic(src)
    meta, tensors = _load(src)
    config, floats, blocks = _model(src, meta, tensors)
    return build_atomically(dest, lambda tmp: _write(tmp, src, config, floats, blocks, meta, progress))


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


def _load(src: Path) -> tuple[dict, dict[str, Tensor]]:
    return read(src)


def _model(src: Path, meta: dict, tensors: dict[str, Tensor]) -> tuple[dict, dict, dict]:
    """The mlx_lm config, the float tensors and the quantized ones, renamed (insertion order = write order)."""
    arch_name, arch = arch_of(src, meta)
    m = Meta(src, meta, arch_name)
    config: dict[str, Any] = {"model_type": arch.model_type, **m.shape(), **arch.config(m, tensors)}
    n_layers = config["num_hidden_layers"]

    floats: dict[str, np.ndarray] = {}
    blocks: dict[str, Tensor] = {}
    unknown = []
    for name in sorted(tensors, key=_tensor_order):
        if name in CONFIG_TENSORS:
            continue
        mt = _TENSOR.match(name)
        block, base, suffix = (mt.groups() if mt else (None, None, None))
        target = (arch.block.get(base) if block is not None else TOP_NAMES.get(base)) if mt else None
        if target is None or (block is not None and int(block) >= n_layers):
            unknown.append(name)
            continue
        path = f"model.layers.{block}.{target}" if block is not None else target
        t = tensors[name]
        if t.quantized and len(t.shape) >= 2:
            blocks[f"{path}.{suffix}"] = t
        else:
            values = t.floats() if t.quantized or t.kind == "BF16" else np.asarray(t.data).reshape(t.shape)
            if arch.norm_offset and base.endswith("norm"):
                values = values.astype(np.float32) - np.float32(arch.norm_offset)
            floats[f"{path}.{suffix}"] = values
    if unknown:
        raise GGUFError(
            f"{src} has tensors a {arch_name} model does not ({', '.join(unknown[:3])}{', ...' * (len(unknown) > 3)}): "
            f"it is not a standard {arch_name} GGUF; pass another file"
        )

    present = set(floats) | set(blocks)
    required = ["model.embed_tokens.weight", "model.norm.weight"] + [
        f"model.layers.{i}.{t}.weight" for i in range(n_layers) for t in arch.block.values()
    ] + [f"model.layers.{i}.{arch.block[b]}.bias" for i in range(n_layers) for b in REQUIRED_BIASES.get(arch_name, ())]
    missing = [n for n in required if n not in present]
    if missing:
        raise _corrupt(src, f"{len(missing)} tensors missing, e.g. {missing[0]}")

    embed = tensors["token_embd.weight"]
    vocab_size = embed.shape[0]
    meta_vocab = m("vocab_size", None)
    if meta_vocab is None and "tokenizer.ggml.tokens" in meta:
        meta_vocab = len(meta["tokenizer.ggml.tokens"])
    if meta_vocab is not None and int(meta_vocab) != vocab_size:
        raise _corrupt(src, f"vocab_size {meta_vocab} but token_embd has {vocab_size} rows")
    config["vocab_size"] = vocab_size
    config["tie_word_embeddings"] = "lm_head.weight" not in present
    if arch_name == "llama":
        rope_freqs = tensors.get("rope_freqs.weight")
        rope_scaling = _rope_scaling(src, m, None if rope_freqs is None else rope_freqs.floats().tolist(),
                                     config["head_dim"], config["rope_theta"])
        if rope_scaling:
            config["rope_scaling"] = rope_scaling
    if blocks:
        config["gguf"] = {"file": src.name, "tensors": {name[: -len(".weight")]: t.kind
                                                        for name, t in blocks.items()}}
    return config, floats, blocks


def _tensor_order(name: str) -> tuple:
    m = re.match(r"^blk\.(\d+)\.", name)
    return (1, int(m.group(1)), name) if m else (0 if name.startswith("token_embd") else 2, 0, name)


def _rope_scaling(src: Path, m: Meta, rope_freqs: Any, head_dim: int, base: float) -> dict | None:
    kind = m("rope.scaling.type", "none")
    factor = float(m("rope.scaling.factor", 1.0) or 1.0)
    if kind == "linear" and factor != 1.0:
        return {"type": "linear", "factor": factor}
    if kind not in ("none", "linear"):
        raise GGUFError(f"{src} uses {kind!r} RoPE scaling, which this converter does not map: pass another file")
    if rope_freqs is None:
        return None
    return _llama3_scaling(src, m, rope_freqs, head_dim, base)


def _llama3_scaling(src: Path, m: Meta, factors: list, head_dim: int, base: float) -> dict | None:
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
            m("rope.scaling.original_context_length", 8192)
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


def _write(out: Path, src: Path, config: dict, floats: dict, blocks: dict, meta: dict, progress: bool) -> None:
    from tqdm.auto import tqdm

    tokenizer_info = _write_tokenizer(out, src, meta, config["max_position_embeddings"])
    for key in ("bos_token_id", "eos_token_id"):
        if tokenizer_info.get(key) is not None:
            config[key] = tokenizer_info[key]
    config["pad_token_id"] = tokenizer_info.get("pad_token_id")  # null, not transformers' default for the class
    (out / "config.json").write_text(json.dumps(dict(sorted(config.items())), indent=2))
    generation = {k: v for k, v in tokenizer_info.items() if v is not None}
    if generation:
        (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    total = len(floats) + len(blocks)
    done = [0]

    def step() -> None:
        done[0] += 1
        bar.update(1)
        report("converting GGUF", done[0], total)

    with tqdm(total=total, desc=f"Converting {src.name}", unit="tensor", disable=not progress) as bar:
        _write_safetensors(out / WEIGHTS, floats, step)
        if blocks:
            _write_safetensors(out / BLOCKS, {name: t.data for name, t in blocks.items()}, step)


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray], step) -> None:
    """Stream the tensors one by one into a safetensors file, so the progress bar follows the writing."""
    header: dict[str, Any] = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for name, arr in tensors.items():
        dtype = _SAFETENSORS_DTYPES.get(str(arr.dtype))
        if dtype is None:
            raise GGUFError(f"tensor {name} has dtype {arr.dtype}, which cannot be saved: pass another file")
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in tensors.values():
            _write_tensor(f, arr)
            step()


def _write_tensor(f, arr: np.ndarray) -> None:
    f.write(np.ascontiguousarray(arr).data)
