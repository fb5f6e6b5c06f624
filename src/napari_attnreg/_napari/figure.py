"""'Export figure…': the canvas as a PNG with a scale bar and the visible maps' titled colorbars.

What the analyst sees is what the figure shows (layers, contrast, zoom), rendered at a higher
resolution; the scale bar is switched on for the shot only (with its box, readable on any
image) and left as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qtpy.QtWidgets import QPushButton, QWidget

from napari_attnreg._napari.dialogs import save_through_dialog
from napari_attnreg._napari.slice_cue import canvas_overlay

#: Resolution factor of the figure over the canvas on screen.
FIGURE_SCALE = 2.0


def export_figure(viewer: Any, path: str | Path, *, scale: float = FIGURE_SCALE) -> Path:
    """Write the canvas to ``path`` (PNG) with a scale bar; returns the path written.

    Colorbars of visible maps carry their titles (their layer names, see
    :func:`.layers.title_colorbar`); the viewer's scale bar is restored afterwards.
    """
    import imageio.v3 as iio

    path = Path(path)
    if path.suffix.lower() != ".png":
        path = path.with_name(path.name + ".png")
    bar = canvas_overlay(viewer, "scale_bar")
    before = (bar.visible, bar.box)
    bar.visible, bar.box = True, True
    try:
        shot = viewer.screenshot(canvas_only=True, scale=scale, flash=False)
    finally:
        bar.visible, bar.box = before
    iio.imwrite(path, shot)
    return path


class FigureButton(QPushButton):
    """'Export figure…' (a file dialog, then :func:`export_figure`)."""

    def __init__(self, viewer: Any, parent: QWidget | None = None) -> None:
        super().__init__("Export figure…", parent)
        self._viewer = viewer
        self.setToolTip(f"Save the canvas as it is now as a PNG at {FIGURE_SCALE:g}× resolution, "
                        "with a scale bar and the visible maps' titled colorbars.")
        self.clicked.connect(self._on_clicked)

    def _on_clicked(self) -> None:
        save_through_dialog(self, "Export figure", "attention_figure.png", "PNG (*.png)",
                            lambda path: export_figure(self._viewer, path),
                            lambda written: f"Figure written to {written}")
