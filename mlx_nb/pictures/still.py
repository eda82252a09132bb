"""CachePicture: a still picture of caches, for explaining what batching does to them.

Give it any list of mlx_lm layer caches (one request's after a prefill, or a batch's after merge,
extend, filter or extract) or a layout dict from `cache_layout()`: it draws the rows x positions
and the bytes as they are at that moment (see `svg_cache`). Plain HTML (the SVG as an image, see
`theme.static_html`), no widget and no kernel needed to see it, so it shows wherever the notebook
is read: untrusted, GitHub, nbviewer, an HTML export. Its text form lists the same rows, for
terminals and for checking in tests.
"""

from __future__ import annotations

from typing import Any, Optional

from mlx_nb.pictures.cache import build_cache_svg, grid_title, grids
from mlx_nb.pictures.theme import static_html


def rows_text(layout: dict) -> list[str]:
    """Per grid: its title, then `row i: pad P, N tokens` lines."""
    out = []
    for grid in grids(layout.get("layers") or []):
        batch = grid["batch"]
        if not (batch.get("state") or batch.get("positions")):
            continue
        out.append(grid_title(grid))
        for i, row in enumerate(batch["rows"]):
            if batch.get("state"):
                out.append(f"  row {i}: state")
                continue
            pad = f"pad {row['padding']}, " if row.get("padding") else ""
            out.append(f"  row {i}: {pad}{row['tokens']} tokens")
    return out or ["(no tokens held)"]


class CachePicture:
    """`CachePicture(caches, "after merge")`: displays as a picture, prints as its rows."""

    def __init__(self, caches: Any, title: Optional[str] = None, model: Optional[str] = None):
        if isinstance(caches, dict):
            self.layout = caches
        else:
            from mlx_nb.models.cache_layout import describe_layers

            self.layout = {"model": model or "caches", "request": None, "layers": describe_layers(list(caches))}
        self.title = title
        self.svg = build_cache_svg(self.layout, title)

    def __repr__(self) -> str:
        head = [self.title] if self.title else []
        return "\n".join(head + rows_text(self.layout))

    def _repr_html_(self) -> str:
        return static_html(self.svg, alt=self.title or "cache picture")
