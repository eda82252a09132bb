"""`%load_ext mlx_nb` -> the `%mlx` line magic and the `%%mlx chat` cell magic."""

from mlx_nb.magics.chat import ChatAnswer, Conversation, interpolate
from mlx_nb.magics.mlx_magics import MlxMagics, load_ipython_extension, unload_ipython_extension

__all__ = ["ChatAnswer", "Conversation", "MlxMagics", "interpolate", "load_ipython_extension", "unload_ipython_extension"]
