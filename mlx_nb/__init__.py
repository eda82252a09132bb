"""mlx-nb: one shared, continuously batched MLX engine for notebooks.

`runtime` is imported first so a fast BLAS is preloaded before MLX loads.
"""

from mlx_nb import runtime as _runtime  # noqa: F401  (must run before mlx.core is imported)
from mlx_nb.runtime import runtime_info

__all__ = ["runtime_info", "load_model", "Engine"]


def __getattr__(name):
    # Lazy so `import mlx_nb` (e.g. in the server or for %load_ext) stays cheap.
    if name == "load_model":
        from mlx_nb.models import load_model

        return load_model
    if name == "Engine":
        from mlx_nb.engine import Engine

        return Engine
    raise AttributeError(name)
