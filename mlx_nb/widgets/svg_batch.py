"""BatchEvents -> an SVG timeline: one lane per request, engine steps on the x axis.

Pure functions (no widgets, no engine) so the drawing is testable on plain dicts. A lane shows
waiting (insert -> join) and decoding (join -> leave); marks show insert, join (the request's cache
was extended into the running batch) and leave (filtered out, colored by why). Under the lanes,
the batch size over time.
"""

from __future__ import annotations

from html import escape
from typing import Optional

REASON_COLORS = {"stop": "#2e7d32", "length": "#ef6c00", "abort": "#757575", "error": "#c62828"}
DECODE_COLOR = "#90caf9"
WAIT_COLOR = "#e0e0e0"
JOIN_COLOR = "#1565c0"
LINE_COLOR = "#6a1b9a"

WIDTH, LABEL_W, RIGHT, LANE_H, TOP, CHART_H, LEGEND_H = 760, 120, 16, 16, 26, 56, 24


def lanes_from_events(events: list[dict]) -> tuple[list[dict], dict[int, int]]:
    """Per request {id, insert, join, leave, reason}, and batch size by step."""
    lanes: dict[str, dict] = {}
    sizes: dict[int, int] = {}

    def lane(rid: str, step: int) -> dict:
        if rid not in lanes:  # first seen mid-flight (the log started after its insert)
            lanes[rid] = {"id": rid, "insert": None, "join": None, "leave": None, "reason": None, "first": step}
        return lanes[rid]

    for ev in sorted(events, key=lambda e: e.get("seq", 0)):
        kind, step, detail = ev.get("kind"), int(ev.get("step", 0)), ev.get("detail") or {}
        for rid in ev.get("requests") or []:
            ln = lane(rid, step)
            if kind == "insert":
                ln["insert"] = step
            elif kind == "extend":
                ln["join"] = step
            elif kind == "filter" or kind == "error":
                ln["leave"], ln["reason"] = step, "error" if kind == "error" else detail.get("reason", "stop")
            elif kind == "step" and ln["join"] is None and ln["insert"] is None:
                ln["join"] = step
        if "batch_size" in detail:
            sizes[step] = int(detail["batch_size"])
    return list(lanes.values()), sizes


def _legend(y: float) -> str:
    items = [
        ("circle", "#ffffff", "insert"),
        ("join", JOIN_COLOR, "join (extend)"),
        ("bar", DECODE_COLOR, "decoding"),
        *[("square", c, f"leave: {r}") for r, c in REASON_COLORS.items()],
        ("line", LINE_COLOR, "batch size"),
    ]
    out, x = [f'<g class="legend" transform="translate(0,{y:.0f})">'], 8.0
    for shape, color, label in items:
        if shape == "circle":
            out.append(f'<circle cx="{x + 5}" cy="8" r="4" fill="{color}" stroke="#333"/>')
        elif shape == "join":
            out.append(f'<path d="M{x + 1},3 L{x + 9},8 L{x + 1},13 Z" fill="{color}"/>')
        elif shape == "bar":
            out.append(f'<rect x="{x}" y="4" width="10" height="8" fill="{color}"/>')
        elif shape == "square":
            out.append(f'<rect x="{x + 1}" y="4" width="8" height="8" fill="{color}"/>')
        else:
            out.append(f'<line x1="{x}" y1="8" x2="{x + 10}" y2="8" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{x + 14}" y="12" font-size="10">{escape(label)}</text>')
        x += 20 + 6 * len(label)
    return "".join(out) + "</g>"


def build_batch_svg(events: list[dict], max_lanes: int = 24, title: Optional[str] = None) -> str:
    """The whole timeline as one `<svg>` string."""
    lanes, sizes = lanes_from_events(events)
    hidden = max(0, len(lanes) - max_lanes)
    lanes = lanes[hidden:]
    steps = [s for ln in lanes for s in (ln["insert"], ln["join"], ln["leave"], ln["first"]) if s is not None]
    steps += list(sizes)
    s0, s1 = (min(steps), max(steps)) if steps else (0, 1)
    span = max(1, s1 - s0)
    plot_w = WIDTH - LABEL_W - RIGHT

    def x(step: Optional[int]) -> float:
        return LABEL_W + (plot_w * ((s1 if step is None else step) - s0) / span)

    lanes_h = max(1, len(lanes)) * LANE_H
    chart_y = TOP + lanes_h + 10
    height = chart_y + CHART_H + 18 + LEGEND_H
    head = title or f"batch timeline: {len(lanes)} request(s), steps {s0}-{s1}"
    if hidden:
        head += f" (+{hidden} earlier not shown)"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="mlx-batch" width="{WIDTH}" height="{height:.0f}" '
           f'viewBox="0 0 {WIDTH} {height:.0f}" font-family="sans-serif">',
           f'<text x="8" y="16" font-size="12" font-weight="bold">{escape(head)}</text>']
    if not lanes:
        out.append(f'<text x="{LABEL_W}" y="{TOP + 12}" font-size="11" fill="#666">no batch events yet</text>')
    for i, ln in enumerate(lanes):
        out.append(_lane(ln, TOP + i * LANE_H, x))
    out.append(_chart(sizes, x, chart_y, s0, s1))
    out.append(_legend(chart_y + CHART_H + 18))
    out.append("</svg>")
    return "".join(out)


def _lane(ln: dict, y: float, x) -> str:
    """One request: label, waiting bar, decoding bar, then the insert / join / leave marks on top."""
    cy = y + LANE_H / 2
    rid = escape(ln["id"])
    out = [f'<g class="lane" data-request="{rid}"><title>{rid}</title>',
           f'<text x="{LABEL_W - 6}" y="{cy + 4:.1f}" font-size="10" text-anchor="end">{escape(ln["id"][-16:])}</text>']
    start, join, leave = (ln["insert"] if ln["insert"] is not None else ln["first"]), ln["join"], ln["leave"]
    if join is not None and join > start:
        out.append(f'<rect class="wait" x="{x(start):.1f}" y="{y + 4}" width="{x(join) - x(start):.1f}" '
                   f'height="{LANE_H - 8}" fill="{WAIT_COLOR}"/>')
    if join is not None:
        jx = x(join)
        out.append(f'<rect class="decode" x="{jx:.1f}" y="{y + 3}" width="{max(1.0, x(leave) - jx):.1f}" '
                   f'height="{LANE_H - 6}" fill="{DECODE_COLOR}"/>')
        out.append(f'<path class="mark join" d="M{jx - 4:.1f},{cy - 5:.1f} L{jx + 4:.1f},{cy:.1f} '
                   f'L{jx - 4:.1f},{cy + 5:.1f} Z" fill="{JOIN_COLOR}"><title>join at step {join}</title></path>')
    if ln["insert"] is not None:
        out.append(f'<circle class="mark insert" cx="{x(ln["insert"]):.1f}" cy="{cy:.1f}" r="3.5" fill="#fff" '
                   f'stroke="#333"><title>insert at step {ln["insert"]}</title></circle>')
    if leave is not None:
        reason = escape(ln["reason"] or "stop")
        out.append(f'<rect class="mark leave reason-{reason}" x="{x(leave) - 4:.1f}" y="{cy - 4:.1f}" width="8" '
                   f'height="8" fill="{REASON_COLORS.get(reason, "#333")}">'
                   f"<title>leave at step {leave}: {reason}</title></rect>")
    return "".join(out) + "</g>"


def _chart(sizes: dict[int, int], x, y0: float, s0: int, s1: int) -> str:
    """The batch size per step as a step line, with its scale and the step axis."""
    top = max(sizes.values(), default=0) or 1
    base = y0 + CHART_H
    out = [f'<g class="batch-size"><line x1="{LABEL_W}" y1="{base}" x2="{WIDTH - RIGHT}" y2="{base}" stroke="#999"/>',
           f'<text x="{LABEL_W - 6}" y="{y0 + 10}" font-size="10" text-anchor="end">batch {top}</text>',
           f'<text x="{LABEL_W - 6}" y="{base}" font-size="10" text-anchor="end">0</text>',
           f'<text x="{LABEL_W}" y="{base + 12}" font-size="10">step {s0}</text>',
           f'<text x="{WIDTH - RIGHT}" y="{base + 12}" font-size="10" text-anchor="end">step {s1}</text>']
    if sizes:
        points, prev = [], None
        for step in sorted(sizes):
            yy = base - (CHART_H - 4) * sizes[step] / top
            if prev is not None:
                points.append(f"{x(step):.1f},{prev:.1f}")
            points.append(f"{x(step):.1f},{yy:.1f}")
            prev = yy
        out.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="{LINE_COLOR}" stroke-width="1.5"/>')
    return "".join(out) + "</g>"
