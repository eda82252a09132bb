"""The pictures: the batch timeline and the cache picture as SVG, their theme and layout rules.

Pure functions of plain dicts (an engine's events, a cache layout): the widgets, the magics and
the server all draw with them, and nothing here imports ipywidgets or the engine, so the server
can draw a picture without either. `CachePicture` is a still picture of any caches (HTML, no
widget), for explaining what batching does to them.
"""

from mlx_nb.pictures.still import CachePicture

__all__ = ["CachePicture"]
