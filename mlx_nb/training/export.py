"""A fine-tune taken elsewhere: the adapter fused into its base model's weights, written as an MLX
folder (mlx_lm loads it) or as a GGUF (llama.cpp loads it).

- `fused_model(base, adapter)`: the base as it was trained (trainable_model), its adapter's LoRA
  layers put back as mlx_lm puts them, the adapter's weights loaded, then fused (mlx_lm's own
  `fuse`): plain Linear layers holding W + scale * (A B)^T.
- `export_folder`: that model's weights (float32, or the dtype asked), the base's config without
  the GGUF block map (or with its quantization, for an MLX base that was quantized), the tokenizer.
- `export_gguf`: for a base that came from a GGUF, a GGUF with the source file's metadata (its
  tokenizer, template, architecture keys) and every tensor of the source, the fused ones replaced:
  F32 or F16, or Q8_0 / Q4_0 through gguf-py's quantizer, or another llama.cpp type through
  `llama-quantize` ($LLAMA_CPP_BIN or PATH). Norms and biases stay float, as llama.cpp writes them.
Everything is written to a temporary name and renamed, so a crash leaves no half file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Optional

_TENSOR = re.compile(r"^(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)$")
GGUF_PY_TYPES = ("F32", "F16", "Q8_0", "Q4_0")


class ExportError(ValueError):
    """An export that cannot be made as asked; the message says what to change."""


def fused_model(base: str, adapter: Path):
    """(model, tokenizer, base folder) with the adapter in `adapter` fused into the base's weights."""
    import mlx.core as mx
    from mlx.utils import tree_unflatten
    from mlx_lm.tuner.utils import linear_to_lora_layers

    from mlx_nb.models.sources import resolve
    from mlx_nb.training.worker import trainable_model

    config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    model, tokenizer = trainable_model(base)
    model.freeze()
    linear_to_lora_layers(model, config["num_layers"], config["lora_parameters"])
    model.load_weights(str(Path(adapter) / "adapters.safetensors"), strict=False)
    fused = [(n, m.fuse(dequantize=False)) for n, m in model.named_modules() if hasattr(m, "fuse")]
    model.update_modules(tree_unflatten(fused))
    mx.eval(model.parameters())
    return model, tokenizer, resolve(base)


def _atomic_dir(dest: Path, fill) -> Path:
    dest = Path(dest).expanduser()
    if dest.exists():
        raise ExportError(f"{dest} exists: pick a new path (an export never overwrites)")
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:6]}")
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def export_folder(base: str, adapter: Path, dest: Path, dtype: Optional[str] = None) -> Path:
    """The fused model as an MLX folder mlx_lm loads (`mlx_lm.load(dest)`)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    model, _, src = fused_model(base, adapter)
    cast = getattr(mx, dtype) if dtype else None

    def fill(tmp: Path) -> None:
        weights = {k: (v.astype(cast) if cast is not None and mx.issubdtype(v.dtype, mx.floating) else v)
                   for k, v in tree_flatten(model.parameters())}
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        config = json.loads((src / "config.json").read_text())
        config.pop("gguf", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        for f in src.iterdir():
            if f.is_file() and f.name.startswith(("tokenizer", "special_tokens", "generation_config", "chat_template")):
                shutil.copy(f, tmp / f.name)

    return _atomic_dir(dest, fill)


def gguf_source(base: str) -> Path:
    """The GGUF file `base` was converted from (a .gguf path, or the default model's), else ExportError."""
    from mlx_nb.models.sources import DEFAULT_MODEL, _smollm2_gguf

    if base == DEFAULT_MODEL:
        return _smollm2_gguf()
    if base.lower().endswith(".gguf") and Path(base).expanduser().is_file():
        return Path(base).expanduser()
    raise ExportError(f"{base} did not come from a GGUF file: GGUF export writes a GGUF base's own layout; "
                      "export format='safetensors' instead (llama.cpp's convert_hf_to_gguf.py converts that)")


def export_gguf(base: str, adapter: Path, dest: Path, quantize: Optional[str] = None) -> Path:
    """The fused model as a GGUF of the base's architecture and metadata, in `quantize`'s type (F32
    when None)."""
    import gguf
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten

    from mlx_nb.models.gguf_arch import CONFIG_TENSORS, TOP_NAMES, arch_of

    kind = (quantize or "F32").upper()
    llama_type = kind not in GGUF_PY_TYPES
    if llama_type:
        quantizer = _llama_quantize()
    dest = Path(dest).expanduser()
    if dest.exists():
        raise ExportError(f"{dest} exists: pick a new path (an export never overwrites)")
    src = gguf_source(base)
    reader = gguf.GGUFReader(str(src))
    model, _, _ = fused_model(base, adapter)
    weights = {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(model.parameters())}
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    _, arch = arch_of(src, meta)
    write_kind = "F32" if llama_type else kind
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:6]}")
    try:
        writer = gguf.GGUFWriter(str(tmp), meta["general.architecture"])
        for key, f in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            value = f.contents()
            if key == "general.file_type":
                value = int(getattr(gguf.LlamaFileType, f"MOSTLY_{write_kind}", gguf.LlamaFileType.ALL_F32)
                            if write_kind != "F32" else gguf.LlamaFileType.ALL_F32)
            sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, value, f.types[0], sub)
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            m = _TENSOR.match(t.name)
            path = None
            if m and t.name not in CONFIG_TENSORS:
                block, name, suffix = m.groups()
                target = arch.block.get(name) if block is not None else TOP_NAMES.get(name)
                if target is not None:
                    path = f"model.layers.{block}.{target}.{suffix}" if block is not None else f"{target}.{suffix}"
            if path is None or path not in weights:  # config tensors (rope factors): as the source holds them
                writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
                continue
            w = weights[path].reshape(shape)
            if arch.norm_offset and name.endswith("norm"):
                w = w + np.float32(arch.norm_offset)
            _add(writer, t.name, w, write_kind if w.ndim >= 2 else "F32")
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        if llama_type:
            out = tmp.with_name(tmp.name + ".q")
            run = subprocess.run([quantizer, str(tmp), str(out), kind], capture_output=True, text=True)
            if run.returncode != 0:
                raise ExportError(f"llama-quantize could not make {kind}: {(run.stderr or run.stdout).strip()[-200:]}")
            os.replace(out, tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _add(writer, name: str, w, kind: str) -> None:
    import gguf
    import numpy as np

    if kind == "F32":
        writer.add_tensor(name, w.astype(np.float32))
    elif kind == "F16":
        writer.add_tensor(name, w.astype(np.float16))
    else:
        qtype = gguf.GGMLQuantizationType[kind]
        raw = gguf.quants.quantize(w.astype(np.float32), qtype)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)


def _llama_quantize() -> str:
    dirs = [os.environ.get("LLAMA_CPP_BIN")]
    for d in filter(None, dirs):
        path = Path(d) / "llama-quantize"
        if os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("llama-quantize")
    if found:
        return found
    raise ExportError(f"this type needs llama.cpp's llama-quantize ($LLAMA_CPP_BIN or PATH): export "
                      f"{', '.join(GGUF_PY_TYPES)} without it, or quantize the F32 file with llama-quantize yourself")
