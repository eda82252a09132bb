"""Load a converted GGUF directory (see `gguf`): mlx_lm builds the model from config.json and reads
the float tensors; each quantized tensor's GGUF blocks then become the module that computes with
them, through MLX's public module API.

- With the CPU kernels: a block type with a kernel (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)
  is repacked as it is (`QLinear` / `QEmbedding` / `QSwitchLinear`), never widened; another type
  (Q2_K, Q3_K, the IQ types ...) is dequantized and re-quantized to 8 bits, and `formats` says so.
- Without them: every tensor is dequantized to float32 (gguf-py's own dequantization), the path
  MLX's CPU matmuls are fast on.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlx_nb.models.gguf import BLOCKS


def is_gguf_dir(config: dict) -> bool:
    return "gguf" in config


def load_gguf_dir(path: Path, config: dict, kernels: bool):
    """(model, tokenizer, formats): `formats` counts the tensors of each block type and says which
    were re-quantized."""
    from mlx_lm.utils import load_model, load_tokenizer

    model, _ = load_model(path, lazy=True, strict=False)
    blocks = mx.load(str(path / BLOCKS))
    formats: Counter = Counter()
    for module_path, kind in config["gguf"]["tensors"].items():
        formats[_attach(model, module_path, kind, blocks.pop(f"{module_path}.weight"), kernels)] += 1
    del blocks
    mx.eval(model.parameters())
    tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    return model, tokenizer, dict(formats)


def _module(model: nn.Module, path: str):
    parent = model
    *parents, name = path.split(".")
    for part in parents:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    return parent, name


def _attach(model: nn.Module, path: str, kind: str, raw: mx.array, kernels: bool) -> str:
    """Replace the module at `path` by one computing with the blocks `raw`; returns how it is held."""
    from mlx_nb.kernels.packing import GGML_TYPES
    from mlx_nb.models.gguf_read import Tensor

    parent, name = _module(model, path)
    old = parent[name]
    if kernels and kind in GGML_TYPES:
        from mlx_nb.kernels.layers import QEmbedding, QLinear, QSwitchLinear

        k = _row_weights(kind, raw.shape[-1])
        if isinstance(old, nn.Embedding):
            new = QEmbedding.from_ggml(raw, kind, k)
        elif raw.ndim == 3:
            new = QSwitchLinear.from_ggml(raw, kind, k, bias=old.get("bias"))
        else:
            new = QLinear.from_ggml(raw, kind, k, bias=old.get("bias"))
        setattr(parent, name, new)
        return kind
    shape = tuple(old.weight.shape)
    weights = Tensor(path, kind, shape, np.array(raw)).floats()
    if kernels:  # a block type without a kernel: 8-bit affine, the closest the kernels hold exactly enough
        from mlx_nb.kernels.layers import QEmbedding, QLinear

        old.weight = mx.array(weights)
        if isinstance(old, nn.Embedding):
            setattr(parent, name, QEmbedding.from_embedding(old, 8))
        elif raw.ndim == 2:
            setattr(parent, name, QLinear.from_linear(old, 8))
        return f"{kind} (re-quantized to 8 bits)"
    old.weight = mx.array(weights)
    return f"{kind} (dequantized to float32)"


def _row_weights(kind: str, row_bytes: int) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    return row_bytes // size * block
