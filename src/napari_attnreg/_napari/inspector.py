"""Patch inspector: one patch's numbers and the null it was compared with, under the mouse.

Hovering over the image shows the patch under the cursor (while 'Follow the mouse' is on);
a click pins that patch (the panel keeps it while the mouse moves on) until 'Follow the
mouse' is ticked again. The text is the core's :func:`~napari_attnreg.core.results.
patch_report.patch_report` of the selected result (its own thresholds), one token lookup per
position; for the directional and paper presets a small histogram shows the pooled null z
with the patch's z marked.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import numpy as np
from qtpy.QtCore import QRectF, Qt, Signal
from qtpy.QtGui import QColor, QPainter, QPen
from qtpy.QtWidgets import QCheckBox, QGroupBox, QLabel, QVBoxLayout, QWidget
from superqt.utils import qthrottled

from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg._napari.slice_cue import plane_text
from napari_attnreg._napari.status import WARNING_COLOR
from napari_attnreg.core.results.display import SIGNIFICANT_COLOR
from napari_attnreg.core.results.patch_report import PatchReport, patch_report

#: Hover updates at most this often (ms): a report is cheap, a repaint of the dock is not.
HOVER_MS = 60
#: A press that moves the cursor less than this (canvas pixels) before release is a click.
CLICK_SLOP_PX = 4
HINT = "Hover over the image to inspect a patch; click to pin it."


class NullHistogram(QWidget):
    """Bars of the pooled null z and a line at the patch's z (no axes: the text has numbers)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.counts: np.ndarray | None = None
        self.edges: np.ndarray | None = None
        self.value: float | None = None
        self.setFixedHeight(46)
        self.setToolTip("Pooled null z of every null image and patch (grey) and this patch's "
                        "z (line).")

    def set_data(self, histogram: tuple[np.ndarray, np.ndarray] | None,
                 value: float | None) -> None:
        self.counts, self.edges = histogram if histogram is not None else (None, None)
        self.value = value
        self.setVisible(histogram is not None)
        self.update()

    def paintEvent(self, event: Any) -> None:
        if self.counts is None or self.edges is None or not self.counts.size:
            return
        painter = QPainter(self)
        width, height = self.width(), self.height() - 2
        lo, hi = float(self.edges[0]), float(self.edges[-1])
        if self.value is not None:  # the patch may lie outside the null's range
            lo, hi = min(lo, self.value), max(hi, self.value)
        span = (hi - lo) or 1.0
        top = float(self.counts.max()) or 1.0
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(150, 150, 150))
        for count, left, right in zip(self.counts, self.edges[:-1], self.edges[1:]):
            x0 = (float(left) - lo) / span * width
            x1 = (float(right) - lo) / span * width
            h = float(count) / top * height
            painter.drawRect(QRectF(x0, height - h, max(x1 - x0, 1.0), h))
        if self.value is not None:
            x = (self.value - lo) / span * width
            painter.setPen(QPen(QColor(WARNING_COLOR), 2))
            painter.drawLine(int(round(x)), 0, int(round(x)), height)
        painter.end()


def locate(record: RunRecord, source: Any,
           world: Any) -> tuple[tuple[int, ...], float, float] | None:
    """(plane, row, col) under world position ``world`` (None: off the image): ``row, col``
    are pixels of the image the run analysed, which for a slide read at another level than
    its layer shows are not the layer's (:class:`~.geometry.AnalysedGrid`)."""
    data = np.asarray(source.world_to_data(np.asarray(world, dtype=float)), dtype=float)
    geometry = record.geometry
    if data.size < geometry.ndim:
        return None
    plane = tuple(int(np.rint(data[a])) for a in geometry.stack_axes)
    if any(not 0 <= i < geometry.shape[a] for i, a in zip(plane, geometry.stack_axes)):
        return None
    row, col = float(data[-2]), float(data[-1])
    if record.grid is not None:  # analysed pixel i is centred on layer pixel f·i + (f − 1)/2
        (fy, fx) = record.grid.factor
        row, col = (row - (fy - 1) / 2) / fy, (col - (fx - 1) / 2) / fx
    return plane, row, col


class PatchInspector(QGroupBox):
    """The 'Patch inspector' panel of the dock.

    Parameters
    ----------
    viewer : napari.Viewer
    current_record : callable
        The :class:`RunRecord` of the dock's selected result (or None).
    source_of : callable
        ``source_of(record)``: the record's source layer in the viewer (or None).

    Signals
    -------
    inspected(report) : a patch was shown (a :class:`PatchReport`, or None).
    """

    inspected = Signal(object)

    def __init__(self, viewer: Any, current_record: Callable[[], RunRecord | None],
                 source_of: Callable[[RunRecord], Any], parent: QWidget | None = None) -> None:
        super().__init__("Patch inspector", parent)
        self._viewer = viewer
        self._current_record = current_record
        self._source_of = source_of
        self.report: PatchReport | None = None
        self._world: tuple[float, ...] | None = None  # where the shown patch was asked for
        self.follow_check = QCheckBox("Follow the mouse")
        self.follow_check.setChecked(True)
        self.follow_check.setToolTip("Show the patch under the cursor; a click on the image pins "
                                     "a patch (this box is then unticked).")
        self.label = QLabel(HINT)
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.histogram = NullHistogram()
        self.histogram.setVisible(False)
        layout = QVBoxLayout(self)
        layout.addWidget(self.follow_check)
        layout.addWidget(self.label)
        layout.addWidget(self.histogram)
        viewer.mouse_move_callbacks.append(self._on_move)
        viewer.mouse_drag_callbacks.append(self._on_press)

    def disconnect_viewer(self) -> None:
        """Stop following the mouse (the dock was removed)."""
        for callbacks, callback in ((self._viewer.mouse_move_callbacks, self._on_move),
                                    (self._viewer.mouse_drag_callbacks, self._on_press)):
            if callback in callbacks:
                callbacks.remove(callback)
        self._hover.cancel()

    # ---- what is shown ------------------------------------------------------------------
    def inspect_world(self, world: Any) -> PatchReport | None:
        """Show the patch of the selected result under world position ``world``."""
        self._world = tuple(float(v) for v in world)
        record = self._current_record()
        source = None if record is None else self._source_of(record)
        if record is None or source is None:
            return self._show(None, "Run the analysis on the chosen image to inspect patches.")
        where = locate(record, source, world)
        if where is None:
            return self._show(None, HINT)
        plane, row, col = where
        if plane not in record.results:
            return self._show(None, f"{plane_text(plane, record.geometry)}: no result yet "
                                    "(see 'Compute remaining slices').")
        report = patch_report(record.shown(plane), row, col)
        return self._show(report, HINT)

    def pin(self, world: Any) -> PatchReport | None:
        """Show the patch at ``world`` and keep it while the mouse moves on."""
        self.follow_check.setChecked(False)
        return self.inspect_world(world)

    def refresh(self) -> None:
        """Show the same position again (thresholds moved, another result was selected)."""
        if self._world is not None:
            self.inspect_world(self._world)

    def _show(self, report: PatchReport | None, hint: str) -> PatchReport | None:
        self.report = report
        self.label.setText(hint if report is None else report_html(report))
        self.histogram.set_data(None if report is None else report.null_histogram,
                                None if report is None else report.statistic)
        self.inspected.emit(report)
        return report

    # ---- mouse ---------------------------------------------------------------------------
    def _on_move(self, viewer: Any, event: Any) -> None:
        if self.follow_check.isChecked():
            self._hover(tuple(event.position))

    @qthrottled(timeout=HOVER_MS)
    def _hover(self, world: tuple[float, ...]) -> None:
        if self.follow_check.isChecked():  # not a trailing call after a click pinned a patch
            self.inspect_world(world)

    def _on_press(self, viewer: Any, event: Any):
        if getattr(event, "button", 1) != 1:
            return
        world, start = tuple(event.position), np.asarray(event.pos, dtype=float)
        yield
        while event.type == "mouse_move":  # a drag (pan, paint, draw) is not a click
            yield
        if np.hypot(*(np.asarray(event.pos, dtype=float) - start)) < CLICK_SLOP_PX:
            self.pin(world)


def report_html(report: PatchReport) -> str:
    """The report as the panel's rich text."""
    color = SIGNIFICANT_COLOR if report.significant else "#aaaaaa"
    head = html.escape(report.headline)
    values = "".join(f"<tr><td>{html.escape(name)}&nbsp;</td><td><b>{html.escape(value)}</b>"
                     "</td></tr>" for name, value in report.values)
    lines = "".join(f"<li>{html.escape(line)}</li>" for line in report.null_lines)
    return (f"<span style='color:{color}'><b>{head}</b></span>"
            f"<table cellspacing='0'>{values}</table>"
            f"<small>Compared with the null:<ul style='margin-left:-20px'>{lines}</ul></small>")
