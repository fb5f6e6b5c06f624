"""The explorer's data API: its image, regions, result and files (what scripts call).

:class:`ExplorerApi` is the half of :class:`~.explorer.AttentionExplorer` that has no
controls of its own; the explorer assembles the panels it reads from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import traitlets as t

from napari_attnreg.core.results.display import with_thresholds
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.service import plane_fingerprint
from napari_attnreg.core.stats.presets import THRESHOLD_KEYS
from napari_attnreg.io.export import provenance, write_table_csv
from napari_attnreg.notebook.regions import as_labels, polygon_mask, rectangle_vertices
from napari_attnreg.notebook.state import ExplorerState


class ExplorerApi(ExplorerState):
    """Images, ROIs, results and files of the explorer (see :class:`AttentionExplorer`)."""

    # ---- result ---------------------------------------------------------------------------
    @property
    def result(self) -> AttentionResult | None:
        """The latest result, with the widget's current thresholds as its defaults."""
        if self._latest is None:
            return None
        return with_thresholds(self._results[self._latest], self.thresholds())

    @property
    def rendered(self) -> np.ndarray | None:
        """The ``(h, w, 3)`` uint8 image the view shows (image, overlay and outlines)."""
        return self.canvas.rendered if self._parts else None

    def cancel(self) -> None:
        """Stop the current run after the chunk being computed (what Cancel does)."""
        self.run_panel.cancel()

    async def wait(self) -> AttentionResult | None:
        """Await the background run (``await explorer.wait()`` in a notebook cell)."""
        task: asyncio.Task | None = self.run_panel.runner.task
        if task is not None and not task.done():
            await task
        return self.result

    def save(self, path: str | Path) -> Path:
        """Save :attr:`result` (with the widget's thresholds) as ``.npz``; returns the path."""
        result = self.result
        if result is None:
            raise ValueError("Nothing to save yet: press Run (or call run()) first.")
        return result.save(path)

    # ---- the plane on screen --------------------------------------------------------------
    def _current_result(self) -> AttentionResult | None:
        """The result computed for the plane on screen, if any."""
        return self._results.get(tuple(self.slice_index))

    def _show_result(self) -> None:
        result = self._current_result()
        self.canvas.set_result(result)
        self.summary_panel.show(result, self.thresholds())
        self._update_roi_table()

    def _update_roi_table(self) -> None:
        result = self._current_result()
        self.roi_panel.show(None if result is None else with_thresholds(result, self.thresholds()))

    @t.observe("slice_index")
    def _slice_changed(self, _change: dict) -> None:
        if not self._parts or self.image_panel.stack is None:
            return
        try:
            self.image_panel.show_plane()
        except ValueError as err:  # e.g. an empty (constant) plane: say so, keep the last view
            self._set_status(f"Plane {tuple(self.slice_index)}: {err}", "error")
            return
        if self._latest is not None and self._current_result() is None:
            self._set_status(f"The result is for plane {self._latest}; press Run to analyse "
                             f"plane {tuple(self.slice_index)}.", "info")
        self._show_result()

    # ---- live display ------------------------------------------------------------------
    @t.observe("overlay", "colormap", "opacity", "outline")
    def _display_changed(self, _change: dict) -> None:
        if self._parts:
            self.canvas.redraw()

    @t.observe("rule", *THRESHOLD_KEYS)
    def _thresholds_changed(self, _change: dict) -> None:
        if self._parts:
            self.canvas.redraw()
            self.summary_panel.show(self._current_result(), self.thresholds())
            self._update_roi_table()

    @t.observe("draw_mode")
    def _draw_mode_changed(self, change: dict) -> None:
        try:
            self.canvas.view.set_draw_mode(change["new"])
        except ValueError as err:
            self._set_status(str(err), "warning")

    # ---- image ----------------------------------------------------------------------------
    def set_image(self, image: Any, *, channel_axis: int | None = None,
                  rgb: bool | None = None) -> None:
        """Show another image. A bad one keeps the current image and says why in the status."""
        if self.run_panel.busy:
            self._set_status("Cannot change the image during a run; cancel it first.", "warning")
            return
        if self._load_image(image, channel_axis=channel_axis, rgb=rgb):
            self._show_result()

    def _load_image(self, image: Any, *, channel_axis: int | None, rgb: bool | None) -> bool:
        try:
            lead = self.image_panel.load(image, channel_axis=channel_axis, rgb=rgb)
        except ValueError as err:
            self.last_error = err
            self._set_status(str(err), "error")
            self.run_panel.set_ready(self.image_panel.stack is not None)  # a previous one stays
            return False
        self._generation += 1
        self.run_panel.set_ready(True)
        self._results, self._latest = {}, None
        self.roi_panel.labels = None
        self._set_status("nD image: choose the plane to analyse with the slider(s), then Run."
                         if lead else "Ready: press Run.", "info")
        return True

    def _fingerprint(self, plane_key: tuple[int, ...]) -> str:
        # taken at Run and at the end: the user's array may be edited in place meanwhile (the
        # stack never copies it), and then the result belongs to pixels no longer there
        return plane_fingerprint(self.image_panel.stack.read(plane_key)[0])

    def _plane_shape(self) -> tuple[int, int]:
        if self.image_panel.stack is None:
            raise ValueError("There is no usable image to draw regions on; give the explorer "
                             "an image first (explorer.set_image(...)).")
        return self.image_panel.plane_shape

    # ---- regions of interest --------------------------------------------------------------
    @property
    def roi_labels(self) -> np.ndarray | None:
        """Integer ROI labels on the current plane (0 = background), or None."""
        labels = self.roi_panel.labels
        return None if labels is None else labels.copy()

    def set_roi(self, roi: np.ndarray | None) -> None:
        """Replace the ROIs by a boolean mask or integer labels on the image plane (None clears)."""
        self.roi_panel.set_labels(roi, None if roi is None else self._plane_shape())

    def add_roi(self, *, rectangle: Sequence[float] | None = None,
                polygon: Sequence[Sequence[float]] | None = None,
                mask: np.ndarray | None = None) -> int:
        """Add one ROI and return its label.

        Parameters
        ----------
        rectangle : (row0, col0, row1, col1), optional
            Two opposite corners in pixel coordinates.
        polygon : sequence of (row, col), optional
        mask : (H, W) bool, optional
        """
        if sum(v is not None for v in (rectangle, polygon, mask)) != 1:
            raise ValueError("Give exactly one of rectangle=, polygon= or mask=.")
        shape = self._plane_shape()
        if rectangle is not None:
            region = polygon_mask(rectangle_vertices(*rectangle), shape)
        elif polygon is not None:
            region = polygon_mask(polygon, shape)
        else:
            region = as_labels(mask, shape) > 0
        return self.roi_panel.add(region)

    def clear_rois(self) -> None:
        self.set_roi(None)

    def roi_table(self) -> list[dict]:
        """Per-ROI statistics (``core.roi.roi_table``) at the widget's thresholds."""
        result = self._current_result()
        # the thresholds travel as the result's own (q_th and "no z mask" included)
        return self.roi_panel.rows(None if result is None
                                   else with_thresholds(result, self.thresholds()))

    def provenance(self) -> dict[str, Any]:
        """How the result on screen was made (:func:`napari_attnreg.io.export.provenance`):
        image, model and weights hash, preset, the thresholds set now, B, seed, version."""
        result = self._current_result()
        if result is None:
            raise ValueError("No result on this plane yet: run the analysis first.")
        data = self.image_panel.stack.data
        source = self._image_name or f"array {tuple(data.shape)} {data.dtype}"
        plane = f" plane {tuple(self.slice_index)}" if self.slice_index else ""
        return provenance(result.metadata, source=source + plane, thresholds=self.thresholds())

    def export_roi_csv(self, path: str | Path) -> Path:
        """Write :meth:`roi_table` to a CSV file, each row with the run's provenance."""
        rows = self.roi_table()
        if not rows:
            raise ValueError("No ROI statistics to export: run the analysis and draw or pass "
                             "ROIs.")
        return write_table_csv(path, rows, self.provenance())

    def _export_from_button(self, path: str) -> None:
        try:
            written = self.export_roi_csv(path)
        except (ValueError, OSError) as err:
            self._set_status(f"CSV not written: {err}", "error")
            return
        self._set_status(f"ROI table written to {written}", "success")

    def _on_drawn_region(self, vertices: np.ndarray) -> None:
        try:
            self.add_roi(polygon=vertices)
        except ValueError as err:
            self._set_status(str(err), "warning")

    def _rois_changed(self) -> None:
        self.canvas.redraw()
        self._update_roi_table()

    def close(self) -> None:
        for part in getattr(self, "_parts", ()):  # a failed construction has none yet
            part.close()
        self._parts = []
        super().close()
