"""Per-ROI statistics against significant attention: ROI layer → labels → core ``roi_table``.

The analyst draws Shapes or paints Labels; each ROI becomes integer labels on the input
image's own pixel grid (whatever the ROI layer's scale/translate), and the statistics are
the core's :func:`~napari_attnreg.core.roi.roi_table`, never recomputed here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from qtpy.QtCore import QTimer, Signal
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

from ..core.display import rule_text, with_thresholds
from ..core.roi import ROI_COLUMNS, roi_table, roi_table_to_csv
from .layers import RunRecord, SourceGeometry

PlaneIndex = tuple[int, ...]

HEADERS = {
    "plane": "plane", "label": "ROI", "area_px": "area px", "n_tokens": "tokens",
    "mean_attention": "mean attn", "mean_regularized": "mean reg", "mean_posterior": "mean post",
    "frac_significant": "frac sig", "mean_pct_raw": "pct raw", "mean_pct_regularized": "pct reg",
    "odds_ratio": "odds ratio", "fisher_p": "Fisher p",
}


def _axis_map(src: SourceGeometry, layer: Any, src_axis: int) -> tuple[float, float]:
    """(a, b) with ``roi_index = a·src_index + b`` along one axis (scale/translate only)."""
    roi_axis = src_axis - src.ndim + layer.ndim
    s0, t0 = src.scale[src_axis], src.translate[src_axis]
    s1, t1 = float(layer.scale[roi_axis]), float(layer.translate[roi_axis])
    return s0 / s1, (t0 - t1) / s1


def _check_plain_transform(src: SourceGeometry, layer: Any) -> None:
    eye = np.eye(layer.ndim)
    plain = (np.allclose(layer.rotate, eye) and np.allclose(np.asarray(layer.shear), 0)
             and np.allclose(layer.affine.affine_matrix, np.eye(layer.ndim + 1))
             and np.allclose(src.rotate, np.eye(src.ndim)) and np.allclose(src.shear, 0)
             and np.allclose(src.affine, np.eye(src.ndim + 1)))
    if not plain:
        raise ValueError(f"ROI layer {layer.name!r} or the image is rotated, sheared or has an "
                         "affine transform; ROIs need plain scale/translate layers.")


def _roi_lead_index(src: SourceGeometry, layer: Any, plane: PlaneIndex) -> tuple[int, ...] | None:
    """Index along the ROI layer's own leading axes for one source plane (None: outside)."""
    lead = layer.ndim - 2
    full = [0] * src.ndim
    for axis, i in zip(src.stack_axes, plane):
        full[axis] = i
    index = []
    for roi_axis in range(lead):
        src_axis = roi_axis + src.ndim - layer.ndim
        if src_axis < 0:
            return None  # the ROI layer has more axes than the image: ambiguous
        a, b = _axis_map(src, layer, src_axis)
        index.append(round(a * full[src_axis] + b))
    return tuple(index)


def labels_roi_on_image(layer: Any, src: SourceGeometry, plane: PlaneIndex) -> np.ndarray:
    """A Labels layer's ROIs resampled (nearest) onto one plane of the image's pixel grid."""
    _check_plain_transform(src, layer)
    h, w = src.image_shape
    out = np.zeros((h, w), dtype=np.int64)
    lead = _roi_lead_index(src, layer, plane)
    if lead is None:
        raise ValueError(f"ROI layer {layer.name!r} has more axes than the image.")
    data = layer.data[0] if getattr(layer, "multiscale", False) else layer.data
    if any(not 0 <= i < n for i, n in zip(lead, data.shape)):
        return out
    plane_data = np.asarray(data[lead]) if lead else np.asarray(data)
    coords = []
    for src_axis, n_src in ((src.ndim - 2, h), (src.ndim - 1, w)):
        a, b = _axis_map(src, layer, src_axis)
        coords.append(np.rint(a * np.arange(n_src) + b).astype(np.int64))
    rows, cols = coords
    ok_r = (rows >= 0) & (rows < plane_data.shape[0])
    ok_c = (cols >= 0) & (cols < plane_data.shape[1])
    out[np.ix_(ok_r, ok_c)] = plane_data[np.ix_(rows[ok_r], cols[ok_c])]
    return out


def shapes_roi_on_image(layer: Any, src: SourceGeometry, plane: PlaneIndex) -> np.ndarray:
    """A Shapes layer's shapes as labels (shape i → id i+1) on one plane of the image grid.

    Vertices go shapes-data → world → image-data; shapes of an nD layer count on the planes
    they lie on, those of a 2D layer on every plane. Rasterised by napari's ``to_labels``.
    """
    from napari.layers import Shapes

    _check_plain_transform(src, layer)
    h, w = src.image_shape
    if len(layer.data) == 0:
        return np.zeros((h, w), dtype=np.int64)
    full = np.zeros(src.ndim)
    for axis, i in zip(src.stack_axes, plane):
        full[axis] = i
    scale = np.asarray(layer.scale, dtype=float)
    translate = np.asarray(layer.translate, dtype=float)
    keep_data, keep_types, ids = [], [], []
    for i, (verts, kind) in enumerate(zip(layer.data, layer.shape_type)):
        world = np.asarray(verts, dtype=float) * scale + translate
        src_axes = np.arange(layer.ndim) + src.ndim - layer.ndim
        if np.any(src_axes < 0):
            raise ValueError(f"ROI layer {layer.name!r} has more axes than the image.")
        src_scale = np.asarray(src.scale)[src_axes]
        src_translate = np.asarray(src.translate)[src_axes]
        pix = (world - src_translate) / src_scale
        lead_ok = all(
            np.all(np.rint(pix[:, k]) == full[src_axes[k]])
            for k in range(layer.ndim - 2) if src_axes[k] in src.stack_axes
        )
        if lead_ok:
            keep_data.append(pix[:, -2:])
            keep_types.append(kind)
            ids.append(i + 1)
    if not keep_data:
        return np.zeros((h, w), dtype=np.int64)
    temp = Shapes(keep_data, shape_type=keep_types)
    temp_labels = temp.to_labels(labels_shape=(h, w)).astype(np.int64)
    lut = np.concatenate([[0], ids]).astype(np.int64)
    return lut[temp_labels]


def roi_labels(layer: Any, src: SourceGeometry, plane: PlaneIndex) -> np.ndarray:
    """Integer ROI labels on one plane of the image's pixel grid, from Shapes or Labels."""
    from napari.layers import Labels, Shapes

    if isinstance(layer, Shapes):
        return shapes_roi_on_image(layer, src, plane)
    if isinstance(layer, Labels):
        return labels_roi_on_image(layer, src, plane)
    raise ValueError(f"Layer {layer.name!r} is neither Shapes nor Labels; draw ROIs in one of those.")


def record_roi_rows(record: RunRecord, layer: Any) -> list[dict]:
    """The core's ROI table for every computed plane of ``record`` (a ``plane`` column for stacks)."""
    rows: list[dict] = []
    for plane in sorted(record.results):
        labels = roi_labels(layer, record.geometry, plane)
        # the thresholds travel as the result's own (q_th and "no z mask" included)
        shown = with_thresholds(record.results[plane], record.thresholds)
        for row in roi_table(shown, labels):
            rows.append({"plane": list(plane), **row} if plane else row)
    return rows


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
        self.rows: list[dict] = []

        self.layer_combo = QComboBox()
        self.layer_combo.setToolTip("A Shapes or Labels layer; each shape / label id is one ROI.")
        self.export_button = QPushButton("Export CSV…")
        self.export_button.setEnabled(False)
        self.status = QLabel("Draw Shapes or paint Labels, then choose the layer here.")
        self.status.setWordWrap(True)
        self.table = QTableWidget(0, 0)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)  # the ROI id column names each row
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.setMinimumHeight(110)

        top = QHBoxLayout()
        top.addWidget(QLabel("ROI layer"))
        top.addWidget(self.layer_combo, 1)
        top.addWidget(self.export_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.table)
        layout.addWidget(self.status)

        # editing a shape fires many events; one table update per pause is plenty
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(150)
        self._debounce.timeout.connect(self.update_table)

        self.layer_combo.currentIndexChanged.connect(self._on_layer_chosen)
        self.export_button.clicked.connect(self._on_export_clicked)
        for ev in (viewer.layers.events.inserted, viewer.layers.events.removed,
                   viewer.layers.events.renamed):
            ev.connect(self._refresh_choices)
        self._refresh_choices()

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
        for i in range(self.layer_combo.count()):
            if self.layer_combo.itemData(i) is layer:
                self.layer_combo.setCurrentIndex(i)
                return
        raise ValueError(f"{getattr(layer, 'name', layer)!r} is not a Shapes/Labels layer of the viewer.")

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

    def _schedule(self, event: Any = None) -> None:
        self._debounce.start()

    # ---- table -------------------------------------------------------------------------
    def update_table(self) -> None:
        """Recompute the rows from the current record, ROI layer and thresholds."""
        record = self._current_record()
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
                self.status.setText(
                    f"{len(rows)} ROI row(s) · significant: {rule_text(record.thresholds)} · "
                    "token in ROI when ≥50% covered")
        self._show(rows)

    def _show(self, rows: list[dict]) -> None:
        self.rows = rows
        columns = (["plane"] if rows and "plane" in rows[0] else []) + list(ROI_COLUMNS)
        self.table.clear()
        self.table.setColumnCount(len(columns))
        self.table.setHorizontalHeaderLabels([HEADERS.get(c, c) for c in columns])
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for c, key in enumerate(columns):
                self.table.setItem(r, c, QTableWidgetItem(_fmt(row.get(key))))
        self.export_button.setEnabled(bool(rows))
        self.rows_changed.emit(rows)

    def export_csv(self, path: str | Path) -> Path:
        """Write the current rows with the core's CSV writer."""
        if not self.rows:
            raise ValueError("There are no ROI rows to export; choose an ROI layer with ROIs.")
        path = Path(path)
        roi_table_to_csv(self.rows, path)
        return path

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
