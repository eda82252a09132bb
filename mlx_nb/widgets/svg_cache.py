"""A cache layout (`cache_layout()`'s dict, or `describe_layers` of any caches) -> an SVG.

Two parts. First the cache as **rows x positions**, one grid per kind of layer (layers with the
same type and the same rows are drawn once): each batch row's left padding (dashed cells), the
positions holding its tokens (filled, coloured by cache type), a sliding window's fixed width and
what it dropped, an SSM layer's fixed-size state. This is what merge, extend and filter change, so
drawing it before and after each verb shows them. Then the bytes, layer by layer, with runs of
identical layers summarized in one line (a fresh 30-layer cache is one line, not 30).

Pure functions, testable without widgets. Colours work on light and dark JupyterLab themes: text
and lines use `currentColor`, which the root sets from the theme's font colour.
"""

from __future__ import annotations

from html import escape
from typing import Optional

from mlx_nb.formatting import human_bytes
from mlx_nb.widgets.theme import svg_open

TYPE_COLORS = {
    "KVCache": "#1f77b4",
    "BatchKVCache": "#1f77b4",
    "ArraysCache": "#ff7f0e",
    "RotatingKVCache": "#2ca02c",
    "BatchRotatingKVCache": "#2ca02c",
    "CacheList": "#9467bd",
    "QuantizedKVCache": "#17becf",
    "ChunkedKVCache": "#8c564b",
}
OTHER_COLOR = "#7f7f7f"

WIDTH, TOP, ROW_H, GRID_X, BAR_X, BYTES_H = 760, 26, 14, 150, 330, 16
GRID_W = WIDTH - GRID_X - 110
STATE_W = 56


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
    offset = entry.get("offset")
    offset = "" if offset is None else f" off={offset}"
    return f"{entry.get('type')}{offset} {_shape(entry)}"


def _label(layer: dict) -> str:
    if layer.get("type") == "CacheList":
        inner = "; ".join(_describe(m) for m in layer.get("members") or [])
        return f"CacheList({inner})"
    return _describe(layer)


def _types(layers: list[dict]) -> list[str]:
    seen: list[str] = []
    for layer in layers:
        for kind in [layer.get("type")] + [m.get("type") for m in layer.get("members") or []]:
            if kind and kind not in seen:
                seen.append(kind)
    return seen


def layer_span(numbers: list[int], prefix: str = "L") -> str:
    """[0, 1, 2, 5, 7, 9] -> 'L0-2, L5, L7, L9'."""
    if not numbers:
        return ""
    parts, start, prev = [], numbers[0], numbers[0]
    for n in numbers[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(f"{prefix}{start}" if start == prev else f"{prefix}{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)


# -- rows x positions ---------------------------------------------------------------------------
def grids(layers: list[dict]) -> list[dict]:
    """One grid per distinct (type, rows) among the layers (a CacheList's members each count):
    {type, member, layers, batch}, in order of first appearance."""
    out: dict[tuple, dict] = {}
    for layer in layers:
        members = layer.get("members")
        for m, entry in enumerate(members if members else [layer]):
            batch = entry.get("batch")
            if not batch:
                continue
            key = (entry.get("type"), m if members else None, repr(batch))
            grid = out.setdefault(key, {"type": entry.get("type"), "member": m if members else None,
                                        "layers": [], "batch": batch})
            grid["layers"].append(layer.get("layer", 0))
    return list(out.values())


def grid_title(grid: dict) -> str:
    batch, kind = grid["batch"], grid["type"]
    where = layer_span(grid["layers"])
    if grid["member"] is not None:
        kind = f"CacheList member {grid['member']}: {kind}"
    n = len(batch["rows"])
    if batch.get("state"):
        return f"{where} · {kind} · {n} row{'s' if n != 1 else ''} of fixed-size state"
    size = f"{n} row{'s' if n != 1 else ''} x {batch['positions']} positions"
    if batch.get("window"):
        size += f" (window {batch['window']})"
    return f"{where} · {kind} · {size}"


def _grid(grid: dict, y: float) -> tuple[str, float]:
    """One grid: its title, then a row per batch row. Returns (svg, height)."""
    batch, kind = grid["batch"], grid["type"]
    fill = color(kind)
    out = [f'<g class="grid" data-type="{escape(kind)}">',
           f'<text x="8" y="{y + 11:.0f}" font-size="11" font-weight="bold" fill="currentColor">'
           f"{escape(grid_title(grid))}</text>"]
    y += 16
    positions = batch.get("positions") or 0
    cell = min(14.0, GRID_W / positions) if positions else 0.0
    for r, row in enumerate(batch["rows"]):
        cy = y + r * ROW_H
        tokens, pad = row.get("tokens"), row.get("padding") or 0
        who = "state" if batch.get("state") else f"{tokens} token{'s' if tokens != 1 else ''}"
        if not batch.get("state") and pad:
            who += f", pad {pad}"
        out.append(f'<g class="row" data-row="{r}" data-padding="{escape(str(pad))}" data-tokens="{escape(str(tokens))}">'
                   f'<text x="{GRID_X - 6}" y="{cy + 10:.0f}" font-size="10" text-anchor="end" '
                   f'fill="currentColor">row {r} · {escape(who)}</text>')
        if batch.get("state"):
            out.append(f'<rect class="state" x="{GRID_X}" y="{cy + 1:.0f}" width="{STATE_W}" height="{ROW_H - 3}" '
                       f'fill="{fill}" rx="2"/>')
        else:
            out.append(_cells(GRID_X, cy, cell, pad, positions, fill))
            held = positions - pad
            if tokens is not None and tokens > held >= 0:  # a sliding window that dropped its oldest
                out.append(f'<text x="{GRID_X + positions * cell + 6:.0f}" y="{cy + 10:.0f}" font-size="10" '
                           f'fill="currentColor" opacity=".75">+{tokens - held} dropped</text>')
        out.append("</g>")
    height = 16 + len(batch["rows"]) * ROW_H + 8
    return "".join(out) + "</g>", height


def _cells(x0: float, y: float, cell: float, pad: int, positions: int, fill: str) -> str:
    """Padding then tokens: one rect per position when they are wide enough to see, else two bars."""
    h = ROW_H - 3
    if cell >= 5:
        out = []
        for j in range(positions):
            x = x0 + j * cell
            if j < pad:
                out.append(f'<rect class="pad" x="{x + .5:.1f}" y="{y + 1.5:.1f}" width="{cell - 2:.1f}" '
                           f'height="{h - 1}" fill="none" stroke="currentColor" stroke-opacity=".45" '
                           'stroke-dasharray="2 1.5"/>')
            else:
                out.append(f'<rect class="tok" x="{x:.1f}" y="{y + 1:.0f}" width="{cell - 1:.1f}" height="{h}" '
                           f'fill="{fill}"/>')
        return "".join(out)
    out = []
    if pad:
        out.append(f'<rect class="pad" x="{x0}" y="{y + 1.5:.1f}" width="{pad * cell:.1f}" height="{h - 1}" '
                   'fill="none" stroke="currentColor" stroke-opacity=".45" stroke-dasharray="2 1.5"/>')
    if positions > pad:
        out.append(f'<rect class="tok" x="{x0 + pad * cell:.1f}" y="{y + 1:.0f}" '
                   f'width="{(positions - pad) * cell:.1f}" height="{h}" fill="{fill}"/>')
    return "".join(out)


# -- bytes per layer ----------------------------------------------------------------------------
def runs(layers: list[dict]) -> list[tuple[list[int], dict]]:
    """Layers alike in everything but their number -> (their numbers, the first one), in order of
    first appearance: 30 identical layers are one line, alternating kinds two."""
    out: dict[str, tuple[list[int], dict]] = {}
    for layer in layers:
        key = repr({k: v for k, v in layer.items() if k != "layer"})
        out.setdefault(key, ([], layer))[0].append(layer.get("layer", 0))
    return list(out.values())


def _bytes_row(numbers: list[int], layer: dict, y: float, largest: int) -> str:
    kind = layer.get("type") or "?"
    nbytes = layer.get("nbytes") or 0
    where = layer_span(numbers)
    count = f" x{len(numbers)}" if len(numbers) > 1 else ""
    label = f"{where} {_label(layer)}{count}"
    short = label if len(label) <= 50 else label[:49] + "…"
    out = [f'<g class="layer" data-layer="{escape(str(numbers[0]))}" data-layers="{len(numbers)}" data-type="{escape(kind)}">'
           f"<title>{escape(label)} - {nbytes} bytes each, dtype {escape(str(layer.get('dtype')))}</title>",
           f'<rect x="8" y="{y + 3}" width="10" height="{BYTES_H - 6}" fill="{color(kind)}"/>',
           f'<text x="24" y="{y + BYTES_H - 5}" font-size="10.5" fill="currentColor">{escape(short)}</text>']
    bar_w = WIDTH - BAR_X - 90
    members = layer.get("members") or []
    segments = [(m.get("type") or "?", m.get("nbytes") or 0) for m in members] or [(kind, nbytes)]
    x = float(BAR_X)
    for seg_kind, seg_bytes in segments:
        w = bar_w * seg_bytes / largest
        if w > 0:
            out.append(f'<rect class="bar" x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{BYTES_H - 6}" '
                       f'fill="{color(seg_kind)}"/>')
        x += w
    each = " each" if len(numbers) > 1 else ""
    out.append(f'<text x="{x + 4:.1f}" y="{y + BYTES_H - 5}" font-size="10" fill="currentColor" opacity=".75">'
               f"{human_bytes(nbytes)}{each}</text></g>")
    return "".join(out)


def _legend(kinds: list[str], y: float, padding: bool) -> str:
    out, x = [f'<g class="legend" transform="translate(8,{y:.0f})">'], 0
    items = [(k, f'<rect x="{{x}}" y="2" width="10" height="10" fill="{color(k)}"/>') for k in kinds]
    if padding:
        items.append(("left padding", '<rect x="{x}" y="2.5" width="9" height="9" fill="none" stroke="currentColor" '
                                      'stroke-opacity=".45" stroke-dasharray="2 1.5"/>'))
    for label, swatch in items:
        out.append(swatch.format(x=x) + f'<text x="{x + 14}" y="11" font-size="10.5" fill="currentColor">'
                   f"{escape(label)}</text>")
        x += 24 + 6.5 * len(label)
    return "".join(out) + "</g>"


def build_cache_svg(layout: dict, title: Optional[str] = None) -> str:
    """The whole layout as one `<svg>` string: rows x positions, then bytes per layer."""
    layers = layout.get("layers") or []
    total = sum(layer.get("nbytes") or 0 for layer in layers)
    who = f"request {layout['request']}" if layout.get("request") else layout.get("what", "fresh cache")
    head = title or f"{layout.get('model', '?')} - {who} - {len(layers)} layers - {human_bytes(total)}"
    body, y = [], TOP
    drawn = [g for g in grids(layers) if g["batch"].get("state") or g["batch"].get("positions")]
    for grid in drawn:
        svg, h = _grid(grid, y)
        body.append(svg)
        y += h
    if layers and not drawn:
        body.append(f'<text x="8" y="{y + 11:.0f}" font-size="11" fill="currentColor" opacity=".75">'
                    "no tokens held yet: a fresh cache (pass a live request id, or follow one with "
                    "auto_refresh=True)</text>")
        y += 20
    largest = max((layer.get("nbytes") or 0 for layer in layers), default=0) or 1
    for numbers, layer in runs(layers):
        body.append(_bytes_row(numbers, layer, y, largest))
        y += BYTES_H
    padding = any(row.get("padding") for g in drawn for row in g["batch"]["rows"])
    body.append(_legend(_types(layers), y + 8, padding))
    height = y + 30
    return (svg_open("mlx-cache", WIDTH, height) +
            f'<text x="8" y="16" font-size="12" font-weight="bold" fill="currentColor">{escape(head)}</text>' +
            "".join(body) + "</svg>")
