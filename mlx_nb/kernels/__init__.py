"""Our own MLX primitives for the CPU, and the module swap that puts a loaded model on them.

MLX's CPU backend runs quantized matmuls as a scalar loop on one thread and falls back to several
ordinary ops for RMSNorm and RoPE, so on CPU this project used to dequantize every model to float32.
`csrc/` holds C++ primitives (packed 4/8-bit matmul with int8 activations, vectorized softmax family,
SiLU gate, RMSNorm, RoPE; AVX-512/AVX2/portable, a small thread pool) built as an MLX extension by
`python -m mlx_nb.kernels.build` (make runs it). `swap.py` puts a loaded model's layers on them
through MLX's public module API; the engine never knows which runs.

Without a build (no compiler, macOS, a GPU) everything runs on MLX's own ops, and `info()` says why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).parent
STAMP = HERE / "_native.json"

_module: Any = None
_reason: Optional[str] = None
_loaded = False


def _load() -> None:
    global _module, _reason, _loaded
    if _loaded:
        return
    _loaded = True
    import mlx.core as mx  # registers the array type the extension's functions take

    if os.environ.get("MLX_NB_KERNELS", "auto").strip().lower() in ("off", "0", "false", "none"):
        _reason = "turned off (MLX_NB_KERNELS=off)"
        return
    if mx.default_device().type == mx.DeviceType.gpu:
        _reason = "MLX runs on a GPU here, where its own kernels are the fast path"
        return
    try:
        import importlib

        native = importlib.import_module("mlx_nb.kernels._native")
    except ImportError as exc:
        _reason = f"not built ({exc}): run `make` or `python -m mlx_nb.kernels.build` (needs a C++ compiler)"
        return
    if native.mlx_version != mx.__version__:
        _reason = (f"built for mlx {native.mlx_version} but mlx {mx.__version__} is installed: "
                   "run `python -m mlx_nb.kernels.build` to rebuild")
        return
    _module = native


def available() -> bool:
    """True when the native kernels are built for this mlx and in use."""
    _load()
    return _module is not None


def native() -> Any:
    """The extension module (raises with the reason when it is not available). On every
    projection's path: once loaded, it is returned before anything else."""
    if _module is not None:
        return _module
    _load()
    if _module is None:
        raise RuntimeError(f"mlx-nb's CPU kernels are not available: {_reason}")
    return _module


def info() -> dict:
    """Which path runs: {'path': 'native'|'mlx', 'isa', 'isa_supported', 'threads', 'reason'}."""
    _load()
    if _module is None:
        return {"path": "mlx", "isa": None, "isa_supported": [], "threads": None, "reason": _reason}
    built = {}
    try:
        built = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        pass
    return {
        "path": "native",
        "isa": _module.isa(),
        "isa_supported": _module.isa_list().split(","),
        "threads": _module.threads(),
        "reason": None,
        "built_with": built.get("compiler"),
    }
