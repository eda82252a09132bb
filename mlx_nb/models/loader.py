"""Load a model by name or path into a `LoadedModel` that knows its kind, tokenizer and caches.

The kind (text or vision) comes from the config (`vision_config` present), never from the name.
Text models load through mlx_lm, vision models through mlx_vlm; both then follow the runtime's
dtype policy: on CPU with mlx-nb's kernels built, quantized layers stay quantized and run on the
kernels (`mlx_nb.kernels.swap`; float checkpoints too with `quantize`); without them, float32,
where MLX's CPU matmuls use BLAS and its quantized and half-precision ones don't.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from mlx_nb import runtime
from mlx_nb.models.loaded import LoadedModel, ModelLoadError
from mlx_nb.models.progress import report
from mlx_nb.models.sources import resolve


def read_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}/config.json is unreadable ({exc}): re-create the model directory") from exc


def load_model(name_or_path: Optional[str] = None, quantize: Optional[int] = None) -> LoadedModel:
    """Resolve, load and prepare a model; raises a one-line error for anything wrong.

    `quantize` (4 or 8; default $MLX_NB_QUANTIZE) quantizes a float checkpoint's language model for
    the CPU kernels; quantized checkpoints run as shipped either way."""
    from mlx_nb.models.sources import DEFAULT_MODEL

    name = DEFAULT_MODEL if name_or_path is None else name_or_path
    report("resolving")
    path = resolve(name)
    config = read_config(path)
    kind = "vision" if "vision_config" in config else "text"
    report("loading weights")
    try:
        loaded = _load_vision(name, path, config) if kind == "vision" else _load_text(name, path, config)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        if isinstance(exc, ModelLoadError):
            raise
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelLoadError(f"could not load {name} from {path}: {first}") from exc
    _apply_dtype_policy(loaded, runtime.quantize_bits(quantize))
    from mlx_nb.models.huge_pages import collapse

    collapse(loaded.whole_model)
    loaded.weights = weights_held(loaded)
    from mlx_nb.models.sampling_defaults import read

    loaded.sampling = read(name, path)
    return loaded


def weights_held(loaded: LoadedModel) -> dict:
    """What the weights are held as and their bytes: {"formats": {format: tensors}, "bytes": n}.
    A GGUF's block types as loaded (`formats`), else each matrix by its kind (float dtype, or the
    bits and group of a packed weight)."""
    from collections import Counter

    import mlx.nn as nn
    from mlx.utils import tree_flatten

    target = loaded.whole_model
    formats: Counter = Counter(loaded.formats or {})
    if not formats:
        from mlx_nb.kernels.layers import Packed

        for _, m in target.named_modules():
            if isinstance(m, Packed):
                formats[m.ggml_type or f"{m.bits}-bit (group {m.group_size})"] += 1
            elif isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
                formats[f"{m.bits}-bit (group {m.group_size})"] += 1
            elif type(m) in (nn.Linear, nn.Embedding):
                formats[str(m.weight.dtype).rsplit(".", 1)[-1]] += 1
    held = sum(a.nbytes for _, a in tree_flatten(target.parameters()))
    return {"formats": dict(formats.most_common()), "bytes": held}


def _load_text(name: str, path: Path, config: dict) -> LoadedModel:
    from mlx_nb.models.gguf_load import is_gguf_dir, load_gguf_dir

    if is_gguf_dir(config):  # a converted GGUF: its blocks become the modules that compute with them
        model, tokenizer, formats = load_gguf_dir(path, config, kernels=runtime.dtype_policy() == "kernels")
        return LoadedModel(name=name, path=path, kind="text", model=model, tokenizer=tokenizer, config=config,
                           formats=formats)
    from mlx_lm.utils import load

    model, tokenizer = load(str(path))
    return LoadedModel(name=name, path=path, kind="text", model=model, tokenizer=tokenizer, config=config)


def _load_vision(name: str, path: Path, config: dict) -> LoadedModel:
    from mlx_nb.models.vision import load_vision_model

    return load_vision_model(name, path, config)


def _apply_dtype_policy(loaded: LoadedModel, quantize: Optional[int]) -> None:
    policy = runtime.dtype_policy()
    loaded.dtype = policy
    if policy not in ("float32", "kernels"):
        return
    import mlx.core as mx
    from mlx.utils import tree_map

    target = loaded.whole_model
    if policy == "kernels":
        from mlx_nb.kernels.swap import floats_to_float32, swap_model

        report("packing weights for the CPU kernels")
        # Float parameters to float32 first (quantized scales come back to float16 where exact).
        floats_to_float32(target)
        loaded.kernels = swap_model(target, quantize=quantize, language_model=loaded.model)
        return
    report("converting weights to float32")
    from mlx_lm.utils import dequantize_model

    dequantize_model(target)
    target.update(tree_map(_to_float32, target.parameters()))
    mx.eval(target.parameters())


def _to_float32(a):
    import mlx.core as mx

    return a.astype(mx.float32) if mx.issubdtype(a.dtype, mx.floating) else a
