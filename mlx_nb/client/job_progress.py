"""How a waiting job shows its progress: a live widget in a notebook, a tqdm bar elsewhere.

The widget (rows done of total, errors, tokens/s, ETA, the throughput plot, a Stop button that
cancels the job) is replaced by a static picture of the final state when the wait ends, so the
saved notebook shows how the job went without a kernel.
"""

from __future__ import annotations

import sys
from typing import Any, Callable


def _in_kernel() -> bool:
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def progress_display(progress: Any, job) -> Callable:
    """`show(batch, final=False)` for a job's wait: silent for progress=False, the caller's function
    for a callable, else a widget in a kernel and a tqdm bar outside."""
    if progress is False or progress is None:
        return lambda batch, final=False: None
    if callable(progress):
        return lambda batch, final=False: progress({"status": batch.get("status"), **(batch.get("progress") or {})})
    if _in_kernel():
        return _widget(job)
    return _bar(job)


def _bar(job) -> Callable:
    from tqdm.auto import tqdm

    bar = None

    def show(batch: dict, final: bool = False) -> None:
        nonlocal bar
        p = batch.get("progress") or {}
        if bar is None:
            bar = tqdm(total=p.get("total") or 0, desc=f"job {job.id[-8:]}", unit="row", file=sys.stderr,
                       dynamic_ncols=True)
        bar.total = p.get("total") or bar.total
        bar.n = p.get("done") or 0
        bar.set_postfix_str(f"{p.get('errors', 0)} errors, {p.get('tokens_per_s', 0):.0f} tok/s", refresh=False)
        bar.refresh()
        if final:
            bar.close()

    return show


def _widget(job) -> Callable:
    import ipywidgets as w
    from IPython.display import HTML, display

    from mlx_nb.pictures.job import job_svg, summary
    from mlx_nb.pictures.theme import static_html

    bar = w.IntProgress(value=0, min=0, max=1, description="rows", layout=w.Layout(width="50%"))
    label = w.HTML()
    picture = w.HTML()
    stop = w.Button(description="Stop", button_style="warning", icon="stop")
    stop.on_click(lambda _b: job.cancel())
    box = w.VBox([w.HBox([bar, stop]), label, picture])
    handle = display(box, display_id=True)

    def show(batch: dict, final: bool = False) -> None:
        p, status = batch.get("progress") or {}, batch.get("status") or ""
        bar.max, bar.value = max(1, p.get("total") or 0), p.get("done") or 0
        label.value = f"<code>{_esc(summary(p, status))}</code>"
        picture.value = job_svg(p, status, f"job {job.id}")
        if final:
            box.close()
            html = static_html(job_svg(p, status, f"job {job.id}"), summary(p, status), alt="job progress")
            if handle is not None:
                handle.update(HTML(html))

    return show


def _esc(text: str) -> str:
    from html import escape

    return escape(text)
