"""Shows the session's selected result: the overlay, the summary and the ROI table.

Everything here follows the session's events, so the view always shows the selected result
(the plane on screen) with *its* thresholds, whoever changed them: a slider, code, or a run.
"""

from __future__ import annotations

from typing import Any

from napari_attnreg.notebook.canvas import OverlayCanvas
from napari_attnreg.notebook.roi_panel import RoiPanel
from napari_attnreg.notebook.state import ExplorerState
from napari_attnreg.notebook.summary_panel import SummaryPanel
from napari_attnreg.session import Session

#: Display traits that only re-render (no result or count changes).
LOOK_TRAITS = ("overlay", "colormap", "opacity", "outline")


class ResultDisplay:
    """Redraws the canvas, summary and ROI table when the selected result or its thresholds
    change, and the canvas alone when the look (overlay, colormap, ...) changes."""

    def __init__(self, session: Session, state: ExplorerState, canvas: OverlayCanvas,
                 summary: SummaryPanel, roi_panel: RoiPanel) -> None:
        self.session, self.canvas, self.summary, self.roi_panel = session, canvas, summary, roi_panel
        events = session.events
        events.selection_changed.connect(self.show)
        events.thresholds_changed.connect(self._on_result_changed)
        events.result_added.connect(self._on_result_changed)
        state.observe(lambda _change: canvas.redraw(), names=list(LOOK_TRAITS))

    def _on_result_changed(self, key: Any, *_: Any) -> None:
        if key == self.session.selected_key:  # another image's result is not on screen
            self.show()

    def show(self, *_: Any) -> None:
        """The selected result (None: the image alone) with its own thresholds."""
        shown = self.session.shown()
        self.canvas.set_result(shown)
        self.summary.show(shown)
        self.update_roi_table()

    def update_roi_table(self) -> None:
        self.roi_panel.show(self.session.shown())
