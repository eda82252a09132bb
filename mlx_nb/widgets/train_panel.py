"""TrainPanel: a fine-tune's loss curve while it trains (training loss per step, validation loss,
checkpoints), its step, speed, ETA, memory and whether it is paused for a chat, and a Stop button.

`TrainPanel(job)` follows the job on a background thread until it ends (`job.wait()` in a notebook
shows one); its display bundle carries the current picture as a static image, so a saved notebook
shows how the fine-tune went without a kernel.
"""

from __future__ import annotations

import threading
from typing import Any

import ipywidgets as W

from mlx_nb.pictures.training import loss_svg, summary
from mlx_nb.widgets.base import PictureWidget, one_line

FINISHED = ("completed", "failed", "cancelled")


class TrainPanel(PictureWidget):
    """`TrainPanel(job)`: the TrainJob's losses, redrawn every `interval` seconds until it ends."""

    def __init__(self, job: Any, *, interval: float = 1.0, follow: bool = True, **kwargs):
        self.job = job
        self.stop_button = W.Button(description="Stop", icon="stop", button_style="warning",
                                    layout=W.Layout(width="auto"))
        self.stop_button.on_click(lambda _: self.stop())
        self._done = threading.Event()
        super().__init__([self.stop_button], **kwargs)
        self.refresh()
        if follow and not self.finished:
            threading.Thread(target=self._follow, args=(interval,), name="mlx-nb-train-panel", daemon=True).start()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def refresh(self) -> dict:
        """Redraw from the job's status and events; returns the status."""
        try:
            info = self.job.status()
            events = self.job.manager.events(self.job.id)
        except Exception as exc:  # noqa: BLE001 - a server out of reach is a note, not a traceback
            self.say(one_line(exc))
            return {}
        self.draw(info, events)
        return info

    def draw(self, info: dict, events: list[dict]) -> None:
        self.html.value = loss_svg(info, events, f"fine-tune {self.job.model}")
        self.say(summary(info))
        if info.get("status") in FINISHED:
            self.stop_button.disabled = True
            self._done.set()

    def stop(self) -> None:
        """Cancel the fine-tune (its checkpoints so far stay served)."""
        self.job.cancel()
        self.refresh()

    def _follow(self, interval: float) -> None:
        while not self._done.wait(interval):
            self.refresh()
