"""Process-level MLX setup, imported before anything touches `mlx.core`.

The Linux `mlx-cpu` wheel links the reference netlib BLAS (~1.2 GFLOP/s). Loading a library that
exports `cblas_sgemm` with RTLD_GLOBAL *before* the first `import mlx.core` makes MLX resolve its
BLAS calls there instead: 5-100x faster matmuls. Quantized and half-precision matmuls don't use
BLAS on CPU, so on CPU models run fastest dequantized to float32; on Metal/CUDA quantized weights
stay as they are.

`MLX_NB_BLAS=auto|off|/path/to/lib.so` chooses the library (auto: MKL if the `mkl` wheel is
installed, else the system OpenBLAS).
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import platform
import sys
import warnings
from importlib import metadata
from typing import Optional

log = logging.getLogger("mlx_nb")

_OPENBLAS_CANDIDATES = [
    "/usr/lib/{arch}-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/{arch}-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
]

_blas: Optional[str] = None
_blas_error: Optional[str] = None
_configured = False


def _mkl_candidates() -> list[str]:
    roots = {sys.prefix, sys.base_prefix}
    return [p for r in roots for p in sorted(glob.glob(os.path.join(r, "lib", "libmkl_rt.so*")))]


def _openblas_candidates() -> list[str]:
    arch = platform.machine()
    return [p.format(arch=arch) for p in _OPENBLAS_CANDIDATES]


def find_blas(choice: Optional[str] = None) -> Optional[str]:
    """The BLAS library path `choice` (or $MLX_NB_BLAS) selects, or None for the bundled one."""
    choice = (choice if choice is not None else os.environ.get("MLX_NB_BLAS", "auto")).strip()
    if choice.lower() in ("off", "none", "0", "false"):
        return None
    if choice.lower() not in ("", "auto"):
        return choice
    if sys.platform != "linux":
        return None
    for path in _mkl_candidates() + _openblas_candidates():
        if os.path.exists(path):
            return path
    return None


def _preload(path: str) -> None:
    if "mkl_rt" in os.path.basename(path):
        # MKL's default Intel OpenMP runtime is not shipped; the GNU layer uses the system libgomp.
        os.environ.setdefault("MKL_THREADING_LAYER", "GNU")
        for gomp in ("libgomp.so.1",):
            try:
                ctypes.CDLL(gomp, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def configure() -> None:
    """Preload the fastest BLAS once per process. Warns (once) if MLX was imported first."""
    global _blas, _blas_error, _configured
    if _configured:
        return
    _configured = True
    path = find_blas()
    if path is None:
        return
    if "mlx.core" in sys.modules:
        warnings.warn(
            "mlx.core was imported before mlx_nb: the fast BLAS cannot take effect in this process. "
            "Import mlx_nb first (or restart the kernel).",
            RuntimeWarning,
            stacklevel=3,
        )
        _blas_error = "mlx.core imported before mlx_nb"
        return
    try:
        _preload(path)
        _blas = path
    except OSError as exc:
        _blas_error = f"{path}: {exc}"
        log.warning("mlx_nb: could not load BLAS %s (%s); using MLX's bundled BLAS", path, exc)


def device_kind() -> str:
    """'gpu' when MLX runs on Metal or CUDA, else 'cpu'."""
    import mlx.core as mx

    return "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"


def dtype_policy() -> str:
    """How loaded weights are stored: on CPU 'kernels' (quantized layers packed for mlx-nb's own
    kernels, the rest float32) when they are built, else 'float32' (BLAS-backed); 'native' on a GPU."""
    forced = os.environ.get("MLX_NB_DTYPE")
    if forced:
        return forced
    if device_kind() != "cpu":
        return "native"
    from mlx_nb import kernels

    return "kernels" if kernels.available() else "float32"


def quantize_bits(requested: Optional[int] = None) -> Optional[int]:
    """Bits to quantize a float checkpoint to for the kernels: `requested`, else $MLX_NB_QUANTIZE
    (4, 8, or none); None keeps float checkpoints in float."""
    value = requested if requested is not None else os.environ.get("MLX_NB_QUANTIZE", "")
    value = str(value).strip().lower()
    if value in ("", "0", "none", "off", "false"):
        return None
    if value not in ("4", "8"):
        raise ValueError(f"quantize must be 4, 8 or none, not {value!r}")
    return int(value)


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _kernels_info() -> dict:
    from mlx_nb import kernels

    return kernels.info()


def runtime_info() -> dict:
    """What this process runs on: device, BLAS in use, dtype policy, library versions."""
    import mlx.core as mx

    return {
        "device": str(mx.default_device()),
        "device_kind": device_kind(),
        "blas": _blas or "bundled (reference BLAS)",
        "blas_fast": _blas is not None,
        "blas_error": _blas_error,
        "dtype_policy": dtype_policy(),
        "kernels": _kernels_info(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu_count": os.cpu_count(),
        "versions": {
            name: _version(name) for name in ("mlx", "mlx-lm", "mlx-vlm", "mlx-nb", "jupyter-server")
        },
    }


configure()
