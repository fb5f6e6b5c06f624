"""The ROI panel: ROI layer chooser, per-ROI statistics table and CSV export with provenance.

The rows are the core's :func:`~napari_attnreg.core.stats.roi.roi_table` (see :mod:`.roi_geometry`);
this panel only shows them, flags what a reader could misread (ROIs smaller than a patch, with
the run that would resolve them), and writes them: as CSV, and into the ROI layer's
``features`` (napari's features table and status line show them there).

Selection is linked: choosing rows here selects those shapes / that label in the layer (and
moves to the row's slice); selecting shapes or a label in the layer selects their rows. A
Shapes or Labels layer added while no ROI layer is chosen becomes the ROI layer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from qtpy.QtCore import QItemSelection, QItemSelectionModel, Signal
from qtpy.QtWidgets import (
    QAbstractItemView,
    QComboBox,
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

from napari_attnreg._napari.dialogs import save_through_dialog
from napari_attnreg._napari.option_controls import choose_item
from napari_attnreg._napari.roi_export import (
    roi_features,
    size_advice,
    with_layer_names,
    write_roi_csv,
    write_roi_geojson,
)
from napari_attnreg._napari.roi_geometry import RoiPlane, planes_roi_rows, roi_planes
from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg._napari.slice_cue import shown_plane
from napari_attnreg._napari.source_panel import is_output
from napari_attnreg._napari.status import WARNING_COLOR
from napari_attnreg.core.results.display import (
    ROI_COLUMN_HELP,
    MapInfo,
    roi_header,
    roi_table_columns,
    rule_text,
)
from napari_attnreg.core.stats.roi import LISTED_IDS, MIN_SIGNIFICANT_FOR_ENRICHMENT

#: The ROI layer's events that place it anew over the image (the table is measured again).
TRANSFORM_EVENTS = ("scale", "translate", "rotate", "shear", "affine")
#: Size of a table above which it is computed on a worker thread: the tokens of the planes
#: measured as polygons (a threshold move's work) plus the pixels of those measured on a
#: label image. A slide analysed at full resolution (50,000², 12.7 M tokens) took seconds
#: a move; up to this size (0.1-0.2 s) the table stays synchronous: shown at once, simpler.
BACKGROUND_TABLE_SIZE = 1 << 21
#: The status line while a table is being computed.
UPDATING = "Updating the ROI table…"


def _size(planes: list[RoiPlane]) -> int:
    return sum(int(np.prod(item.result.grid_shape if item.labels is None
                           else item.result.image_shape)) for item in planes)


def is_tissue_mask(layer: Any) -> bool:
    """The tissue mask layer of a tiled run (added by the dock, or reopened with a result)."""
    return isinstance(layer.metadata, dict) and isinstance(layer.metadata.get("tissue"), dict)


def table_columns() -> list[str]:
    """The ROI table's columns, as the notebook's (core.display.roi_table_columns)."""
    return roi_table_columns()


def enrichment_advice(record: Any) -> str | None:
    """Say when too few patches are significant for the enrichment columns to mean much."""
    counts = [int(record.shown(p).significant().sum()) for p in sorted(record.results)]
    fewest = min(counts) if counts else 0
    if fewest >= MIN_SIGNIFICANT_FOR_ENRICHMENT:
        return None
    return (f"Only {fewest} patch(es) significant: too few for the enrichment test (odds "
            "ratio, Fisher p say little); read the mean evidence and the attention in/out "
            "ratio with its interval.")


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, float):
        if np.isnan(value):
            return "–"
        # 3 significant digits, but an area of 9470 µm² is 9470, not 9.47e+03
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
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
        self._syncing = False  # a selection set from the other side: do not echo it back
        self.rows: list[dict] = []
        # a slide's shapes rasterized as tokens (record_roi_rows): every threshold move
        # updates the table, and rasterizing level-0 regions again each time would lag
        self._token_cache: dict = {}
        self.worker: Any = None  # the table being computed on a worker thread, if any
        self._wanted: tuple[int, list[RoiPlane], RunRecord] | None = None  # the next one
        self._generation = 0  # of the latest request: an older table is not shown
        self._closed = False
        self._picked_up: Any = None  # the layer taken up when added (not chosen by hand)
        self._aside: str | None = None  # why no ROI layer is chosen (a layer set aside)

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
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.setMinimumHeight(110)
        self.table.setToolTip("One row per ROI: per-region statistics against the significant "
                              "patches (hover a column header for its meaning). Choosing "
                              "rows selects those ROIs in the layer.")

        top = QHBoxLayout()
        top.addWidget(QLabel("ROI layer"))
        top.addWidget(self.layer_combo, 1)
        # the exports on a row of their own: beside the layer they widened the dock past
        # the width napari gives it at 1280 px
        exports = QHBoxLayout()
        exports.addStretch(1)
        exports.addWidget(self.export_button)
        # the regions themselves, for QuPath (File ▸ Import objects), with their statistics
        self.geojson_button = QPushButton("GeoJSON…")
        self.geojson_button.setToolTip(
            "Save the ROIs of the chosen layer as GeoJSON annotations QuPath imports "
            "on this image (its pixels, top-left corner at 0; a slide's full resolution), "
            "each with its row of the table as measurements.")
        self.geojson_button.setEnabled(False)
        self.geojson_button.clicked.connect(self._on_geojson_clicked)
        exports.addWidget(self.geojson_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.table)
        layout.addLayout(exports)
        layout.addWidget(self.status)

        self.layer_combo.currentIndexChanged.connect(self._on_layer_chosen)
        self.export_button.clicked.connect(self._on_export_clicked)
        self.table.itemSelectionChanged.connect(self._on_rows_selected)
        for ev in self._layer_list_events():
            ev.connect(self._refresh_choices)
        viewer.layers.events.inserted.connect(self._on_inserted)
        viewer.dims.events.current_step.connect(self._on_step)
        self._refresh_choices()

    def _layer_list_events(self) -> tuple[Any, ...]:
        ev = self._viewer.layers.events
        return (ev.inserted, ev.removed, ev.renamed)

    def disconnect_viewer(self) -> None:
        """Stop following the viewer (the dock was removed)."""
        for ev in self._layer_list_events():
            ev.disconnect(self._refresh_choices)
        self._viewer.layers.events.inserted.disconnect(self._on_inserted)
        self._viewer.dims.events.current_step.disconnect(self._on_step)
        self._watch(None)
        self._closed, self._wanted = True, None  # a table still computing is dropped

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

    def _on_inserted(self, event: Any) -> None:
        # a layer the analyst just added to draw or paint ROIs in (never our own outputs, nor
        # the tissue mask a tiled run adds: taken up, it was the table's one "ROI" and kept
        # the Shapes layer drawn next from being chosen)
        layer = event.value
        if self.current_layer() is None and layer in self.roi_layers() and not is_output(layer) \
                and not is_tissue_mask(layer):
            self.set_layer(layer)
            self._picked_up = layer

    def set_aside(self, layer: Any) -> None:
        """``layer`` is a run's tissue mask: when it was taken up as the ROI layer (added while
        none was chosen, not chosen here by hand) it is no longer the ROI layer; the one other
        layer drawn beside it is, else none (the status line says why)."""
        if layer is None or layer is not self.current_layer() or layer is not self._picked_up:
            return
        others = [lay for lay in self.roi_layers() if lay is not layer
                  and not is_output(lay) and not is_tissue_mask(lay)]
        self.set_layer(others[0] if len(others) == 1 else None)
        if self.current_layer() is None:
            self._aside = (f"{layer.name!r} is the run's tissue mask, not ROIs: draw the ROIs "
                           "in a Shapes layer (or paint them in another Labels layer) and "
                           "choose it here.")
            self.update_table()

    def current_layer(self) -> Any | None:
        return self.layer_combo.currentData() if self.layer_combo.count() else None

    def set_layer(self, layer: Any) -> None:
        """Choose the ROI layer programmatically (the table is recomputed, also when it was
        the chosen layer already, e.g. picked up when it was added)."""
        if layer is self.current_layer() and layer is not None:
            self.update_table()
            return
        if choose_item(self.layer_combo, layer):
            return
        raise ValueError(f"{getattr(layer, 'name', layer)!r} is not a Shapes/Labels layer of the "
                         "viewer.")

    def _on_layer_chosen(self, *_: Any) -> None:
        self._picked_up = self._aside = None  # chosen by hand (set_layer/_on_inserted: in code)
        self._watch(self.current_layer())
        self.update_table()

    def _watch(self, layer: Any) -> None:
        for watched, action in ((self._watched, "disconnect"), (layer, "connect")):
            if watched is None:
                continue
            # moving, scaling, flipping or rotating the ROI layer moves its regions over the
            # image: the table kept the numbers of where they had been
            for name, slot in (("data", self._schedule), ("paint", self._schedule),
                               *((t, self._schedule) for t in TRANSFORM_EVENTS),
                               ("highlight", self._on_layer_selection),
                               ("selected_label", self._on_layer_selection)):
                emitter = getattr(watched.events, name, None)
                if emitter is not None:
                    getattr(emitter, action)(slot)
        self._watched = layer

    @qdebounced(timeout=150)
    def _schedule(self, event: Any = None) -> None:
        # editing a shape fires many events; one table update per pause is plenty
        self.update_table()

    # ---- table -------------------------------------------------------------------------
    def update_table(self) -> None:
        """Recompute the rows from the current record, ROI layer and thresholds.

        A table larger than :data:`BACKGROUND_TABLE_SIZE` is computed on a worker thread
        (the table says it is updating meanwhile); the latest call wins.
        """
        self._generation += 1
        record = self._record = self._current_record()
        layer = self.current_layer()
        if record is None:
            self._finish([], "Run the analysis on the image first.")
            return
        if layer is None:
            self._finish([], self._aside or "Choose a Shapes or Labels layer with ROIs.")
            return
        try:
            # the layer is read here, on the GUI thread
            planes = roi_planes(record, layer, self._token_cache)
            if _size(planes) > BACKGROUND_TABLE_SIZE:
                self._in_background(planes, record)
                return
            rows = planes_roi_rows(planes, self._token_cache)
        except ValueError as err:
            self._finish([], str(err))
        else:
            self._finish(rows, self._summary(rows, record))

    def _summary(self, rows: list[dict], record: RunRecord) -> str:
        text = (f"{len(rows)} ROI row(s) · significant: {rule_text(record.thresholds)} · "
                "token in ROI when ≥50% covered")
        for advice in (self._unmeasured(rows), size_advice(rows, record),
                       enrichment_advice(record)):
            if advice:
                text += f"<br><span style='color:{WARNING_COLOR}'>⚠ {advice}</span>"
        return text

    def _unmeasured(self, rows: list[dict]) -> str | None:
        """Which shapes have no row: "0 ROI row(s)" left an analyst whose layer was moved,
        flipped or scaled off the image to guess why."""
        from napari.layers import Shapes

        layer = self.current_layer()
        if not isinstance(layer, Shapes) or not len(layer.data):
            return None
        missing = sorted(set(range(1, len(layer.data) + 1)) - {int(r["label"]) for r in rows})
        if not missing:
            return None
        named = ", ".join(map(str, missing[:LISTED_IDS])) + (
            f" and {len(missing) - LISTED_IDS} more" if len(missing) > LISTED_IDS else "")
        return (f"ROI {named} of {layer.name!r} covers no pixel of the analysed image (or "
                "lies on a slice without a result): check the layer's position, scale and "
                "flip against the image's, or draw it over the image.")

    def _finish(self, rows: list[dict], text: str) -> None:
        self.table.setEnabled(True)
        self.status.setText(text)
        self._show(rows)
        self._write_features()
        self._on_layer_selection()  # the new rows keep the layer's selection

    # ---- a large table on a worker thread --------------------------------------------------
    @property
    def updating(self) -> bool:
        """A table is being computed: :attr:`rows` are still those of the previous request."""
        return self.worker is not None or self._wanted is not None

    def _in_background(self, planes: list[Any], record: RunRecord) -> None:
        # a level-0 slide's table takes a second or more: on the GUI thread every threshold
        # move froze the viewer that long, and quick moves queued stale tables behind it
        self._wanted = (self._generation, planes, record)
        self.table.setEnabled(False)  # the rows shown are of the previous thresholds
        self.export_button.setEnabled(False)
        self.geojson_button.setEnabled(False)
        self.status.setText(UPDATING)
        if self.worker is None:
            self._start_wanted()
        # else: the running table is dropped when it ends and the latest request starts then

    def _start_wanted(self) -> None:
        from napari.qt.threading import create_worker

        if self._wanted is None or self._closed:
            return
        generation, planes, record = self._wanted
        self._wanted = None
        # errors are shown in the status line (_on_failed), not raised again in the GUI
        worker = create_worker(planes_roi_rows, planes, self._token_cache,
                               _start_thread=False, _ignore_errors=True)
        worker.returned.connect(lambda rows: self._on_rows(generation, record, rows))
        worker.errored.connect(lambda err: self._on_failed(generation, err))
        worker.finished.connect(self._on_worker_done)
        self.worker = worker
        worker.start()

    def _on_rows(self, generation: int, record: RunRecord, rows: list[dict]) -> None:
        if generation == self._generation and not self._closed:
            self._finish(rows, self._summary(rows, record))

    def _on_failed(self, generation: int, err: BaseException) -> None:
        from napari_attnreg.core.run.service import user_message

        if generation == self._generation and not self._closed:
            self._finish([], str(err) if isinstance(err, ValueError) else
                         f"ROI table not computed: {user_message(err)}")

    def _on_worker_done(self) -> None:
        self.worker = None
        self._start_wanted()  # a request made while this one ran (only the latest is kept)

    def _show(self, rows: list[dict]) -> None:
        self.rows = rows
        layer = self.current_layer()
        # the layer's own names and classes (QuPath's annotations) beside the ROI number: the
        # dock showed only "1, 2, 3" for regions the analyst knows by name
        shown = with_layer_names(rows, layer) if layer is not None else rows
        names = [k for k in (shown[0] if shown else {}) if k not in rows[0]
                 and any(row[k] for row in shown)]  # an empty column only takes room
        lead = table_columns()
        columns = ((["plane"] if rows and "plane" in rows[0] else []) + lead[:1] + names
                   + lead[1:])
        preset = self._record.preset if rows and self._record is not None else ""
        info = MapInfo.of(self._record.any_result) if preset else None  # "Mean CDAM"
        self.table.clear()
        self.table.setColumnCount(len(columns))
        self.table.setRowCount(len(rows))
        for c, key in enumerate(columns):  # headers and their meaning from core.display
            header = QTableWidgetItem(key.replace("_", " ").capitalize() if key in names
                                      else roi_header(key, preset, info))
            header.setToolTip("From the ROI layer's features (e.g. QuPath's annotations)."
                              if key in names else ROI_COLUMN_HELP.get(key, ""))
            self.table.setHorizontalHeaderItem(c, header)
        for r, row in enumerate(shown):
            for c, key in enumerate(columns):
                self.table.setItem(r, c, QTableWidgetItem(_fmt(row.get(key))))
        self.export_button.setEnabled(bool(rows))
        self.geojson_button.setEnabled(bool(rows))
        self.rows_changed.emit(rows)

    # ---- the layer's features and linked selection ---------------------------------------
    def _write_features(self) -> None:
        layer = self.current_layer()
        if layer is None or not self.rows:
            return
        try:
            before = getattr(layer, "feature_defaults", None)  # Shapes (Labels have none)
            layer.features = roi_features(layer, self.rows, self._shown_plane())
            if before is None:
                return
            # napari takes the first row as what a shape drawn next gets: every new ROI was
            # named as the first annotation read from QuPath and had its class
            now = layer.feature_defaults
            kept = {c: before[c].iloc[0] for c in before.columns if c in now.columns}
            if kept and len(now):
                layer.feature_defaults = {**{c: now[c].iloc[0] for c in now.columns}, **kept}
        except ValueError as err:  # e.g. shapes added since the rows were made: next update
            self.status.setText(f"{self.status.text()}<br>Layer features not updated: {err}")

    def _shown_plane(self) -> list[int] | None:
        """The plane of the selected result the viewer shows (None: a 2D image)."""
        record = self._record
        plane = None if record is None else shown_plane(record.geometry, self._viewer.dims.point)
        return None if plane is None else list(plane)

    def _on_step(self, event: Any = None) -> None:
        if self._record is not None and len(self._record.results) > 1:
            self._write_features()  # the features show the slice in view

    def _on_rows_selected(self) -> None:
        layer = self.current_layer()
        rows = sorted({index.row() for index in self.table.selectedIndexes()})
        if self._syncing or layer is None or not rows:
            return
        chosen = [self.rows[r] for r in rows if r < len(self.rows)]
        self._syncing = True
        try:
            if chosen and chosen[-1].get("plane") not in (None, self._shown_plane()):
                self._go_to_plane(chosen[-1]["plane"])
            labels = [int(row["label"]) for row in chosen]
            if hasattr(layer, "selected_label"):
                layer.selected_label = labels[-1]
            else:
                layer.selected_data = {label - 1 for label in labels if label <= len(layer.data)}
        finally:
            self._syncing = False

    def _go_to_plane(self, plane: list[int]) -> None:
        geometry = self._record.geometry  # type: ignore[union-attr]
        offset = self._viewer.dims.ndim - geometry.ndim
        for axis, index in zip(geometry.stack_axes, plane):
            world = geometry.translate[axis] + geometry.scale[axis] * index
            self._viewer.dims.set_point(axis + offset, world)

    def _on_layer_selection(self, event: Any = None) -> None:
        layer = self.current_layer()
        if self._syncing or layer is None:
            return
        labels = ({int(layer.selected_label)} if hasattr(layer, "selected_label")
                  else {i + 1 for i in layer.selected_data})
        plane = self._shown_plane()
        wanted = [r for r, row in enumerate(self.rows)
                  if row["label"] in labels and row.get("plane", plane) == plane]
        if wanted == sorted({index.row() for index in self.table.selectedIndexes()}):
            return  # highlight also fires on hover: nothing changed
        selection = QItemSelection()
        last = self.table.columnCount() - 1
        for r in wanted:
            selection.select(self.table.model().index(r, 0), self.table.model().index(r, last))
        self._syncing = True
        try:
            self.table.selectionModel().select(
                selection, QItemSelectionModel.SelectionFlag.ClearAndSelect)
            if wanted:
                self.table.scrollToItem(self.table.item(wanted[0], 0))
        finally:
            self._syncing = False

    def export_csv(self, path: str | Path) -> Path:
        """Write the current rows, with what made them (``#`` lines) on top."""
        if not self.rows:
            raise ValueError("There are no ROI rows to export; choose an ROI layer with ROIs.")
        layer = self.current_layer()
        rows = self.rows if layer is None else with_layer_names(self.rows, layer)
        return write_roi_csv(rows, path, self._record)

    def export_geojson(self, path: str | Path) -> Path:
        """Write the chosen layer's ROIs on the plane in view as GeoJSON annotations
        with their statistics (:func:`~.roi_export.roi_geojson`)."""
        layer, record = self.current_layer(), self._record
        if layer is None or record is None or not self.rows:
            raise ValueError("There are no ROIs to export; run the image and choose an ROI "
                             "layer with ROIs.")
        return write_roi_geojson(layer, record, self.rows, path, self._shown_plane())

    def _on_geojson_clicked(self) -> None:
        save_through_dialog(self, "Export ROIs as GeoJSON", "roi_regions.geojson",
                            "GeoJSON (*.geojson)", self.export_geojson,
                            lambda written: f"ROIs written to {written}")

    def _on_export_clicked(self) -> None:
        save_through_dialog(self, "Export ROI table", "roi_statistics.csv", "CSV (*.csv)",
                            self.export_csv, lambda written: f"ROI table written to {written}")
