"""A cache layout (`cache_layout()`'s dict) -> an SVG: one row per layer, colored by cache type.

Pure functions, testable without widgets. Each row: a type swatch, a label (layer, type, offset,
shapes) and a bar whose length is the layer's bytes relative to the largest layer; a CacheList's
bar is split into its members' colors. Hybrid models (ArraysCache SSM state + KVCache attention)
show their two kinds of memory at a glance.
"""

from __future__ import annotations

from html import escape

from mlx_nb.engine.layout import human_bytes

TYPE_COLORS = {
    "KVCache": "#1f77b4",
    "ArraysCache": "#ff7f0e",
    "RotatingKVCache": "#2ca02c",
    "CacheList": "#9467bd",
    "QuantizedKVCache": "#17becf",
    "ChunkedKVCache": "#8c564b",
}
OTHER_COLOR = "#7f7f7f"

WIDTH, ROW_H, TOP, LABEL_W, BAR_X = 760, 18, 28, 380, 390


def color(kind: str) -> str:
    return TYPE_COLORS.get(kind, OTHER_COLOR)


def _shape(entry: dict) -> str:
    shapes = entry.get("shapes") or []
    if not shapes:
        return "empty"
    text = "x".join(map(str, shapes[0]))
    return f"{len(shapes)}x[{text}]" if len(shapes) > 1 and all(s == shapes[0] for s in shapes) else ", ".join(
        "[" + "x".join(map(str, s)) + "]" for s in shapes)


def _describe(entry: dict) -> str:
    # SSM-style caches (ArraysCache) hold a fixed-size state: no offset to show
    offset = "" if entry.get("offset") is None else f" off={entry['offset']}"
    return f"{entry.get('type')}{offset} {_shape(entry)}"


def _label(layer: dict) -> str:
    if layer.get("type") == "CacheList":
        inner = "; ".join(_describe(m) for m in layer.get("members") or [])
        return f"L{layer.get('layer')} CacheList({inner})"
    return f"L{layer.get('layer')} {_describe(layer)}"


def _types(layers: list[dict]) -> list[str]:
    seen: list[str] = []
    for layer in layers:
        for kind in [layer.get("type")] + [m.get("type") for m in layer.get("members") or []]:
            if kind and kind not in seen:
                seen.append(kind)
    return seen


def build_cache_svg(layout: dict) -> str:
    """The whole layout as one `<svg>` string."""
    layers = layout.get("layers") or []
    largest = max((layer.get("nbytes") or 0 for layer in layers), default=0) or 1
    total = sum(layer.get("nbytes") or 0 for layer in layers)
    legend_y = TOP + len(layers) * ROW_H + 10
    height = legend_y + 24
    who = f"request {layout['request']}" if layout.get("request") else "fresh cache"
    head = f"{layout.get('model', '?')} - {who} - {len(layers)} layers - {human_bytes(total)}"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="mlx-cache" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">',
           f'<text x="8" y="16" font-size="12" font-weight="bold">{escape(head)}</text>']
    bar_w = WIDTH - BAR_X - 70
    for i, layer in enumerate(layers):
        y = TOP + i * ROW_H
        kind = layer.get("type") or "?"
        label = _label(layer)
        nbytes = layer.get("nbytes") or 0
        out.append(f'<g class="layer" data-layer="{escape(str(layer.get("layer", i)))}" data-type="{escape(kind)}">'
                   f"<title>{escape(label)} - {nbytes} bytes, dtype {escape(str(layer.get('dtype')))}</title>")
        out.append(f'<rect x="8" y="{y + 3}" width="10" height="{ROW_H - 6}" fill="{color(kind)}"/>')
        short = label if len(label) <= 58 else label[:57] + "..."
        out.append(f'<text x="24" y="{y + ROW_H - 5}" font-size="10.5">{escape(short)}</text>')
        members = layer.get("members") or []
        segments = [(m.get("type") or "?", m.get("nbytes") or 0) for m in members] or [(kind, nbytes)]
        x = float(BAR_X)
        for seg_kind, seg_bytes in segments:
            w = bar_w * seg_bytes / largest
            if w > 0:
                out.append(f'<rect class="bar" x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{ROW_H - 6}" '
                           f'fill="{color(seg_kind)}"/>')
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + ROW_H - 5}" font-size="10" fill="#555">{human_bytes(nbytes)}</text></g>')
    out.append(f'<g class="legend" transform="translate(8,{legend_y})">')
    lx = 0
    for kind in _types(layers):
        out.append(f'<rect x="{lx}" y="2" width="10" height="10" fill="{color(kind)}"/>'
                   f'<text x="{lx + 14}" y="11" font-size="10.5">{escape(kind)}</text>')
        lx += 24 + 7 * len(kind)
    out.append("</g></svg>")
    return "".join(out)
