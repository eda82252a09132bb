"""Model names, sources and loading."""

from mlx_nb.models.loaded import LoadedModel, ModelLoadError
from mlx_nb.models.loader import load_model
from mlx_nb.models.sources import (
    DEFAULT_MODEL,
    ModelNotFoundError,
    available_offline,
    builtin_names,
)

__all__ = [
    "DEFAULT_MODEL",
    "LoadedModel",
    "ModelLoadError",
    "ModelNotFoundError",
    "available_offline",
    "builtin_names",
    "load_model",
]
