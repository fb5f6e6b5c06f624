"""Save a run's results from the dock, and the sample-menu hint read from the manifest."""

from __future__ import annotations

import functools
from importlib.resources import files
from pathlib import Path
from typing import Any

from qtpy.QtWidgets import QPushButton, QWidget

from napari_attnreg._napari.dialogs import save_through_dialog
from napari_attnreg._napari.run_record import RunRecord


@functools.cache
def sample_menu_hint() -> str:
    """Where napari lists our samples: 'File ▸ Open Sample ▸ <plugin> ▸ <sample>'.

    napari 0.9 builds that submenu from the manifest's display names, so they are read
    from the manifest rather than repeated here.
    """
    from npe2 import PluginManifest

    manifest = PluginManifest.from_file(str(files("napari_attnreg") / "napari.yaml"))
    samples = manifest.contributions.sample_data or []
    path = ["File", "Open Sample", manifest.display_name]
    if samples:
        path.append(samples[0].display_name)
    return "e.g. " + " ▸ ".join(path)


def save_results(viewer: Any, record: RunRecord, roi_rows: list[dict], path: str | Path
                 ) -> list[str]:
    """Write the run's output layers (OME-TIFF with their placement, via the plugin's writer)
    and the ROI table (CSV) next to them; returns the paths written.

    The table states the provenance ``provenance.json`` states for the same layers (one
    record: what the run resolved and used, the thresholds in force, the run id).
    """
    from napari_attnreg.io.export import ROI_TABLE_FILE, saved_provenance, write_table_csv

    try:
        from napari_attnreg._napari.io import write_outputs
    except ImportError as err:
        raise RuntimeError("Saving results needs the plugin's writer "
                           "(napari_attnreg._napari.io.write_outputs), which this installation "
                           "lacks; update napari-attnreg.") from err
    layers = [layer for layer in record.outputs.values() if layer in viewer.layers]
    if not layers:
        raise ValueError("The output layers of this run were removed; run it again to save.")
    layer_data = [layer.as_layer_data_tuple() for layer in layers]
    written = list(write_outputs(str(path), layer_data))
    if roi_rows:  # beside the layers (the writer makes a folder for several layers)
        csv_path = Path(written[0]).parent / ROI_TABLE_FILE
        written.append(str(write_table_csv(csv_path, roi_rows, saved_provenance(layer_data))))
    return written


class SaveButton(QPushButton):
    """'Save results…': the current image's output layers and ROI table."""

    def __init__(self, widget: Any, parent: QWidget | None = None) -> None:
        super().__init__("Save results…", parent)
        self._widget = widget
        self.setToolTip("Save this image's output layers as OME-TIFF with their scale, and the "
                        "ROI table as CSV, each stating image, model, preset, thresholds, B, "
                        "seed and package version.")
        self.setEnabled(False)
        self.clicked.connect(self._on_clicked)

    def _on_clicked(self) -> None:
        from napari.utils.notifications import show_error

        record = self._widget.current_record()
        if record is None:
            show_error("Run the analysis on the image first.")
            return
        if self._widget.roi_panel.updating:  # its rows are still the previous thresholds'
            show_error("The ROI table is being updated for the thresholds now set; save "
                       "again once it shows (the file would hold the previous rows).")
            return
        save_through_dialog(
            self, "Save results", f"{record.source_name}_attnreg.ome.tif", "OME-TIFF (*.ome.tif)",
            lambda path: save_results(self._widget.viewer, record, self._widget.roi_panel.rows,
                                      path),
            lambda written: "Saved: " + ", ".join(written))
