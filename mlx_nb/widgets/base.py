"""What the picture widgets share: a toolbar with a one-line note, the SVG, a static copy of it in
the display bundle, and closing cleanly (also when their cell runs again).

The display bundle carries `text/html` (the current SVG as an image) beside the widget view:
JupyterLab shows the live widget, while places without a widget manager or trust (GitHub,
nbviewer, an untrusted notebook, an nbconvert HTML export) show the picture instead of
`BatchVisualizer(children=...)`.
"""

from __future__ import annotations

import ipywidgets as W

from mlx_nb.widgets.lifecycle import adopt
from mlx_nb.pictures.theme import static_html


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class PictureWidget(W.VBox):
    """A VBox of [toolbar (buttons + note), picture]; subclasses draw into `self.html`."""

    def __init__(self, buttons: list, **kwargs):
        self.html = W.HTML(layout=W.Layout(overflow="auto"))
        self.note = W.Label("", layout=W.Layout(flex="1 1 auto", min_width="0"))
        toolbar = W.HBox([*buttons, self.note], layout=W.Layout(align_items="center", flex_flow="row wrap"))
        super().__init__([toolbar, self.html], **kwargs)
        adopt(self)

    @property
    def svg(self) -> str:
        return self.html.value

    def say(self, message: str) -> None:
        """One line in the toolbar (errors, loading progress, what is shown)."""
        self.note.value = message

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs)
        if data is not None and self.svg:
            data["text/html"] = static_html(self.svg, self.note.value, alt=type(self).__name__)
        return data
