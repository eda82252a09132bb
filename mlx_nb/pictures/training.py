"""The fine-tune picture: training loss over steps (a line), validation loss (dots), checkpoints
(ticks), as SVG, with a one-line summary (step, losses, tokens/s, ETA, memory, paused).

Drawn from a fine-tune's status and its events (mlx_nb/training/worker.py writes them). Used by the
TrainPanel while it runs and, as a static image (theme.static_html), in saved notebooks. Every text
from outside (the name, the status, an error) is escaped.
"""

from __future__ import annotations

import math
from html import escape

from mlx_nb.pictures.theme import BACKGROUND, FONT, MUTED

WIDTH, HEIGHT = 460, 170
LEFT, RIGHT, TOP, BOTTOM = 44, 12, 26, 30
TRAIN = "#3b82f6"
VAL = "#f59e0b"


def summary(info: dict) -> str:
    """One line: status, step of total, losses, speed, ETA, memory."""
    parts = [str(info.get("status", "")), f"step {info.get('step', 0)}/{info.get('total_steps', '?')}"]
    for key, label in (("train_loss", "loss"), ("val_loss", "val")):
        if info.get(key) is not None:
            parts.append(f"{label} {info[key]:.3f}")
    if info.get("tokens_per_second"):
        parts.append(f"{info['tokens_per_second']:.0f} tok/s")
    if info.get("eta_s") is not None and info.get("status") == "running":
        parts.append(f"ETA {info['eta_s']:.0f} s")
    if info.get("peak_memory_gb"):
        parts.append(f"{info['peak_memory_gb']:.2f} GB")
    if info.get("paused"):
        parts.append("paused for a chat")
    if info.get("error"):
        parts.append(f"error: {info['error']}")
    return " · ".join(p for p in parts if p)


def loss_svg(info: dict, events: list[dict], title: str = "fine-tune") -> str:
    train = [(e["step"], e["train_loss"]) for e in events if e.get("kind") == "train"
             and math.isfinite(e.get("train_loss", math.nan))]
    val = [(e["step"], e["val_loss"]) for e in events if e.get("kind") == "val"
           and math.isfinite(e.get("val_loss", math.nan))]
    marks = [e["step"] for e in events if e.get("kind") == "checkpoint"]
    total = max(int(info.get("total_steps") or 0), max((s for s, _ in train), default=1), 1)
    top = max([v for _, v in train + val] or [1.0]) or 1.0
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    x = lambda step: LEFT + w * step / total  # noqa: E731
    y = lambda loss: TOP + h * (1 - loss / top)  # noqa: E731
    line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in train)
    dots = "".join(f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3" fill="{VAL}"><title>val {v:.3f} at step {s}'
                   f'</title></circle>' for s, v in val)
    ticks = "".join(f'<line x1="{x(s):.1f}" x2="{x(s):.1f}" y1="{TOP + h}" y2="{TOP + h + 5}" stroke="{MUTED}"/>'
                    for s in marks)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="mlx-train" width="{WIDTH}" height="{HEIGHT}" '
            f'style="color:{FONT};background:{BACKGROUND};font-family:sans-serif">'
            f'<text x="10" y="16" font-size="12" font-weight="bold" fill="currentColor">{escape(title)}</text>'
            f'<g class="axes" stroke="currentColor" stroke-opacity=".35">'
            f'<line x1="{LEFT}" x2="{LEFT + w}" y1="{TOP + h}" y2="{TOP + h}"/>'
            f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + h}"/></g>'
            f'<text x="{LEFT - 4}" y="{TOP + 8}" font-size="10" text-anchor="end" fill="{MUTED}">{top:.2f}</text>'
            f'<text x="{LEFT - 4}" y="{TOP + h}" font-size="10" text-anchor="end" fill="{MUTED}">0</text>'
            f'<text x="{LEFT + w}" y="{TOP + h + 16}" font-size="10" text-anchor="end" fill="{MUTED}">step {total}'
            f'</text>{ticks}'
            f'<polyline class="train" points="{line}" fill="none" stroke="{TRAIN}" stroke-width="1.5"/>'
            f'<g class="val">{dots}</g>'
            f'<text x="{LEFT + 4}" y="{TOP + h + 16}" font-size="10" fill="{TRAIN}">training loss</text>'
            f'<text x="{LEFT + 90}" y="{TOP + h + 16}" font-size="10" fill="{VAL}">● validation</text>'
            f'<text x="10" y="{HEIGHT - 2}" font-size="10" fill="currentColor">{escape(summary(info))}</text></svg>')
