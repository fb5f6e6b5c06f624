"""Save → close → reopen on the real viewer: output layers come back where, as what and under
the name they were; result files open as the dock's layers; one provenance per save."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gui


def test_saved_roi_table_and_provenance_state_one_resolved_record(
        viewer_widget, run_and_wait, cells_image, tmp_path, qtbot):
    from napari_attnreg._napari.results_io import save_results
    from napari_attnreg.io.export import PROVENANCE_FIELDS

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells", metadata={"source_path": "/data/cells.tif"})
    presets = widget.options.controls["preset"]
    presets.setCurrentIndex(presets.findData("directional"))
    run_and_wait(widget)
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.q_th_slider.setValue(0.3)  # thresholds move after the run
    record = widget.current_record()
    roi = viewer.add_labels((cells_image > 1000).astype(np.int32), name="roi")
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000):
        widget.roi_panel.set_layer(roi)
    written = save_results(viewer, record, widget.roi_panel.rows, tmp_path / "cells.ome.tif")
    folder = Path(written[0]).parent
    saved = json.loads((folder / "provenance.json").read_text())["provenance"]
    with open(folder / "roi_table.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert rows
    for row in rows:
        for field in (*PROVENANCE_FIELDS, "run_id"):
            assert row[field] == ("" if saved[field] is None else str(saved[field])), field
    # what the run used, not what the dock asked for ("auto", unset)
    assert (saved["null"], saved["alternative"]) == ("theoretical", "greater")
    assert saved["precision"] == "float32" and saved["device"] == "cpu"
    assert saved["q_th"] == pytest.approx(0.3) and saved["run_id"] == record.run_id
    assert saved["source_image"] == "/data/cells.tif"
