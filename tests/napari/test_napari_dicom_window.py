"""The dock runs a CT opened from DICOM through the window napari shows it in."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gui
pydicom = pytest.importorskip("pydicom")


def _ct(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_io_readers import write_ct_slice

    folder = tmp_path / "ct"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for k in range(2):
        stored = np.clip(rng.normal(1064, 300, (64, 64)), 0, 4095).astype(np.uint16)
        write_ct_slice(folder / f"s{k}.dcm", 2.5 * k, k + 1, stored, window=(-600.0, 1500.0))
    return folder


def test_the_dock_analyses_the_stored_window_and_a_preset_chosen_in_advanced(
        viewer_widget, run_and_wait, tmp_path):
    from napari_attnreg._napari.option_controls import set_value
    from napari_attnreg.core.run.options import option

    viewer, widget = viewer_widget
    (ct,) = viewer.open(str(_ct(tmp_path)), plugin="napari-attnreg")
    assert tuple(ct.contrast_limits) == pytest.approx((-1350.0, 150.0))
    widget.set_layer(ct)
    run_and_wait(widget)
    result = next(iter(widget.current_record().results.values()))
    assert result.metadata["intensity_scaling"]["source"] == "stored"
    assert result.metadata["intensity_scaling"]["low"] == -1350.0
    assert "window C -600 W 1500 (the file's)" in widget.run_panel.status_label.text()
    # a slice is named as napari's slider names it, never "axis 0 = 1"
    assert widget.current_record().geometry.plane_name((1,)) == "z = 1"
    assert "z = 0" in widget.run_panel.status_label.text()  # "computed 1 of 2 planes (z = 0)"

    control = widget.options.controls["intensity_window"]
    set_value(control, option("intensity_window"), "bone")
    run_and_wait(widget)
    result = next(iter(widget.current_record().results.values()))
    assert result.metadata["intensity_scaling"]["source"] == "bone"
    assert "window C 400 W 1800 (bone)" in widget.run_panel.status_label.text()
