"""Regions of interest: drawn or given labels, their statistics table and its CSV export."""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

import ipywidgets as W
import numpy as np

from napari_attnreg.core.results.display import (
    ROI_COLUMN_HELP,
    MapInfo,
    roi_header,
    roi_table_columns,
)
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.stats.roi import roi_table
from napari_attnreg.notebook.regions import add_region, as_labels
from napari_attnreg.notebook.state import ExplorerState
from napari_attnreg.notebook.views import DRAW_MODES

#: Each draw button's tooltip when drawing is possible.
DRAW_TOOLTIPS = ("No drawing (zoom and pan)", "Drag a rectangle",
                 "Click the corners; close on the first point")
#: What the table says with no regions (on an image that takes them).
NO_ROIS = "No ROIs: draw one on the image, or pass roi=mask."


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.4g}"
    return html.escape(str(value))


class RoiPanel(W.VBox):
    """Draw-mode buttons, Clear, CSV path and Export (side panel) and the table (below).

    Parameters
    ----------
    state : ExplorerState
    on_change : callable
        Called after the regions changed (the explorer redraws their outlines).
    on_export : callable
        Called with the CSV path typed in the box when Export is pressed.
    """

    def __init__(self, state: ExplorerState, on_change: Callable[[], Any],
                 on_export: Callable[[str], Any]) -> None:
        super().__init__()
        self.labels: np.ndarray | None = None
        #: Why this image takes no regions (a slide left on disk); None when it does.
        self.unavailable: str | None = None
        self._on_change = on_change
        self.draw = W.ToggleButtons(options=list(DRAW_MODES), description="draw ROI",
                                    tooltips=list(DRAW_TOOLTIPS),
                                    style={"description_width": "60px", "button_width": "84px"})
        W.link((state, "draw_mode"), (self.draw, "value"))
        clear = W.Button(description="Clear ROIs", tooltip="Remove every region.",
                         layout=W.Layout(width="120px"))
        clear.on_click(lambda _b: self.set_labels(None))
        self.csv_path = W.Text(value="roi_table.csv", tooltip="Where Export writes the table.",
                               layout=W.Layout(width="200px"))
        self.export = W.Button(description="Export CSV", icon="download",
                               tooltip="Write the ROI table, with how it was computed.",
                               layout=W.Layout(width="120px"))
        self.export.on_click(lambda _b: on_export(self.csv_path.value.strip() or "roi_table.csv"))
        self.clear = clear
        self.table = W.HTML().add_class("attnreg-roi-table")
        self.children = (self.draw, W.HBox([clear]), W.HBox([self.csv_path, self.export]))

    def allow(self, can_draw: bool, why_not: str | None, no_regions: str | None) -> None:
        """Whether the draw buttons work (``why_not`` says why they do not) and whether the
        image takes regions at all (``no_regions``: why not, e.g. a slide left on disk).

        Each button carries its own tooltip, which the browser shows instead of the group's,
        so a disabled button says why on every button; without regions, Clear and Export are
        off too and the table says why, rather than inviting a drawing that cannot be made.
        """
        self.unavailable = no_regions
        reason = no_regions or (None if can_draw else why_not)
        self.draw.disabled = reason is not None
        self.draw.tooltip = reason
        self.draw.tooltips = [reason] * len(DRAW_TOOLTIPS) if reason else list(DRAW_TOOLTIPS)
        for button, tip in ((self.clear, "Remove every region."),
                            (self.export, "Write the ROI table, with how it was computed.")):
            button.disabled = no_regions is not None
            button.tooltip = no_regions or tip

    @property
    def n_rois(self) -> int:
        return 0 if self.labels is None else len(np.unique(self.labels[self.labels > 0]))

    def set_labels(self, roi: np.ndarray | None, shape: tuple[int, int] | None = None) -> None:
        """Replace the regions by a mask or label image of ``shape`` (None clears them)."""
        self.labels = None if roi is None else as_labels(roi, shape)
        self._on_change()

    def add(self, region: np.ndarray) -> int:
        """Paint a boolean region as the next label; returns the label."""
        if self.labels is None:
            self.labels = np.zeros(region.shape, dtype=np.int32)
        label = add_region(self.labels, region)
        self._on_change()
        return label

    def rows(self, result: AttentionResult | None) -> list[dict]:
        """Per-ROI statistics of a result (carrying the thresholds to use); [] without one."""
        if result is None or self.n_rois == 0:
            return []
        labels, (h, w) = self.labels, result.image_shape
        if labels.shape != (h, w) and labels.shape[0] >= h and labels.shape[1] >= w:
            # a tiled run of a file read on demand analyses whole patches: the last pixels
            # short of one are left out, and the result's pixels are the image's from (0, 0)
            labels = labels[:h, :w]
        return roi_table(result, labels)

    def show(self, result: AttentionResult | None) -> None:
        """The table of ``result`` (or why there is none) with human column headers."""
        if self.n_rois == 0:
            self.table.value = f"<i>{html.escape(self.unavailable or NO_ROIS)}</i>"
            return
        try:
            rows = self.rows(result)
        except ValueError as err:
            self.table.value = f"<i>{html.escape(str(err))}</i>"
            return
        if not rows:
            self.table.value = (f"<i>{self.n_rois} ROI(s); run the analysis to see their "
                                "statistics.</i>")
            return
        columns = roi_table_columns()  # as the dock's: evidence and enrichment first
        head = "".join(
            f"<th title='{html.escape(ROI_COLUMN_HELP.get(c, ''))}'>"
            f"{html.escape(roi_header(c, result.preset, MapInfo.of(result)))}</th>"
            for c in columns)
        body = "".join("<tr>" + "".join(f"<td>{_fmt(row[c])}</td>" for c in columns)
                       + "</tr>" for row in rows)
        self.table.value = (
            "<table class='attnreg-roi' style='border-collapse:collapse;font-size:90%'>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
