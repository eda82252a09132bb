"""Colours that follow the JupyterLab theme, and the static (widget-free) form of a picture.

Inline SVG inherits CSS: the root sets `color` from the theme's font colour (JupyterLab's
`--jp-ui-font-color1`, with a dark fallback where no theme is loaded: GitHub, nbviewer) and every
text and line is drawn in `currentColor`, so a dark theme gets light text. Fills that mean
something (cache types, decode bars) are mid-tone colours that read on either background.
"""

from __future__ import annotations

import base64
from html import escape

# Pictures are drawn for the width they are shown at (the Lab's sidebar asks for its own), so text
# keeps its size; below NARROW_BELOW px their layouts stack labels over what they label.
WIDTH, NARROW_BELOW, MIN_WIDTH, MAX_WIDTH = 760, 600, 160, 2000

FONT = "var(--jp-ui-font-color1, #222)"
BACKGROUND = "var(--jp-layout-color1, #fff)"
MUTED = "var(--jp-ui-font-color2, #666)"


def picture_width(width: float) -> tuple[int, bool]:
    """`width` within MIN_WIDTH..MAX_WIDTH, and whether it is narrow (labels stack over what they
    label, as in a sidebar)."""
    w = min(MAX_WIDTH, max(MIN_WIDTH, int(width)))
    return w, w < NARROW_BELOW


# Widths a character may take, in px, when a bold title is cut to fit: measured in chromium with the
# Lab's UI font, a request id and digits run to 6.9 px (12 px) and 6.5 px (11 px) a character;
# these keep a seventh in hand (6.8 px let a title cross the picture's edge).
BOLD_12_PX, BOLD_11_PX = 7.9, 7.3


def cut(text: str, chars: float) -> str:
    """`text` cut to `chars` characters (at least 4), the last one an ellipsis."""
    n = max(4, int(chars))
    return text if len(text) <= n else text[:n - 1] + "…"


def legend_rows(items: list[tuple[str, str]], y: float, width: float, font: float = 10,
                char_w: float = 5.6, gap: float = 20) -> tuple[str, float]:
    """A legend from `y`: (swatch, label) items, each swatch an SVG fragment with `{x}` where its
    left edge goes (12 px wide, in a 16-px row), in as many rows as the width needs, each label
    taken as `char_w` px a character; (svg, height)."""
    rows: list[list[str]] = [[]]
    x = 8.0
    for swatch, label in items:
        w = gap + char_w * len(label)
        if rows[-1] and x + w > width - 8:
            rows.append([])
            x = 8.0
        rows[-1].append(swatch.format(x=x) + f'<text x="{x + 14:.1f}" y="12" font-size="{font}" '
                        f'fill="currentColor">{escape(label)}</text>')
        x += w
    svg = "".join(f'<g class="legend" transform="translate(0,{y + 16 * r:.0f})">{"".join(row)}</g>'
                  for r, row in enumerate(rows))
    return svg, 16 * len(rows) + 8


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
