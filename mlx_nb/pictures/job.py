"""The job picture: a dataset job's progress as a bar and its throughput over time, as SVG.

Drawn from the `progress` dict a job reports (mlx_nb/jobs/runner.Progress): rows done of total,
errors, tokens/s, ETA, and the timeline of (seconds, rows done, tokens) it samples. Used by the
progress widget while the job runs and, as a static image (theme.static_html), in saved notebooks.
Every text that comes from outside (the job id, its status) is escaped.
"""

from __future__ import annotations

from html import escape

from mlx_nb.pictures.theme import BACKGROUND, FONT, MUTED

WIDTH, HEIGHT = 420, 120
BAR = "#3b82f6"
ERR = "#ef4444"


def summary(progress: dict, status: str = "") -> str:
    """One line: rows, errors, speed, ETA."""
    total, done = progress.get("total") or 0, progress.get("done") or 0
    parts = [f"{done}/{total} rows"]
    if progress.get("errors"):
        parts.append(f"{progress['errors']} errors")
    if progress.get("tokens_per_s"):
        parts.append(f"{progress['tokens_per_s']:.0f} tok/s")
    if progress.get("rows_per_s"):
        parts.append(f"{progress['rows_per_s']:.1f} rows/s")
    eta = progress.get("eta_s")
    if eta and status not in ("completed", "cancelled", "failed"):
        parts.append(f"ETA {eta:.0f} s")
    if status:
        parts.append(status)
    return " · ".join(parts)


def job_svg(progress: dict, status: str = "", title: str = "job") -> str:
    total, done = max(progress.get("total") or 0, 1), progress.get("done") or 0
    errors = progress.get("errors") or 0
    frac, err_frac = min(1.0, done / total), min(1.0, errors / total)
    bar_w = WIDTH - 20
    timeline = progress.get("timeline") or []
    plot = ""
    if len(timeline) >= 2:
        # tokens/s between samples, drawn as a line under the bar
        rates = []
        for (t0, _r0, k0), (t1, _r1, k1) in zip(timeline, timeline[1:]):
            if t1 > t0:
                rates.append((t1, (k1 - k0) / (t1 - t0)))
        if rates:
            top = max(r for _t, r in rates) or 1.0
            span = max(timeline[-1][0], 1e-6)
            pts = " ".join(f"{10 + bar_w * t / span:.1f},{HEIGHT - 10 - 50 * r / top:.1f}" for t, r in rates)
            plot = (f'<g class="throughput"><polyline points="{pts}" fill="none" stroke="{BAR}" stroke-width="1.5"/>'
                    f'<text x="10" y="{HEIGHT - 64}" font-size="10" fill="{MUTED}">tokens/s (peak {top:.0f})</text>'
                    '</g>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="mlx-job" width="{WIDTH}" height="{HEIGHT}" '
            f'style="color:{FONT};background:{BACKGROUND};font-family:sans-serif">'
            f'<text x="10" y="16" font-size="12" font-weight="bold" fill="currentColor">{escape(title)}</text>'
            f'<g class="bar"><rect x="10" y="24" width="{bar_w}" height="12" rx="3" fill="none" stroke="currentColor" '
            f'stroke-opacity=".3"/>'
            f'<rect x="10" y="24" width="{bar_w * frac:.1f}" height="12" rx="3" fill="{BAR}"/>'
            f'<rect x="10" y="24" width="{bar_w * err_frac:.1f}" height="12" rx="3" fill="{ERR}"/></g>'
            f'<text x="10" y="50" font-size="11" fill="currentColor">{escape(summary(progress, status))}</text>'
            f'{plot}</svg>')
