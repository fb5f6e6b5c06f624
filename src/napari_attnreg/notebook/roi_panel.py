"""Regions of interest: drawn or given labels, their statistics table and its CSV export.

On an image in memory the regions are a label image of the plane. On a slide (a file read on
demand, shown from a strided picture) they are polygons in the picture's pixels, rasterized
only where they are used: on the display grid to draw their edges, and inside their own boxes
on the pixels of the result on screen for the core's
:func:`~napari_attnreg.core.stats.roi.polygon_roi_table` (the rows of ``roi_table`` without a
label image of the whole result, which a level-0 slide's would need gigabytes for), whatever
level or resolution that result analysed.
"""

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
from napari_attnreg.core.run.lazy import MAX_UNTILED_PIXELS
from napari_attnreg.core.stats.roi import (
    PolygonTokens,
    polygon_roi_table,
    polygon_tokens,
    roi_table,
)
from napari_attnreg.io.geojson import full_resolution_factor
from napari_attnreg.notebook.regions import (
    add_region,
    as_labels,
    full_resolution,
    on_result,
    polygons_on_grid,
    polygons_to_labels,
)
from napari_attnreg.notebook.state import ExplorerState
from napari_attnreg.notebook.views import DRAW_MODES

#: Each draw button's tooltip when drawing is possible.
DRAW_TOOLTIPS = ("No drawing (zoom and pan)", "Drag a rectangle",
                 "Click the corners; close on the first point")
#: What the table says with no regions (on an image that takes them).
NO_ROIS = "No ROIs: draw one on the image, or pass roi=mask."
#: The same on a slide, whose regions are shapes on its picture (no full-size mask).
NO_SLIDE_ROIS = ("No ROIs: draw one on the slide, or call add_roi(rectangle=...) or "
                 "add_roi(polygon=...) in the picture's pixels.")
#: The Export button's tooltip (it never replaces a file: an earlier table stays).
EXPORT_TIP = ("Write the ROI table, with how it was computed. An existing file is never "
              "overwritten: type a new name for another table.")
#: Largest result (pixels) a slide's regions are given as a label image of (``roi_labels``);
#: the table needs none (:func:`~napari_attnreg.core.stats.roi.polygon_roi_table`).
MAX_ROI_PIXELS = MAX_UNTILED_PIXELS


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
                 on_export: Callable[[str], Any],
                 on_geojson: Callable[[str], Any] | None = None) -> None:
        super().__init__()
        self.labels: np.ndarray | None = None
        #: A slide's regions: ``(n, 2)`` (row, col) vertices in its picture's pixels.
        self.polygons: list[np.ndarray] = []
        #: Full-resolution (level 0) pixels per picture pixel on a slide; None in memory.
        self.slide_downsample: float | None = None
        # a slide's regions rasterized on the last result's pixels (as labels, and as tokens
        # for the table): every threshold move redraws the table, and rasterizing them again
        # each time would make the sliders lag
        self._rasterized: tuple[tuple, np.ndarray] | None = None
        self._tokens: tuple[tuple, list[np.ndarray], list[PolygonTokens]] | None = None
        #: Why this image takes no regions; None when it does (every image now: kept for a
        #: front end that cannot hold them).
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
                               tooltip=EXPORT_TIP,
                               layout=W.Layout(width="120px"))
        self.export.on_click(lambda _b: on_export(self.csv_path.value.strip() or "roi_table.csv"))
        self.geojson = W.Button(description="Export GeoJSON", icon="download",
                                tooltip="Write the regions as QuPath annotations (the image's "
                                        "pixels; a slide's full-resolution pixels), with "
                                        "their statistics, beside the CSV path (.geojson).",
                                layout=W.Layout(width="150px"))
        if on_geojson is not None:
            self.geojson.on_click(lambda _b: on_geojson(
                self.csv_path.value.strip() or "roi_table.csv"))
        self.clear = clear
        self.table = W.HTML().add_class("attnreg-roi-table")
        self.children = (self.draw, W.HBox([clear, self.geojson]),
                         W.HBox([self.csv_path, self.export]))

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
                            (self.export, EXPORT_TIP)):
            button.disabled = no_regions is not None
            button.tooltip = no_regions or tip

    def reset(self, slide_downsample: float | None) -> None:
        """No regions, for a new image: a slide's picture with ``slide_downsample``
        full-resolution pixels per pixel, or an image in memory (None)."""
        self.labels, self.polygons, self.slide_downsample = None, [], slide_downsample
        self._rasterized = self._tokens = None

    @property
    def on_slide(self) -> bool:
        return self.slide_downsample is not None

    @property
    def n_rois(self) -> int:
        if self.on_slide:
            return len(self.polygons)
        return 0 if self.labels is None else len(np.unique(self.labels[self.labels > 0]))

    def set_labels(self, roi: np.ndarray | None, shape: tuple[int, int] | None = None) -> None:
        """Replace the regions by a mask or label image of ``shape`` (None clears them)."""
        if roi is None:
            self.polygons = []
        self.labels = None if roi is None else as_labels(roi, shape)
        self._on_change()

    def add_polygon(self, vertices: np.ndarray) -> int:
        """Add a region of a slide, ``(n, 2)`` (row, col) in its picture's pixels; returns its
        label (drawn over earlier ones where they overlap)."""
        self.polygons.append(np.asarray(vertices, dtype=np.float64))
        self._on_change()
        return len(self.polygons)

    def on_grid(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray | None:
        """The regions' labels at the picture pixels ``rows × cols`` (the display grid)."""
        if self.on_slide:
            return polygons_on_grid(self.polygons, rows, cols) if self.polygons else None
        return None if self.labels is None else self.labels[rows[:, None], cols[None, :]]

    def labels_for(self, result: AttentionResult) -> np.ndarray:
        """A slide's regions as labels on ``result``'s pixels (the level or resolution it
        analysed, from the same corner as the picture); kept for the next call, so read it,
        do not change it. The table does not use it (:meth:`rows`).

        Raises
        ------
        ValueError
            A result too large to hold a label image of (say what run to make instead).
        """
        h, w = result.image_shape
        if h * w > MAX_ROI_PIXELS:
            raise ValueError(
                f"This result covers {h}×{w} pixels, too many for a label image of the "
                f"regions (at most {MAX_ROI_PIXELS:,} pixels). Use roi_table() for their "
                "statistics, or run at a coarser level or resolution (Advanced options: "
                "Slide level or Slide resolution) for their labels.")
        ratio = self.slide_downsample / full_resolution_factor(result)
        key = ((h, w), ratio, tuple(v.tobytes() for v in self.polygons))
        if self._rasterized is None or self._rasterized[0] != key:
            labels = polygons_to_labels([on_result(v, ratio) for v in self.polygons], (h, w))
            self._rasterized = (key, labels)
        return self._rasterized[1]

    def _slide_tokens(self, result: AttentionResult
                      ) -> tuple[list[np.ndarray], list[PolygonTokens]]:
        """A slide's regions in ``result``'s pixels and their tokens, kept for the next call
        on the same grid (a threshold move changes the rows, not the tokens)."""
        ratio = self.slide_downsample / full_resolution_factor(result)
        key = (tuple(result.image_shape), result.grid_shape, result.token_scale, ratio,
               tuple(v.tobytes() for v in self.polygons))
        if self._tokens is None or self._tokens[0] != key:
            polygons = [on_result(v, ratio) for v in self.polygons]
            self._tokens = (key, polygons, polygon_tokens(result, polygons))
        return self._tokens[1], self._tokens[2]

    def _slide_columns(self, result: AttentionResult, label: int) -> dict[str, Any]:
        """Where a slide's region lies in QuPath's frame (full-resolution pixels, the slide's
        top-left corner at 0) and the level and pixels per analysed pixel of its row."""
        xy = full_resolution(self.polygons[label - 1], self.slide_downsample)
        (x0, y0), (x1, y1) = xy.min(axis=0), xy.max(axis=0)
        return {"slide_level": result.metadata.get("slide_level"),
                "full_resolution_per_pixel": full_resolution_factor(result),
                "x_min": float(x0), "y_min": float(y0), "x_max": float(x1), "y_max": float(y1)}

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
        if self.on_slide:
            polygons, tokens = self._slide_tokens(result)
            return [{**row, **self._slide_columns(result, row["label"])}
                    for row in polygon_roi_table(result, polygons, tokens=tokens)]
        labels, (h, w) = self.labels, result.image_shape
        if labels.shape != (h, w) and labels.shape[0] >= h and labels.shape[1] >= w:
            # a tiled run of a file read on demand analyses whole patches: the last pixels
            # short of one are left out, and the result's pixels are the image's from (0, 0)
            labels = labels[:h, :w]
        return roi_table(result, labels)

    def show(self, result: AttentionResult | None) -> None:
        """The table of ``result`` (or why there is none) with human column headers."""
        if self.n_rois == 0:
            empty = NO_SLIDE_ROIS if self.on_slide else NO_ROIS
            self.table.value = f"<i>{html.escape(self.unavailable or empty)}</i>"
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
