"""A GGUF file's metadata and tensors, read with gguf-py (llama.cpp's own Python reader).

`mx.load` reads GGUF too, but widens every K-quant block to float16 and fails on some block types
(a Q4_K_M file's Q5_0 fallback tensors); gguf-py maps the file and hands each tensor's raw blocks
over untouched, which is what the kernels repack.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlx_nb.models.gguf_meta import GGUFError


@dataclass
class Tensor:
    """One GGUF tensor: `kind` is ggml's type name (F32, F16, BF16, Q4_K, ...); `shape` is NumPy's
    order (rows last-but-one, weights of a row last); `data` is the file's bytes as gguf-py maps them:
    float arrays for float types, uint8 [rows..., bytes a row] for block types."""

    name: str
    kind: str
    shape: tuple
    data: np.ndarray

    @property
    def quantized(self) -> bool:
        return self.kind not in ("F32", "F16", "BF16", "F64")

    def floats(self) -> np.ndarray:
        """The weights as float32 (dequantized with gguf-py for block types): for the path without
        kernels, and for tensors that are small or have no kernel."""
        from gguf import GGMLQuantizationType, quants

        if self.kind == "BF16":
            return quants.dequantize(self.data, GGMLQuantizationType.BF16).reshape(self.shape).astype(np.float32)
        if not self.quantized:
            return np.asarray(self.data, dtype=np.float32).reshape(self.shape)
        return quants.dequantize(self.data, GGMLQuantizationType[self.kind]).reshape(self.shape).astype(np.float32)


def read(src: Path) -> tuple[dict, dict[str, Tensor]]:
    """(metadata as plain Python, tensors by name); a one-line GGUFError for a file gguf-py cannot read."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(src, "r")
        meta = {name: field.contents() for name, field in reader.fields.items()}
        tensors = {}
        for t in reader.tensors:
            shape = tuple(int(n) for n in reversed(list(t.shape)))
            tensors[t.name] = Tensor(t.name, t.tensor_type.name, shape, t.data)
    except Exception as exc:  # gguf-py raises ValueError, struct.error, IndexError... on damaged files
        reason = " ".join(str(exc).split()).rstrip(".") or type(exc).__name__
        raise GGUFError(
            f"{src} is not a valid GGUF file (truncated or corrupt: {reason}): re-download it or pass another file"
        ) from exc
    return meta, tensors
