"""BatchEvents -> an SVG timeline: one lane per request, seconds on the x axis.

Pure functions (no widgets, no engine) so the drawing is testable on plain dicts. A lane is named
by its prompt's first words and who sent it (a notebook, a route client); hovering it gives the
id, the prompt, the wait, the decode time and the tokens. It shows waiting (insert -> join) and
decoding (join -> leave); marks show insert, join (the request's cache was extended into the
running batch) and leave (filtered out, coloured by why). Under the lanes, the batch size over
time. Text and lines are drawn in `currentColor` (see `theme`), so dark themes read too. A lane of
a request with a LoRA adapter says which. A server with several models loaded has one batch per
model: `build_models_batch_svg` draws their timelines one under the other, each titled with its model.
A dataset job's row (a background row) decodes in grey, not blue, and the stretches it spent out of
the batch, having yielded its slot to interactive requests, are drawn as waiting.

The picture is drawn for a given width: from 600 px up, names sit in a column left of the lanes;
narrower (a 320-px sidebar), each name sits above its lane's bars and the legend wraps, so text
keeps its size instead of the whole picture being scaled down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Optional

from mlx_nb.pictures.theme import (
    BACKGROUND,
    BOLD_12_PX,
    WIDTH,
    cut,
    legend_rows,
    picture_width,
    svg_open,
)

REASON_COLORS = {"stop": "#2e7d32", "length": "#ef6c00", "abort": "#9e9e9e", "error": "#c62828"}
DECODE_COLOR = "#64b5f6"
JOB_COLOR = "#90a4ae"  # a dataset job's rows decode in the background lane (engine/scheduling/background.py)
JOIN_COLOR = "#1565c0"
LINE_COLOR = "#ab47bc"
WAIT_OPACITY = ".28"  # waiting is the theme's font colour, faint: grey on light and dark alike

TOP, CHART_H, BAR_H = 26, 56, 22


@dataclass(frozen=True)
class Layout:
    """Where things go in the timeline (see the module docstring): where the time axis starts
    (after the name column, or at the margin), the right margin, and the height of a lane's name
    line above its bars (narrow only)."""

    width: int
    narrow: bool
    label_w: int
    right: int
    name_h: int

    @classmethod
    def of(cls, width: float) -> "Layout":
        w, narrow = picture_width(width)
        return cls(w, True, 8, 8, 12) if narrow else cls(w, False, 200, 16, 0)

    @property
    def lane_h(self) -> int:
        return self.name_h + BAR_H


def lanes_from_events(events: list[dict]) -> tuple[list[dict], list[tuple[float, int]]]:
    """Per request {id, insert, join, leave, first, reason, source, label, prompt_tokens, tokens}
    (times in seconds since the epoch), and the batch size after each event that reports it."""
    lanes: dict[str, dict] = {}
    sizes: list[tuple[float, int]] = []

    def lane(rid: str, t: float) -> dict:
        if rid not in lanes:  # first seen mid-flight (the log started after its insert)
            lanes[rid] = {"id": rid, "insert": None, "join": None, "leave": None, "reason": None, "first": t,
                          "source": None, "label": None, "prompt_tokens": None, "tokens": 0, "adapter": None,
                          "job": None, "yields": []}
        return lanes[rid]

    for ev in sorted(events, key=lambda e: e.get("seq", 0)):
        kind, t, detail = ev.get("kind"), float(ev.get("time") or 0.0), ev.get("detail") or {}
        for rid in ev.get("requests") or []:
            ln = lane(rid, t)
            if kind == "insert" and detail.get("resumed"):  # a job row back from yielding its slot
                if ln["yields"] and ln["yields"][-1][1] is None:
                    ln["yields"][-1][1] = t
            elif kind == "insert":
                ln.update(insert=t, source=detail.get("source"), label=detail.get("label"),
                          prompt_tokens=detail.get("prompt_tokens"), adapter=detail.get("adapter"),
                          job=detail.get("job"))
            elif kind == "filter" and detail.get("reason") == "yield":
                ln["yields"].append([t, None])
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
    if ln.get("adapter"):
        lines.append(f"with the LoRA adapter {ln['adapter']}")
    if ln.get("job"):
        yielded = len(ln.get("yields") or [])
        lines.append(f"a row of job {ln['job']} (background)" + (f", yielded its slot {yielded}x" if yielded else ""))
    if ln["label"]:
        lines.append(f"prompt: {ln['label']}" + (f" ({ln['prompt_tokens']} tokens)" if ln["prompt_tokens"] else ""))
    start = ln["insert"] if ln["insert"] is not None else ln["first"]
    if ln["join"] is not None:
        lines.append(f"waited {ln['join'] - start:.2f} s, then decoded {(ln['leave'] or now) - ln['join']:.2f} s")
    lines.append(f"{ln['tokens']} token steps" + (f", left: {ln['reason']}" if ln["reason"] else ", still running"))
    return "\n".join(lines)


def _legend(y: float, layout: Layout) -> tuple[str, float]:
    """The legend from `y`, in rows that fit the width; (svg, its height)."""
    square = '<rect x="{x}" y="4" width="8" height="8" fill="%s"/>'
    items = [
        ('<circle cx="{x}" cy="8" r="4" style="fill:%s" stroke="currentColor" transform="translate(5,0)"/>' % BACKGROUND,
         "insert"),
        ('<rect x="{x}" y="4" width="10" height="8" fill="currentColor" opacity="%s"/>' % WAIT_OPACITY, "waiting"),
        ('<path d="M1,3 L9,8 L1,13 Z" fill="%s" transform="translate({x},0)"/>' % JOIN_COLOR, "join (extend)"),
        ('<rect x="{x}" y="4" width="10" height="8" fill="%s"/>' % DECODE_COLOR, "decoding"),
        ('<rect x="{x}" y="4" width="10" height="8" fill="%s"/>' % JOB_COLOR, "job row decoding"),
        *[(square % c, f"leave: {r}") for r, c in REASON_COLORS.items()],
        ('<line x1="0" y1="8" x2="10" y2="8" stroke="%s" stroke-width="2" transform="translate({x},0)"/>' % LINE_COLOR,
         "batch size"),
    ]
    return legend_rows(items, y, layout.width)


def build_batch_svg(events: list[dict], max_lanes: int = 24, title: Optional[str] = None, width: int = WIDTH) -> str:
    """The whole timeline as one `<svg>` string, `width` px wide (see `theme.picture_width`)."""
    body, height = _timeline(events, max_lanes, title, width)
    return svg_open("mlx-batch", Layout.of(width).width, height) + body + "</svg>"


def build_models_batch_svg(by_model: dict[str, list[dict]], max_lanes: int = 24, width: int = WIDTH) -> str:
    """Several models' timelines, one under the other, each titled with its model (each model has
    its own batch); one model's is `build_batch_svg`'s picture. The legend is drawn once, last."""
    if len(by_model) <= 1:
        return build_batch_svg(next(iter(by_model.values()), []), max_lanes, width=width)
    parts, y = [], 0.0
    for i, (model, events) in enumerate(by_model.items()):
        body, height = _timeline(events, max_lanes, None, width, model=model, legend=i == len(by_model) - 1)
        parts.append(f'<g class="model" data-model="{escape(model)}" transform="translate(0,{y:.0f})">{body}</g>')
        y += height
    return svg_open("mlx-batch", Layout.of(width).width, y) + "".join(parts) + "</svg>"


def _timeline(events: list[dict], max_lanes: int, title: Optional[str], width: int, model: Optional[str] = None,
              legend: bool = True) -> tuple[str, float]:
    """One batch's timeline (its title, lanes, batch-size chart, legend): the SVG inside the root
    tag, and its height."""
    layout = Layout.of(width)
    lanes, sizes = lanes_from_events(events)
    hidden = max(0, len(lanes) - max_lanes)
    lanes = lanes[hidden:]
    times = [t for ln in lanes for t in (ln["insert"], ln["join"], ln["leave"], ln["first"]) if t is not None]
    times += [t for t, _ in sizes if not lanes or t >= min(times)]
    t0, t1 = (min(times), max(times)) if times else (0.0, 1.0)
    span = max(t1 - t0, 1e-3)
    plot_w = layout.width - layout.label_w - layout.right

    def x(t: Optional[float]) -> float:
        return layout.label_w + plot_w * ((t1 if t is None else t) - t0) / span

    lanes_h = max(1, len(lanes)) * layout.lane_h
    chart_y = TOP + lanes_h + 10 + layout.name_h
    legend_y = chart_y + CHART_H + 20
    legend, legend_h = _legend(legend_y, layout) if legend else ("", 0)
    head = title or f"batch timeline: {len(lanes)} request{'s' if len(lanes) != 1 else ''} over {_seconds(t1 - t0)}"
    if model:
        head = f"{model}: {head}"
    if hidden:
        head += f" (+{hidden} earlier not shown)"
    out = [f'<text x="8" y="16" font-size="12" font-weight="bold" fill="currentColor">'
           f'{escape(cut(head, (layout.width - 16) / BOLD_12_PX))}</text>']
    if not lanes:
        note = "no batch events yet: chat from any notebook or client of this server"
        out.append(f'<text x="{layout.label_w}" y="{TOP + 12}" font-size="11" fill="currentColor" opacity=".7">'
                   f"{escape(cut(note, plot_w / 5.8))}</text>")
    for i, ln in enumerate(lanes):
        out.append(_lane(ln, TOP + i * layout.lane_h, x, t1, layout))
    out.append(_chart(sizes, x, chart_y, t0, t1, layout))
    out.append(legend)
    return "".join(out), legend_y + legend_h


def _name(ln: dict, layout: Layout) -> tuple[str, str]:
    """(first line, second line) of a lane's label: its prompt, and who sent it."""
    label = ln["label"] or ln["id"]
    source = " · ".join(p for p in (ln.get("adapter") and f"@{ln['adapter']}", ln["source"]) if p)
    if layout.narrow:  # one line above the bars, "prompt · source", in the width (10 and 8.5 px text)
        room = layout.width - 16
        first = cut(label, room * (0.55 if source else 1.0) / 5.6)
        return first, cut(source, (room - 5.6 * len(first) - 10) / 4.8) if source else ""
    return cut(label, 30), cut(source, 34)


def _lane(ln: dict, y: float, x, now: float, layout: Layout) -> str:
    """One request: label, waiting bar, decoding bar, then the insert / join / leave marks on top."""
    by = y + layout.name_h  # the bars' band: BAR_H tall
    cy = by + BAR_H / 2
    rid = escape(ln["id"])
    first, second = _name(ln, layout)
    kind = "lane job" if ln.get("job") else "lane"
    out = [f'<g class="{kind}" data-request="{rid}"><title>{escape(lane_title(ln, now))}</title>',
           f'<rect x="0" y="{y}" width="{layout.width}" height="{layout.lane_h}" fill="currentColor" opacity="0"/>']
    if layout.narrow:
        out.append(f'<text x="8" y="{y + 10}" font-size="10" fill="currentColor">{escape(first)}'
                   + (f'<tspan font-size="8.5" opacity=".65"> · {escape(second)}</tspan>' if second else "")
                   + "</text>")
    else:
        out.append(f'<text x="{layout.label_w - 6}" y="{y + (10 if second else 14)}" font-size="10" '
                   f'text-anchor="end" fill="currentColor">{escape(first)}</text>')
        if second:
            out.append(f'<text x="{layout.label_w - 6}" y="{y + 19}" font-size="8.5" text-anchor="end" '
                       f'fill="currentColor" opacity=".65">{escape(second)}</text>')
    start, join, leave = (ln["insert"] if ln["insert"] is not None else ln["first"]), ln["join"], ln["leave"]
    wait_end = join if join is not None else leave
    if wait_end is None or wait_end > start:
        out.append(f'<rect class="wait" x="{x(start):.1f}" y="{by + 7}" width="{max(1.0, x(wait_end) - x(start)):.1f}" '
                   f'height="{BAR_H - 14}" fill="currentColor" opacity="{WAIT_OPACITY}"/>')
    if join is not None:
        jx = x(join)
        out.append(f'<rect class="decode" x="{jx:.1f}" y="{by + 5}" width="{max(1.0, x(leave) - jx):.1f}" '
                   f'height="{BAR_H - 10}" fill="{JOB_COLOR if ln.get("job") else DECODE_COLOR}"/>')
        for gone, back in ln.get("yields") or []:  # out of the batch: drawn as waiting over the decode bar
            end = back if back is not None else leave
            out.append(f'<rect class="yielded" x="{x(gone):.1f}" y="{by + 5}" '
                       f'width="{max(1.0, x(end) - x(gone)):.1f}" height="{BAR_H - 10}" style="fill:{BACKGROUND}"/>'
                       f'<rect class="wait" x="{x(gone):.1f}" y="{by + 7}" width="{max(1.0, x(end) - x(gone)):.1f}" '
                       f'height="{BAR_H - 14}" fill="currentColor" opacity="{WAIT_OPACITY}"/>')
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


def _chart(sizes: list[tuple[float, int]], x, y0: float, t0: float, t1: float, layout: Layout) -> str:
    """The batch size over time as a step line, with its scale and the time axis."""
    top = max((n for _, n in sizes), default=0) or 1
    base = y0 + CHART_H
    lx = layout.label_w
    out = [f'<g class="batch-size"><line x1="{lx}" y1="{base}" x2="{layout.width - layout.right}" y2="{base}" '
           'stroke="currentColor" stroke-opacity=".45"/>']
    if layout.narrow:  # the scale above the chart
        out.append(f'<text x="{lx}" y="{y0 - 3}" font-size="10" fill="currentColor">batch size (up to {top})</text>')
    else:
        out.append(f'<text x="{lx - 6}" y="{y0 + 10}" font-size="10" text-anchor="end" fill="currentColor">'
                   f"batch size {top}</text>"
                   f'<text x="{lx - 6}" y="{base}" font-size="10" text-anchor="end" fill="currentColor">0</text>')
    plot_w = layout.width - lx - layout.right
    for tick in time_ticks(t1 - t0, max_ticks=max(3, min(8, int(plot_w // 70)))):
        tx = x(t0 + tick)
        anchor = "start" if tx < 16 else "end" if tx > layout.width - 16 else "middle"  # inside the picture
        out.append(f'<line class="tick" x1="{tx:.1f}" y1="{base}" x2="{tx:.1f}" y2="{base + 3}" '
                   'stroke="currentColor" stroke-opacity=".6"/>'
                   f'<text x="{tx:.1f}" y="{base + 13}" font-size="9.5" text-anchor="{anchor}" '
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
