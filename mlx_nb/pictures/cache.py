"""A cache layout (`cache_layout()`'s dict, or `describe_layers` of any caches) -> an SVG.

Two parts. First the cache as **rows x positions**, one grid per kind of layer (layers with the
same type and the same rows are drawn once): each batch row's left padding (dashed cells), the
positions holding its tokens (filled, coloured by cache type), a sliding window's fixed width and
what it dropped, an SSM layer's fixed-size state. This is what merge, extend and filter change, so
drawing it before and after each verb shows them. Then the bytes, layer by layer, with runs of
identical layers summarized in one line (a fresh 30-layer cache is one line, not 30). When the
layout carries the engine's prefix cache (`cache_layout()` does), two last bars show what it keeps
in memory and on disk against their budgets.

Pure functions, testable without widgets. Colours work on light and dark JupyterLab themes: text
and lines use `currentColor`, which the root sets from the theme's font colour. Drawn for a given
width: narrower than 600 px (a sidebar), row labels shorten and each layer's bytes label sits above
its bar, so text keeps its size.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Optional

from mlx_nb.formatting import human_bytes
from mlx_nb.pictures.theme import (
    BOLD_11_PX,
    BOLD_12_PX,
    WIDTH,
    cut,
    legend_rows,
    picture_width,
    svg_open,
)

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

TOP, ROW_H, BYTES_H, STATE_W = 26, 14, 16, 56


@dataclass(frozen=True)
class Layout:
    """Where things go in the cache picture (see the module docstring): where a grid's cells start
    (after the row labels) and the room kept right of them, where a layer's bytes bar starts (after
    its label, or under it) and the room kept right of it, and a layer's bytes row height."""

    width: int
    narrow: bool
    grid_x: int
    grid_right: int
    bar_x: int
    bar_right: int
    bytes_h: int

    @classmethod
    def of(cls, width: float) -> "Layout":
        w, narrow = picture_width(width)
        return cls(w, True, 84, 48, 24, 64, 2 * BYTES_H - 2) if narrow else cls(w, False, 150, 110, 330, 90, BYTES_H)

    @property
    def grid_w(self) -> int:
        return self.width - self.grid_x - self.grid_right

    @property
    def bar_w(self) -> int:
        return self.width - self.bar_x - self.bar_right


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


def _grid(grid: dict, y: float, layout: Layout) -> tuple[str, float]:
    """One grid: its title, then a row per batch row. Returns (svg, height)."""
    batch, kind = grid["batch"], grid["type"]
    fill = color(kind)
    gx = layout.grid_x
    out = [f'<g class="grid" data-type="{escape(kind)}"><title>{escape(grid_title(grid))}</title>',
           f'<text x="8" y="{y + 11:.0f}" font-size="11" font-weight="bold" fill="currentColor">'
           f"{escape(cut(grid_title(grid), (layout.width - 16) / BOLD_11_PX))}</text>"]
    y += 16
    positions = batch.get("positions") or 0
    cell = min(14.0, layout.grid_w / positions) if positions else 0.0
    for r, row in enumerate(batch["rows"]):
        cy = y + r * ROW_H
        tokens, pad = row.get("tokens"), row.get("padding") or 0
        who = "state" if batch.get("state") else f"{tokens} token{'s' if tokens != 1 else ''}"
        if not batch.get("state") and pad:
            who += f", pad {pad}"
        short = "state" if batch.get("state") else str(tokens)  # narrow: the padding shows as dashed cells
        out.append(f'<g class="row" data-row="{r}" data-padding="{escape(str(pad))}" data-tokens="{escape(str(tokens))}">'
                   f'<title>row {r} · {escape(who)}</title>'
                   f'<text x="{gx - 6}" y="{cy + 10:.0f}" font-size="10" text-anchor="end" '
                   f'fill="currentColor">row {r} · {escape(short if layout.narrow else who)}</text>')
        if batch.get("state"):
            out.append(f'<rect class="state" x="{gx}" y="{cy + 1:.0f}" width="{STATE_W}" height="{ROW_H - 3}" '
                       f'fill="{fill}" rx="2"/>')
        else:
            out.append(_cells(gx, cy, cell, pad, positions, fill))
            held = positions - pad
            if tokens is not None and tokens > held >= 0:  # a sliding window that dropped its oldest
                dropped = f"+{tokens - held}" + ("" if layout.narrow else " dropped")
                out.append(f'<text x="{gx + positions * cell + 6:.0f}" y="{cy + 10:.0f}" font-size="10" '
                           f'fill="currentColor" opacity=".75">{dropped}</text>')
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


def _bytes_row(numbers: list[int], layer: dict, y: float, largest: int, layout: Layout) -> str:
    kind = layer.get("type") or "?"
    nbytes = layer.get("nbytes") or 0
    where = layer_span(numbers)
    count = f" x{len(numbers)}" if len(numbers) > 1 else ""
    label = f"{where} {_label(layer)}{count}"
    short = cut(label, (layout.width - 32) / 5.9 if layout.narrow else 50)
    by = y + (BYTES_H - 2 if layout.narrow else 0)  # the bar's line: under the label when narrow
    out = [f'<g class="layer" data-layer="{escape(str(numbers[0]))}" data-layers="{len(numbers)}" data-type="{escape(kind)}">'
           f"<title>{escape(label)} - {nbytes} bytes each, dtype {escape(str(layer.get('dtype')))}</title>",
           f'<rect x="8" y="{y + 3}" width="10" height="{BYTES_H - 6}" fill="{color(kind)}"/>',
           f'<text x="24" y="{y + BYTES_H - 5}" font-size="10.5" fill="currentColor">{escape(short)}</text>']
    members = layer.get("members") or []
    segments = [(m.get("type") or "?", m.get("nbytes") or 0) for m in members] or [(kind, nbytes)]
    x = float(layout.bar_x)
    for seg_kind, seg_bytes in segments:
        w = layout.bar_w * seg_bytes / largest
        if w > 0:
            out.append(f'<rect class="bar" x="{x:.1f}" y="{by + 3}" width="{w:.1f}" height="{BYTES_H - 6}" '
                       f'fill="{color(seg_kind)}"/>')
        x += w
    each = "" if len(numbers) == 1 or layout.narrow else " each"
    out.append(f'<text x="{x + 4:.1f}" y="{by + BYTES_H - 5}" font-size="10" fill="currentColor" opacity=".75">'
               f"{human_bytes(nbytes)}{each}</text></g>")
    return "".join(out)


PREFIX_COLOR = "#bcbd22"


def prefix_stores(prefix: dict) -> list[tuple[str, dict]]:
    """("memory", its numbers) and, when kept there, ("disk", ...) of a prefix cache's status."""
    if not prefix.get("enabled"):
        return []
    disk = prefix.get("disk") or {}
    return [("memory", prefix)] + ([("disk", disk)] if disk.get("enabled") else [])


def _store_row(where: str, held: dict, y: float, layout: Layout) -> str:
    """One prefix-cache store as a bar: bytes held out of its budget, and how many entries."""
    nbytes, budget, entries = held.get("bytes") or 0, held.get("budget_bytes") or 0, held.get("entries") or 0
    label = f"prefix cache {'in memory' if where == 'memory' else 'on disk'}: {entries} entr{'y' if entries == 1 else 'ies'}, {human_bytes(nbytes)}"
    short = cut(label, (layout.width - 32) / 5.9 if layout.narrow else 50)
    share = min(1.0, nbytes / budget) if budget else 0.0
    by = y + (BYTES_H - 2 if layout.narrow else 0)
    return (f'<g class="prefix-store" data-where="{where}" data-entries="{int(entries)}" data-bytes="{int(nbytes)}">'
            f"<title>{escape(label)} of a {human_bytes(budget)} budget ({nbytes} of {budget} bytes)</title>"
            f'<rect x="8" y="{y + 3}" width="10" height="{BYTES_H - 6}" fill="{PREFIX_COLOR}"/>'
            f'<text x="24" y="{y + BYTES_H - 5}" font-size="10.5" fill="currentColor">{escape(short)}</text>'
            f'<rect x="{layout.bar_x}" y="{by + 3}" width="{layout.bar_w}" height="{BYTES_H - 6}" fill="none" '
            f'stroke="currentColor" stroke-opacity=".35"/>'
            f'<rect class="bar" x="{layout.bar_x}" y="{by + 3}" width="{layout.bar_w * share:.1f}" '
            f'height="{BYTES_H - 6}" fill="{PREFIX_COLOR}"/>'
            f'<text x="{layout.bar_x + layout.bar_w + 4}" y="{by + BYTES_H - 5}" font-size="10" fill="currentColor" '
            f'opacity=".75">{100 * share:.0f}%{"" if layout.narrow else " of budget"}</text></g>')


def _legend(kinds: list[str], y: float, padding: bool, layout: Layout) -> tuple[str, float]:
    items = [(f'<rect x="{{x}}" y="2" width="10" height="10" fill="{color(k)}"/>', k) for k in kinds]
    if padding:
        items.append(('<rect x="{x}" y="2.5" width="9" height="9" fill="none" stroke="currentColor" '
                      'stroke-opacity=".45" stroke-dasharray="2 1.5"/>', "left padding"))
    return legend_rows(items, y, layout.width, font=10.5, char_w=6.5, gap=24)


def build_cache_svg(layout: dict, title: Optional[str] = None, width: int = WIDTH) -> str:
    """The whole layout as one `<svg>` string: rows x positions, then bytes per layer; drawn for
    `width` px (see `theme.picture_width`)."""
    shape = Layout.of(width)
    layers = layout.get("layers") or []
    total = sum(layer.get("nbytes") or 0 for layer in layers)
    who = f"request {layout['request']}" if layout.get("request") else layout.get("what", "fresh cache")
    head = title or f"{layout.get('model', '?')} - {who} - {len(layers)} layers - {human_bytes(total)}"
    body, y = [], TOP
    drawn = [g for g in grids(layers) if g["batch"].get("state") or g["batch"].get("positions")]
    for grid in drawn:
        svg, h = _grid(grid, y, shape)
        body.append(svg)
        y += h
    if layers and not drawn:
        note = "no tokens held yet: a fresh cache (pass a live request id, or follow one with auto_refresh=True)"
        body.append(f'<text x="8" y="{y + 11:.0f}" font-size="11" fill="currentColor" opacity=".75">'
                    f"{escape(cut(note, (shape.width - 16) / 5.9))}</text>")
        y += 20
    largest = max((layer.get("nbytes") or 0 for layer in layers), default=0) or 1
    for numbers, layer in runs(layers):
        body.append(_bytes_row(numbers, layer, y, largest, shape))
        y += shape.bytes_h
    for where, held in prefix_stores(layout.get("prefix_cache") or {}):
        body.append(_store_row(where, held, y, shape))
        y += shape.bytes_h
    padding = any(row.get("padding") for g in drawn for row in g["batch"]["rows"])
    legend, legend_h = _legend(_types(layers), y + 6, padding, shape)
    body.append(legend)
    shown = head
    if shape.narrow and not title:  # the model is named in the title (hover) and the sidebar's header
        shown = f"{who} - {len(layers)} layers - {human_bytes(total)}"
    return (svg_open("mlx-cache", shape.width, y + 6 + legend_h) + f"<title>{escape(head)}</title>" +
            f'<text x="8" y="16" font-size="12" font-weight="bold" fill="currentColor">'
            f'{escape(cut(shown, (shape.width - 16) / BOLD_12_PX) if shape.narrow else shown)}</text>' + "".join(body) + "</svg>")
