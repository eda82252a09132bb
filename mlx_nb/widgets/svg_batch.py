"""BatchEvents -> an SVG timeline: one lane per request, seconds on the x axis.

Pure functions (no widgets, no engine) so the drawing is testable on plain dicts. A lane is named
by its prompt's first words and who sent it (a notebook, a route client); hovering it gives the
id, the prompt, the wait, the decode time and the tokens. It shows waiting (insert -> join) and
decoding (join -> leave); marks show insert, join (the request's cache was extended into the
running batch) and leave (filtered out, coloured by why). Under the lanes, the batch size over
time. Text and lines are drawn in `currentColor` (see `theme`), so dark themes read too.
"""

from __future__ import annotations

import math
from html import escape
from typing import Optional

from mlx_nb.widgets.theme import BACKGROUND, svg_open

REASON_COLORS = {"stop": "#2e7d32", "length": "#ef6c00", "abort": "#9e9e9e", "error": "#c62828"}
DECODE_COLOR = "#64b5f6"
JOIN_COLOR = "#1565c0"
LINE_COLOR = "#ab47bc"
WAIT_OPACITY = ".28"  # waiting is the theme's font colour, faint: grey on light and dark alike

WIDTH, LABEL_W, RIGHT, LANE_H, TOP, CHART_H, LEGEND_H = 760, 200, 16, 22, 26, 56, 24


def lanes_from_events(events: list[dict]) -> tuple[list[dict], list[tuple[float, int]]]:
    """Per request {id, insert, join, leave, first, reason, source, label, prompt_tokens, tokens}
    (times in seconds since the epoch), and the batch size after each event that reports it."""
    lanes: dict[str, dict] = {}
    sizes: list[tuple[float, int]] = []

    def lane(rid: str, t: float) -> dict:
        if rid not in lanes:  # first seen mid-flight (the log started after its insert)
            lanes[rid] = {"id": rid, "insert": None, "join": None, "leave": None, "reason": None, "first": t,
                          "source": None, "label": None, "prompt_tokens": None, "tokens": 0}
        return lanes[rid]

    for ev in sorted(events, key=lambda e: e.get("seq", 0)):
        kind, t, detail = ev.get("kind"), float(ev.get("time") or 0.0), ev.get("detail") or {}
        for rid in ev.get("requests") or []:
            ln = lane(rid, t)
            if kind == "insert":
                ln.update(insert=t, source=detail.get("source"), label=detail.get("label"),
                          prompt_tokens=detail.get("prompt_tokens"))
            elif kind == "extend":
                ln["join"] = t
            elif kind in ("filter", "error"):
                ln["leave"], ln["reason"] = t, "error" if kind == "error" else detail.get("reason", "stop")
            elif kind == "step":
                ln["tokens"] += 1
                if ln["join"] is None and ln["insert"] is None:
                    ln["join"] = t
        if "batch_size" in detail:
            sizes.append((t, int(detail["batch_size"])))
    return list(lanes.values()), sizes


def time_ticks(span: float, max_ticks: int = 8) -> list[float]:
    """0 and round steps (1, 2 or 5 x 10^k seconds) up to `span`."""
    if span <= 0:
        return [0.0]
    raw = span / max_ticks
    base = 10 ** math.floor(math.log10(raw))
    step = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    return [i * step for i in range(int(span / step + 1e-9) + 1)]


def _seconds(t: float) -> str:
    return f"{t:.0f} s" if t >= 10 or t == int(t) else f"{t:.1f} s"


def lane_title(ln: dict, now: float) -> str:
    """The hover text of a lane."""
    lines = [ln["id"]]
    if ln["source"]:
        lines.append(f"from {ln['source']}")
    if ln["label"]:
        lines.append(f"prompt: {ln['label']}" + (f" ({ln['prompt_tokens']} tokens)" if ln["prompt_tokens"] else ""))
    start = ln["insert"] if ln["insert"] is not None else ln["first"]
    if ln["join"] is not None:
        lines.append(f"waited {ln['join'] - start:.2f} s, then decoded {(ln['leave'] or now) - ln['join']:.2f} s")
    lines.append(f"{ln['tokens']} token steps" + (f", left: {ln['reason']}" if ln["reason"] else ", still running"))
    return "\n".join(lines)


def _legend(y: float) -> str:
    items = [
        ("circle", "", "insert"),
        ("wait", "", "waiting"),
        ("join", JOIN_COLOR, "join (extend)"),
        ("bar", DECODE_COLOR, "decoding"),
        *[("square", c, f"leave: {r}") for r, c in REASON_COLORS.items()],
        ("line", LINE_COLOR, "batch size"),
    ]
    out, x = [f'<g class="legend" transform="translate(0,{y:.0f})">'], 8.0
    for shape, color, label in items:
        if shape == "circle":
            out.append(f'<circle cx="{x + 5}" cy="8" r="4" style="fill:{BACKGROUND}" stroke="currentColor"/>')
        elif shape == "wait":
            out.append(f'<rect x="{x}" y="4" width="10" height="8" fill="currentColor" opacity="{WAIT_OPACITY}"/>')
        elif shape == "join":
            out.append(f'<path d="M{x + 1},3 L{x + 9},8 L{x + 1},13 Z" fill="{color}"/>')
        elif shape == "bar":
            out.append(f'<rect x="{x}" y="4" width="10" height="8" fill="{color}"/>')
        elif shape == "square":
            out.append(f'<rect x="{x + 1}" y="4" width="8" height="8" fill="{color}"/>')
        else:
            out.append(f'<line x1="{x}" y1="8" x2="{x + 10}" y2="8" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{x + 14}" y="12" font-size="10" fill="currentColor">{escape(label)}</text>')
        x += 20 + 5.6 * len(label)
    return "".join(out) + "</g>"


def build_batch_svg(events: list[dict], max_lanes: int = 24, title: Optional[str] = None) -> str:
    """The whole timeline as one `<svg>` string."""
    lanes, sizes = lanes_from_events(events)
    hidden = max(0, len(lanes) - max_lanes)
    lanes = lanes[hidden:]
    times = [t for ln in lanes for t in (ln["insert"], ln["join"], ln["leave"], ln["first"]) if t is not None]
    times += [t for t, _ in sizes if not lanes or t >= min(times)]
    t0, t1 = (min(times), max(times)) if times else (0.0, 1.0)
    span = max(t1 - t0, 1e-3)
    plot_w = WIDTH - LABEL_W - RIGHT

    def x(t: Optional[float]) -> float:
        return LABEL_W + plot_w * ((t1 if t is None else t) - t0) / span

    lanes_h = max(1, len(lanes)) * LANE_H
    chart_y = TOP + lanes_h + 10
    height = chart_y + CHART_H + 20 + LEGEND_H
    head = title or f"batch timeline: {len(lanes)} request{'s' if len(lanes) != 1 else ''} over {_seconds(t1 - t0)}"
    if hidden:
        head += f" (+{hidden} earlier not shown)"
    out = [svg_open("mlx-batch", WIDTH, height),
           f'<text x="8" y="16" font-size="12" font-weight="bold" fill="currentColor">{escape(head)}</text>']
    if not lanes:
        out.append(f'<text x="{LABEL_W}" y="{TOP + 12}" font-size="11" fill="currentColor" opacity=".7">'
                   "no batch events yet: chat from any notebook or client of this server</text>")
    for i, ln in enumerate(lanes):
        out.append(_lane(ln, TOP + i * LANE_H, x, t1))
    out.append(_chart(sizes, x, chart_y, t0, t1))
    out.append(_legend(chart_y + CHART_H + 20))
    out.append("</svg>")
    return "".join(out)


def _name(ln: dict) -> tuple[str, str]:
    """(first line, second line) of a lane's label: its prompt, and who sent it."""
    label = ln["label"] or ln["id"]
    label = label if len(label) <= 30 else label[:29] + "…"
    source = ln["source"] or ""
    return label, source if len(source) <= 34 else source[:33] + "…"


def _lane(ln: dict, y: float, x, now: float) -> str:
    """One request: label, waiting bar, decoding bar, then the insert / join / leave marks on top."""
    cy = y + LANE_H / 2
    rid = escape(ln["id"])
    first, second = _name(ln)
    out = [f'<g class="lane" data-request="{rid}"><title>{escape(lane_title(ln, now))}</title>',
           f'<rect x="0" y="{y}" width="{WIDTH}" height="{LANE_H}" fill="currentColor" opacity="0"/>',
           f'<text x="{LABEL_W - 6}" y="{y + (10 if second else 14)}" font-size="10" text-anchor="end" '
           f'fill="currentColor">{escape(first)}</text>']
    if second:
        out.append(f'<text x="{LABEL_W - 6}" y="{y + 19}" font-size="8.5" text-anchor="end" fill="currentColor" '
                   f'opacity=".65">{escape(second)}</text>')
    start, join, leave = (ln["insert"] if ln["insert"] is not None else ln["first"]), ln["join"], ln["leave"]
    wait_end = join if join is not None else leave
    if wait_end is None or wait_end > start:
        out.append(f'<rect class="wait" x="{x(start):.1f}" y="{y + 7}" width="{max(1.0, x(wait_end) - x(start)):.1f}" '
                   f'height="{LANE_H - 14}" fill="currentColor" opacity="{WAIT_OPACITY}"/>')
    if join is not None:
        jx = x(join)
        out.append(f'<rect class="decode" x="{jx:.1f}" y="{y + 5}" width="{max(1.0, x(leave) - jx):.1f}" '
                   f'height="{LANE_H - 10}" fill="{DECODE_COLOR}"/>')
        out.append(f'<path class="mark join" d="M{jx - 4:.1f},{cy - 5:.1f} L{jx + 4:.1f},{cy:.1f} '
                   f'L{jx - 4:.1f},{cy + 5:.1f} Z" fill="{JOIN_COLOR}"/>')
    if ln["insert"] is not None:
        out.append(f'<circle class="mark insert" cx="{x(ln["insert"]):.1f}" cy="{cy:.1f}" r="3.5" '
                   f'style="fill:{BACKGROUND}" stroke="currentColor"/>')
    if leave is not None:
        reason = escape(ln["reason"] or "stop")
        out.append(f'<rect class="mark leave reason-{reason}" x="{x(leave) - 4:.1f}" y="{cy - 4:.1f}" width="8" '
                   f'height="8" fill="{REASON_COLORS.get(reason, "#888")}"/>')
    return "".join(out) + "</g>"


def _chart(sizes: list[tuple[float, int]], x, y0: float, t0: float, t1: float) -> str:
    """The batch size over time as a step line, with its scale and the time axis."""
    top = max((n for _, n in sizes), default=0) or 1
    base = y0 + CHART_H
    out = [f'<g class="batch-size"><line x1="{LABEL_W}" y1="{base}" x2="{WIDTH - RIGHT}" y2="{base}" '
           'stroke="currentColor" stroke-opacity=".45"/>',
           f'<text x="{LABEL_W - 6}" y="{y0 + 10}" font-size="10" text-anchor="end" fill="currentColor">'
           f"batch size {top}</text>",
           f'<text x="{LABEL_W - 6}" y="{base}" font-size="10" text-anchor="end" fill="currentColor">0</text>']
    for tick in time_ticks(t1 - t0):
        tx = x(t0 + tick)
        out.append(f'<line class="tick" x1="{tx:.1f}" y1="{base}" x2="{tx:.1f}" y2="{base + 3}" '
                   'stroke="currentColor" stroke-opacity=".6"/>'
                   f'<text x="{tx:.1f}" y="{base + 13}" font-size="9.5" text-anchor="middle" '
                   f'fill="currentColor">{_seconds(tick)}</text>')
    if sizes:
        points, prev = [], None
        for t, n in sorted(sizes):
            yy = base - (CHART_H - 4) * n / top
            if prev is not None:
                points.append(f"{x(t):.1f},{prev:.1f}")
            points.append(f"{x(t):.1f},{yy:.1f}")
            prev = yy
        out.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="{LINE_COLOR}" stroke-width="1.5"/>')
    return "".join(out) + "</g>"
