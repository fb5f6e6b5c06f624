"""Save → close → reopen on the real viewer: output layers come back where, as what and under
the name they were; result files open as the dock's layers; one provenance per save."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from napari_attnreg._napari.layers import KINDS, META_KEY, layer_name

pytestmark = pytest.mark.gui

UNITS_WARNING = "Inconsistent units across layers"
MM = ("millimeter",) * 3


def _drawn(viewer, qtbot):
    """Let the canvas draw (napari checks the layers' units on a draw)."""
    viewer.window.show()
    qtbot.wait(150)


def _units_warnings(notifications):
    return [n for n in notifications if UNITS_WARNING in n.message]


def _corners(layer, plane=()):
    """World coordinates of the first cell's corner and of the far corner of the last cell."""
    rows, cols = layer.data.shape[-2:]
    return [layer.data_to_world((*plane, r, c)) for r, c in ((-0.5, -0.5),
                                                             (rows - 0.5, cols - 0.5))]


@pytest.fixture
def ct_series(tmp_path):
    """Three 256² CT slices of a phantom abdomen (HU), 2.5 mm apart, 0.7 × 0.5 mm pixels."""
    from test_io_readers import write_ct_slice

    from napari_attnreg.testing.phantoms import make_phantom_image

    folder = tmp_path / "ct"
    folder.mkdir()
    stored = make_phantom_image(11, size=256, abnormal=True, dtype="uint16").image  # HU + 1024
    for k in range(3):
        write_ct_slice(folder / f"slice{k}.dcm", z_mm=-30.0 + 2.5 * k, instance=k + 1,
                       pixels=stored)
    return folder


@pytest.fixture
def demo_dock(make_napari_viewer):
    """(viewer, widget) on the bundled demo model (patch 8, 128 px input), CPU, B = 8."""
    from napari_attnreg._napari.widget import AttentionWidget

    viewer = make_napari_viewer()
    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Attention Regularization")
    assert widget.model_spec().source == "demo"
    widget.options.controls["n_boot"].setValue(8)
    widget.options.controls["device"].setCurrentText("cpu")
    return viewer, widget


def test_ct_outputs_in_mm_are_saved_closed_and_reopened_where_they_were(
        demo_dock, make_napari_viewer, run_and_wait, ct_series, tmp_path, notifications, qtbot):
    from napari_attnreg._napari.results_io import save_results

    viewer, widget = demo_dock
    ct, = viewer.open(str(ct_series), plugin="napari-attnreg")
    assert ct.units == MM and tuple(ct.scale) == (2.5, 0.7, 0.5)
    widget.set_layer(ct)
    viewer.dims.set_point(0, ct.data_to_world((1, 0, 0))[0])  # the middle slice
    run_and_wait(widget, timeout=120_000)
    _drawn(viewer, qtbot)
    record = widget.current_record()
    assert sorted(record.results) == [(1,)]
    # 1. the outputs are in mm like the CT: no "Inconsistent units" on any draw
    assert all(record.outputs[k].units == MM for k in KINDS)
    assert not _units_warnings(notifications)
    # the token grid lies on the image: token corners on the source's pixel corners (mm)
    sy, sx = record.results[(1,)].token_scale
    for kind in KINDS:
        lo, hi = _corners(record.outputs[kind], (1,))
        np.testing.assert_allclose(lo, ct.data_to_world((1, -0.5, -0.5)), err_msg=kind)
        rows, cols = record.grid_shape
        np.testing.assert_allclose(hi, ct.data_to_world((1, rows * sy - 0.5, cols * sx - 0.5)),
                                   err_msg=kind)
    before = {kind: (type(layer).__name__, layer.name, np.array(layer.data),
                     _corners(layer, (1,)), layer.metadata[META_KEY]["run_id"])
              for kind, layer in record.outputs.items()}

    # 2. save into a folder that does not exist yet, close the viewer, reopen from disk
    written = save_results(viewer, record, [], tmp_path / "saved" / "ct_attnreg.ome.tif")
    files = [p for p in written if p.endswith(".ome.tif")]
    assert len(files) == len(KINDS)
    viewer.close()
    again = make_napari_viewer()
    again.open(str(ct_series), plugin="napari-attnreg")
    # the saved folder, dropped on the viewer as a whole
    reopened = again.open(str(Path(files[0]).parent), plugin="napari-attnreg")
    # saved order, the significant labels drawn by their outline as the dock draws them
    assert [layer.name for layer in reopened] == [*(before[k][1] for k in KINDS),
                                                  before["significant"][1] + " outline"]
    _drawn(again, qtbot)
    by_name = {layer.name: layer for layer in reopened}
    for kind, (layer_type, name, data, corners, run_id) in before.items():
        layer = by_name[name]  # the name it was saved under, not the file's stem
        assert type(layer).__name__ == layer_type, kind
        assert layer.units == MM, kind
        np.testing.assert_array_equal(layer.data, data)
        for got, want in zip(_corners(layer, (1,)), corners):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-9, err_msg=kind)
        assert layer.metadata[META_KEY]["run_id"] == run_id
    assert type(by_name[before["significant"][1]]).__name__ == "Labels"
    assert not _units_warnings(notifications)


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


def test_a_result_file_opens_as_the_layers_the_dock_makes(
        viewer_widget, make_napari_viewer, run_and_wait, cells_image, tmp_path, notifications):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")  # napari names cells.tif so
    run_and_wait(widget)
    record = widget.current_record()
    result = record.results[()]
    # as the command line writes it: NAME.attnreg.npz, the source path in the metadata
    result = dataclasses.replace(result, metadata={**result.metadata,
                                                   "source": "/data/cells.tif"})
    path = result.save(tmp_path / "cells.tif.attnreg.npz")

    other = make_napari_viewer()
    layers = other.open(str(path), plugin="napari-attnreg")
    # one naming rule: the image's name as napari gives it (no file suffix), as in the dock
    names = [layer_name("cells", k, record.preset) for k in KINDS]
    assert [layer.name for layer in layers] == [*names, f"{names[-1]} outline"]
    # the significant patches drawn by the same thin outline as the dock draws them
    outline, made_outline = layers[-1], viewer.layers[f"{names[-1]} outline"]
    assert [p.tolist() for p in outline.data] == [p.tolist() for p in made_outline.data]
    np.testing.assert_allclose(outline.scale, made_outline.scale)
    for kind, layer in zip(KINDS, layers):
        made = record.outputs[kind]
        assert type(layer) is type(made), kind
        np.testing.assert_array_equal(layer.data, made.data)
        np.testing.assert_allclose(layer.scale, made.scale, err_msg=kind)
        np.testing.assert_allclose(layer.translate, made.translate, err_msg=kind)
        assert layer.units == made.units and str(layer.units[0]) == "pixel"  # a plain array
        assert layer.visible == made.visible
        assert layer.metadata[META_KEY]["kind"] == kind
        if kind != "significant":
            np.testing.assert_allclose(layer.contrast_limits, made.contrast_limits)
            assert layer.colormap.name == made.colormap.name
    assert layers[-2].metadata[META_KEY]["provenance"]["source_image"] == "/data/cells.tif"


def test_a_result_file_that_records_its_spacing_opens_in_mm(make_napari_viewer, tiny_backbone,
                                                            tmp_path):
    from napari_attnreg import regularize
    from napari_attnreg._napari.io import get_reader

    image = np.random.default_rng(2).random((96, 80)).astype(np.float32)
    spatial = {"scale": [0.7, 0.5], "translate": [-120.0, -100.0], "units": ["mm", "mm"]}
    result = regularize(image, tiny_backbone, n_boot=4, device="cpu")
    result.metadata["spatial"] = spatial  # what a run on a DICOM records
    path = result.save(tmp_path / "ct.dcm.attnreg.npz")
    assert get_reader(str(tmp_path / "other.npz")) is None  # other .npz files are not ours
    viewer = make_napari_viewer()
    source = viewer.add_image(image, scale=spatial["scale"], translate=spatial["translate"],
                              units=spatial["units"])
    layers = viewer.open(str(path), plugin="napari-attnreg")
    sy, sx = result.token_scale
    rows, cols = result.grid_shape
    *maps, outline = layers
    np.testing.assert_allclose(outline.scale, maps[-1].scale)  # placed as its labels
    np.testing.assert_allclose(outline.translate, maps[-1].translate)
    for layer in maps:
        assert layer.units == source.units
        lo, hi = _corners(layer)
        np.testing.assert_allclose(lo, source.data_to_world((-0.5, -0.5)), err_msg=layer.name)
        np.testing.assert_allclose(hi, source.data_to_world((rows * sy - 0.5, cols * sx - 0.5)),
                                   err_msg=layer.name)
    broken = tmp_path / "broken.attnreg.npz"
    broken.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="broken.attnreg.npz"):
        get_reader(str(broken))(str(broken))


def test_a_ct_run_in_the_dock_warns_off_domain_and_records_where_it_lay(
        demo_dock, run_and_wait, ct_series):
    """The dock passes what the DICOM says as the command line does: the demo model on a CT
    is off-domain, and the result keeps the slice's placement in millimetres."""
    viewer, widget = demo_dock
    ct, = viewer.open(str(ct_series), plugin="napari-attnreg")
    widget.set_layer(ct)
    run_and_wait(widget, timeout=120_000)
    result = next(iter(widget.current_record().results.values()))
    assert result.metadata["image_kind"] == "radiology"
    assert "off_domain" in [d.code for d in result.diagnostics]
    assert result.spatial == {"scale": (0.7, 0.5), "translate": tuple(ct.translate[-2:]),
                              "units": ("millimeter", "millimeter")}


def test_the_kind_chosen_in_the_dock_wins_over_the_dicom_modality(demo_dock, run_and_wait,
                                                                   ct_series):
    viewer, widget = demo_dock
    ct, = viewer.open(str(ct_series), plugin="napari-attnreg")
    widget.set_layer(ct)
    widget.options.set("image_kind", "microscopy")  # an advanced control, from the metadata
    run_and_wait(widget, timeout=120_000)
    result = next(iter(widget.current_record().results.values()))
    assert (result.metadata["image_kind"], result.metadata["image_kind_source"]) == (
        "microscopy", "stated")
