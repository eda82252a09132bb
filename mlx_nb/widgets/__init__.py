"""ipywidgets for the shared engine: ChatPanel, CacheInspector, BatchVisualizer; and CachePicture,
a still picture of any caches (no widget, from `mlx_nb.pictures`).

The SVG drawings live in `mlx_nb.pictures` as pure functions, testable without widgets and drawn
by the server too.
"""

from mlx_nb.pictures import CachePicture
from mlx_nb.widgets.batch_visualizer import BatchVisualizer
from mlx_nb.widgets.cache_inspector import CacheInspector
from mlx_nb.widgets.chat_panel import ChatPanel

__all__ = ["BatchVisualizer", "CacheInspector", "CachePicture", "ChatPanel"]
