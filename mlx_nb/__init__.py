"""mlx-nb: one shared, continuously batched MLX engine for notebooks.

`runtime` is imported first so a fast BLAS is preloaded before MLX loads.
"""

from mlx_nb import runtime as _runtime  # noqa: F401  (must run before mlx.core is imported)
from mlx_nb.runtime import runtime_info

__all__ = ["runtime_info", "load_model", "Engine", "Client", "ChatReply", "openai_client", "load_ipython_extension"]

_LAZY = {
    "load_model": "mlx_nb.models",
    "Engine": "mlx_nb.engine",
    "Client": "mlx_nb.client",
    "ChatReply": "mlx_nb.client",
    "openai_client": "mlx_nb.client",
}


def __getattr__(name):
    # Lazy so `import mlx_nb` (e.g. in the server or for %load_ext) stays cheap.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


def load_ipython_extension(ip):
    """`%load_ext mlx_nb`: registers the %mlx / %%mlx magics (the engine starts on first use)."""
    from mlx_nb.magics import load_ipython_extension as load

    load(ip)


def unload_ipython_extension(ip):
    """`%unload_ext mlx_nb`: takes back what loading added besides the magics."""
    from mlx_nb.magics import unload_ipython_extension as unload

    unload(ip)
