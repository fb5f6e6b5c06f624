"""The view: the plane on screen with the chosen map, significant outlines and ROI edges.

Everything is composited into one uint8 array (:attr:`OverlayCanvas.rendered`) and sent to
the view as is, so what a user sees can be checked on pixels. The result it is given applies
its own thresholds (the session's ``shown()``), so the overlay and outline never mix one
result with another's thresholds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from napari_attnreg.core.results.display import (
    describe_pixel,
    map_display,
    pixel_text,
    tissue_tokens,
)
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.notebook import render
from napari_attnreg.notebook.display_panel import DisplayPanel
from napari_attnreg.notebook.image_panel import ImagePanel
from napari_attnreg.notebook.state import ExplorerState
from napari_attnreg.notebook.views import ImageView, MplView, ipympl_available

VIEW_KINDS = ("auto", "ipympl", "image")


def make_view(kind: str, width: int) -> ImageView | MplView:
    """``"ipympl"`` draws ROIs with the mouse; ``"image"`` is a PNG; ``"auto"``: ipympl if any."""
    if kind not in VIEW_KINDS:
        raise ValueError(f"view must be 'auto', 'ipympl' or 'image', got {kind!r}.")
    use_mpl = kind == "ipympl" or (kind == "auto" and ipympl_available())
    return MplView(width) if use_mpl else ImageView(width)


class OverlayCanvas:
    """Composites the image panel's plane with a result, as the display panel says."""

    def __init__(self, state: ExplorerState, view: ImageView | MplView, image: ImagePanel,
                 display: DisplayPanel) -> None:
        self.state, self.view, self.image, self.display = state, view, image, display
        self.result: AttentionResult | None = None
        self.token_index: np.ndarray | None = None  # display pixel → flat token id
        self.rendered: np.ndarray | None = None
        #: ``(rows, cols) -> labels`` of the regions at those picture pixels (None: none).
        self.roi_labels: Callable[[np.ndarray, np.ndarray], np.ndarray | None] = \
            lambda rows, cols: None
        view.describe = self.describe_pixel

    def set_result(self, result: AttentionResult | None) -> None:
        """The result for the plane on screen, applying its thresholds (None: image only),
        then redraw."""
        self.result = result
        self.token_index = None
        if result is not None:
            gh, gw = result.grid_shape
            ids = np.arange(gh * gw, dtype=np.int64).reshape(gh, gw)
            # a result of another slide level than the picture lies on it by its own grid
            self.token_index = self.image.grid_for(result).sample_tokens(result, ids)
        self.redraw()

    def line_width(self) -> int:
        # about 1 px of the ~560 px view whatever the image size
        return max(1, round(max(self.image.grid.shape) / 500))

    def overlay_values(self, result: AttentionResult) -> tuple[np.ndarray | None, float, float]:
        """Token values of the chosen overlay and their colour range (core.display)."""
        if self.state.overlay == "none":
            return None, 0.0, 1.0
        view = map_display(self.state.overlay, result)  # a signed map: centred at 0
        values = view.values(result, result.thresholds)
        vmin, vmax = view.limits(result)
        if self.state.overlay == "regularized":
            # removed tokens are transparent, so the image shows where attention was not real
            values = np.where(values != 0, values, np.nan)
        tested = tissue_tokens(result)
        if tested is not None:  # glass the tissue mask left out was never run: as the figure,
            values = np.where(tested, values, np.nan)  # the image shows through, not a 0
        return values, vmin, vmax

    def redraw(self) -> None:
        if self.image.source is None:
            return
        lut, result = self.display.lut(self.result), self.result
        values = outline = None
        vmin, vmax = 0.0, 1.0
        if result is not None and self.token_index is not None:
            token_values, vmin, vmax = self.overlay_values(result)
            if token_values is not None:
                values = np.asarray(token_values, dtype=np.float64).ravel()[self.token_index]
            if self.state.outline:
                sig = result.significant()
                outline = render.boundary(sig.ravel()[self.token_index], self.line_width())
        tissue = None if result is None else self.tissue_edges(result)
        labels = self.roi_labels(self.image.grid.rows, self.image.grid.cols)
        roi_edges = None
        if labels is not None and labels.any():
            roi_edges = render.label_boundaries(labels, self.line_width())
        diverging = (values is not None and result is not None
                     and map_display(self.state.overlay, result).diverging)
        self.rendered = render.composite(self.image.base, values, lut=lut, vmin=vmin, vmax=vmax,
                                         opacity=self.state.opacity, outline=outline,
                                         roi_edges=roi_edges, centre=0.0 if diverging else None,
                                         tissue_edges=tissue)
        self.view.show(self.rendered, self.image.plane_shape)
        self.display.show_scale(lut, vmin, vmax, result if values is not None else None)

    def tissue_edges(self, result: AttentionResult) -> np.ndarray | None:
        """The edge of the tissue mask a tiled run used, on the display grid (None without
        one): with the default overlay, transparent wherever nothing is significant, it is
        the only sign of what the run tested; napari shows the mask as a layer.

        The mask covers the whole picture (``core.run.tissue``: as any mask file, whatever
        level or resolution was read), so its pixels are placed by the picture's frame.
        """
        mask = result.null_summary.get("tissue_mask")
        if mask is None:
            return None
        mask = np.asarray(mask, dtype=bool)
        if mask.ndim != 2 or mask.all() or not mask.any():
            return None
        grid, (h0, w0) = self.image.grid, self.image.grid.image_shape
        mh, mw = mask.shape
        rows = np.minimum(((grid.rows + 0.5) * mh / h0).astype(np.int64), mh - 1)
        cols = np.minimum(((grid.cols + 0.5) * mw / w0).astype(np.int64), mw - 1)
        return render.boundary(mask[rows[:, None], cols[None, :]], self.line_width(),
                               frame=False)

    def describe_pixel(self, row: float, col: float) -> str:
        """Cursor readout: pixel, and the statistics of the patch under it (core.display's
        lookup, as napari and the tests read it)."""
        if self.result is not None:
            return describe_pixel(self.result, *self.image.on_result(self.result, row, col))
        r, c = round(row), round(col)
        h0, w0 = self.image.plane_shape
        if not (0 <= r < h0 and 0 <= c < w0):
            return ""
        # a slide's picture is a coarser level: say where it is at full resolution, as
        # with a result
        return pixel_text(r, c, float(getattr(self.image.source, "downsample", 1.0)))
