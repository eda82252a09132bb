"""ipywidgets for the shared engine: ChatPanel, CacheInspector, BatchVisualizer; and CachePicture,
a still picture of any caches (no widget).

The SVG drawings live in `svg_cache` / `svg_batch` as pure functions, testable without widgets.
"""

from mlx_nb.widgets.batch_visualizer import BatchVisualizer
from mlx_nb.widgets.cache_inspector import CacheInspector
from mlx_nb.widgets.chat_panel import ChatPanel
from mlx_nb.widgets.pictures import CachePicture

__all__ = ["BatchVisualizer", "CacheInspector", "CachePicture", "ChatPanel"]
