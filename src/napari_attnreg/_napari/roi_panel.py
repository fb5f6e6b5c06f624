"""The ROI panel: ROI layer chooser, per-ROI statistics table and CSV export with provenance.

The rows are the core's :func:`~napari_attnreg.core.stats.roi.roi_table` (see :mod:`.roi_geometry`);
this panel only shows them, flags what a reader could misread, and writes them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from qtpy.QtCore import Signal
from qtpy.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)
from superqt.utils import qdebounced

from napari_attnreg._napari.option_controls import choose_item
from napari_attnreg._napari.roi_export import small_rois, write_roi_csv
from napari_attnreg._napari.roi_geometry import record_roi_rows
from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg.core.results.display import ROI_COLUMN_HELP, ROI_COLUMNS, rule_text
from napari_attnreg.core.stats.roi import ROI_COLUMNS as ROW_KEYS


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, float):
        if np.isnan(value):
            return "–"
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.3e}"
    return str(value)


class RoiPanel(QWidget):
    """ROI layer chooser, the per-ROI table and CSV export.

    Parameters
    ----------
    viewer : napari.Viewer
    current_record : callable
        Returns the :class:`RunRecord` of the widget's selected image (or None).
    """

    rows_changed = Signal(list)

    def __init__(self, viewer: Any, current_record: Callable[[], RunRecord | None],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._viewer = viewer
        self._current_record = current_record
        self._watched: Any = None
        self._record: RunRecord | None = None
        self.rows: list[dict] = []

        self.layer_combo = QComboBox()
        self.layer_combo.setToolTip("A Shapes or Labels layer; each shape / label id is one ROI.")
        self.export_button = QPushButton("Export CSV…")
        self.export_button.setToolTip("Save the table as CSV, with the image, model, preset, "
                                      "thresholds, B, seed and package version on top.")
        self.export_button.setEnabled(False)
        self.status = QLabel("Draw Shapes or paint Labels, then choose the layer here.")
        self.status.setWordWrap(True)
        self.table = QTableWidget(0, 0)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)  # the ROI id column names each row
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.setMinimumHeight(110)
        self.table.setToolTip("One row per ROI: per-region statistics against the significant "
                              "patches (hover a column header for its meaning).")

        top = QHBoxLayout()
        top.addWidget(QLabel("ROI layer"))
        top.addWidget(self.layer_combo, 1)
        top.addWidget(self.export_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.table)
        layout.addWidget(self.status)

        self.layer_combo.currentIndexChanged.connect(self._on_layer_chosen)
        self.export_button.clicked.connect(self._on_export_clicked)
        for ev in (viewer.layers.events.inserted, viewer.layers.events.removed,
                   viewer.layers.events.renamed):
            ev.connect(self._refresh_choices)
        self._refresh_choices()

    def disconnect_viewer(self) -> None:
        """Stop following the viewer (the dock was removed)."""
        for ev in (self._viewer.layers.events.inserted, self._viewer.layers.events.removed,
                   self._viewer.layers.events.renamed):
            ev.disconnect(self._refresh_choices)
        self._watch(None)

    # ---- ROI layer list ---------------------------------------------------------------
    def roi_layers(self) -> list[Any]:
        from napari.layers import Labels, Shapes

        return [layer for layer in self._viewer.layers if isinstance(layer, (Shapes, Labels))]

    def _refresh_choices(self, event: Any = None) -> None:
        current = self.current_layer()
        layers = self.roi_layers()
        self.layer_combo.blockSignals(True)
        self.layer_combo.clear()
        self.layer_combo.addItem("(none)", None)
        for layer in layers:
            self.layer_combo.addItem(layer.name, layer)
        if current in layers:
            self.layer_combo.setCurrentIndex(layers.index(current) + 1)
        self.layer_combo.blockSignals(False)
        if self.current_layer() is not current:
            self._on_layer_chosen()

    def current_layer(self) -> Any | None:
        return self.layer_combo.currentData() if self.layer_combo.count() else None

    def set_layer(self, layer: Any) -> None:
        """Choose the ROI layer programmatically."""
        if choose_item(self.layer_combo, layer):
            return
        raise ValueError(f"{getattr(layer, 'name', layer)!r} is not a Shapes/Labels layer of the "
                         "viewer.")

    def _on_layer_chosen(self, *_: Any) -> None:
        self._watch(self.current_layer())
        self.update_table()

    def _watch(self, layer: Any) -> None:
        if self._watched is not None:
            for name in ("data", "paint"):
                emitter = getattr(self._watched.events, name, None)
                if emitter is not None:
                    emitter.disconnect(self._schedule)
        self._watched = layer
        if layer is not None:
            for name in ("data", "paint"):
                emitter = getattr(layer.events, name, None)
                if emitter is not None:
                    emitter.connect(self._schedule)

    @qdebounced(timeout=150)
    def _schedule(self, event: Any = None) -> None:
        # editing a shape fires many events; one table update per pause is plenty
        self.update_table()

    # ---- table -------------------------------------------------------------------------
    def update_table(self) -> None:
        """Recompute the rows from the current record, ROI layer and thresholds."""
        record = self._record = self._current_record()
        layer = self.current_layer()
        rows: list[dict] = []
        if record is None:
            self.status.setText("Run the analysis on the image first.")
        elif layer is None:
            self.status.setText("Choose a Shapes or Labels layer with ROIs.")
        else:
            try:
                rows = record_roi_rows(record, layer)
            except ValueError as err:
                self.status.setText(str(err))
            else:
                text = (f"{len(rows)} ROI row(s) · significant: {rule_text(record.thresholds)} · "
                        "token in ROI when ≥50% covered")
                small = small_rois(rows, record)
                if small:
                    sy, sx = record.any_result.token_scale
                    text += (f"<br><span style='color:#e0a030'>⚠ ROI {', '.join(small)} "
                             f"smaller than one token ({sy:.3g}×{sx:.3g} px): its statistics "
                             "rest on the single token it overlaps most.</span>")
                self.status.setText(text)
        self._show(rows)

    def _show(self, rows: list[dict]) -> None:
        self.rows = rows
        columns = (["plane"] if rows and "plane" in rows[0] else []) + list(ROW_KEYS)
        self.table.clear()
        self.table.setColumnCount(len(columns))
        self.table.setRowCount(len(rows))
        for c, key in enumerate(columns):  # headers and their meaning from core.display
            header = QTableWidgetItem(ROI_COLUMNS.get(key, key))
            header.setToolTip(ROI_COLUMN_HELP.get(key, ""))
            self.table.setHorizontalHeaderItem(c, header)
        for r, row in enumerate(rows):
            for c, key in enumerate(columns):
                self.table.setItem(r, c, QTableWidgetItem(_fmt(row.get(key))))
        self.export_button.setEnabled(bool(rows))
        self.rows_changed.emit(rows)

    def export_csv(self, path: str | Path) -> Path:
        """Write the current rows, with what made them (``#`` lines) on top."""
        if not self.rows:
            raise ValueError("There are no ROI rows to export; choose an ROI layer with ROIs.")
        return write_roi_csv(self.rows, path, self._record)

    def _on_export_clicked(self) -> None:
        from napari.utils.notifications import show_error, show_info

        path, _ = QFileDialog.getSaveFileName(self, "Export ROI table", "roi_statistics.csv",
                                              "CSV (*.csv)")
        if not path:
            return
        try:
            show_info(f"ROI table written to {self.export_csv(path)}")
        except (OSError, ValueError) as err:
            show_error(str(err))
