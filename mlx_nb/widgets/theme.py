"""Colours that follow the JupyterLab theme, and the static (widget-free) form of a picture.

Inline SVG inherits CSS: the root sets `color` from the theme's font colour (JupyterLab's
`--jp-ui-font-color1`, with a dark fallback where no theme is loaded: GitHub, nbviewer) and every
text and line is drawn in `currentColor`, so a dark theme gets light text. Fills that mean
something (cache types, decode bars) are mid-tone colours that read on either background.
"""

from __future__ import annotations

import base64
from html import escape

FONT = "var(--jp-ui-font-color1, #222)"
BACKGROUND = "var(--jp-layout-color1, #fff)"
MUTED = "var(--jp-ui-font-color2, #666)"


def svg_open(cls: str, width: float, height: float) -> str:
    """The root `<svg>` tag: themed text colour, scales down to the output's width."""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="{cls}" width="{width}" height="{height:.0f}" '
            f'viewBox="0 0 {width} {height:.0f}" font-family="sans-serif" '
            f'style="color:{FONT};max-width:100%;height:auto">')


def static_html(svg: str, note: str = "", alt: str = "picture") -> str:
    """A picture as HTML for places without live widgets: saved notebooks opened untrusted,
    nbconvert exports, nbviewer, GitHub. An `<img>` with a data URL, because JupyterLab's HTML
    sanitizer (untrusted outputs) removes inline `<svg>` but keeps images. An image cannot see
    the page's theme, so it sits on its own light card (its text takes the dark fallback)."""
    data = base64.b64encode(svg.encode()).decode("ascii")
    caption = f'<div style="opacity:.7;font-size:85%">{escape(note)}</div>' if note else ""
    return (f'<div class="mlx-nb-static"><img alt="{escape(alt)}" src="data:image/svg+xml;base64,{data}" '
            f'style="background:#fff;padding:6px;border-radius:4px;max-width:100%"/>{caption}</div>')


def svg_of(html: str) -> list[str]:
    """The SVGs inside `static_html` output (for tests and tools reading saved notebooks)."""
    import re

    return [base64.b64decode(m).decode() for m in re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', html)]
