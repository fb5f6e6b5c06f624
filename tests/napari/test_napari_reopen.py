"""A saved folder or result file reopens as a result the dock knows: thresholds move its
layers, the inspector reports its patches, the ROI table reads it (as after a run)."""

from __future__ import annotations

import numpy as np
import pytest
from qtpy.QtWidgets import QWidget

from napari_attnreg._napari.layers import META_KEY, layer_name

pytestmark = pytest.mark.gui


def _dock(viewer) -> QWidget:
    from napari_attnreg._napari.widget import AttentionWidget

    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Attention Regularization")
    return widget


def _run_directional(viewer_widget, run_and_wait, cells_image):
    """A run on 'cells' under the directional preset (q ≤ 1 marks every patch)."""
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    presets = widget.options.controls["preset"]
    presets.setCurrentIndex(presets.findData("directional"))
    run_and_wait(widget)
    return viewer, widget


def _saved_run(viewer_widget, run_and_wait, cells_image, tmp_path):
    """Run on 'cells', save its output layers through the plugin's writer (napari's Save)."""
    viewer, widget = _run_directional(viewer_widget, run_and_wait, cells_image)
    record = widget.current_record()
    viewer.layers.selection = set(record.outputs.values())
    folder = tmp_path / "saved"
    written = viewer.layers.save(str(folder), selected=True, plugin="napari-attnreg")
    return record, folder, written


def _check_live(widget, viewer, qtbot, result_image):
    """The reopened result answers the dock as its own runs do."""
    qtbot.waitUntil(lambda: widget.current_record() is not None, timeout=5000)
    record = widget.current_record()
    assert "No result" not in widget.run_panel.status_label.text()
    regularized = viewer.layers[layer_name("cells", "regularized")]
    assert record.outputs["regularized"] is regularized  # the reader's layer, not a new one
    before = regularized.data.copy()
    n_layers = len(viewer.layers)
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.q_th_slider.setValue(1.0)
    assert not np.allclose(before, regularized.data)  # the slider moved the reopened layer
    np.testing.assert_allclose(regularized.data, record.shown(()).regularized(), rtol=1e-6)
    assert len(viewer.layers) == n_layers  # updated in place, nothing added
    report = widget.inspector.inspect_world((30.0, 25.0))
    assert report is not None and report.significant  # every patch has adjusted p ≤ 1
    assert "patch (" in widget.inspector.label.text()


def test_a_saved_folder_reopens_as_a_result_the_dock_knows(
        viewer_widget, run_and_wait, cells_image, tmp_path, make_napari_viewer, qtbot):
    record, folder, written = _saved_run(viewer_widget, run_and_wait, cells_image, tmp_path)
    assert any(p.endswith("result.attnreg.npz") for p in written)  # the run's results too
    viewer = make_napari_viewer()
    widget = _dock(viewer)
    viewer.add_image(cells_image, name="cells")
    layers = viewer.open(str(folder), plugin="napari-attnreg")
    assert all(lay.metadata[META_KEY]["run_id"] == record.run_id for lay in layers)
    _check_live(widget, viewer, qtbot, cells_image)
    assert widget.current_record().run_id == record.run_id  # saving again keeps the run


def test_a_result_file_reopens_as_a_result_the_dock_knows_when_its_image_opens_after(
        viewer_widget, run_and_wait, cells_image, tmp_path, make_napari_viewer, qtbot):
    _, widget_first = _run_directional(viewer_widget, run_and_wait, cells_image)
    path = widget_first.current_record().results[()].save(tmp_path / "cells.attnreg.npz")
    viewer = make_napari_viewer()
    widget = _dock(viewer)
    viewer.open(str(path), plugin="napari-attnreg")
    qtbot.wait(50)
    assert widget.current_record() is None  # its image is not open: plain layers so far
    assert "open that image" in widget.run_panel.status_label.text()  # and the dock says so
    viewer.add_image(cells_image, name="cells")  # ... and now it is
    _check_live(widget, viewer, qtbot, cells_image)


def test_a_saved_folder_without_its_image_stays_plain_layers(
        viewer_widget, run_and_wait, cells_image, tmp_path, make_napari_viewer, qtbot):
    _, folder, _ = _saved_run(viewer_widget, run_and_wait, cells_image, tmp_path)
    viewer = make_napari_viewer()
    widget = _dock(viewer)
    viewer.add_image(cells_image[:64], name="cells")  # same name, another image
    viewer.open(str(folder), plugin="napari-attnreg")
    qtbot.wait(50)
    assert widget.records() == []
    assert "open that image (same name and size)" in widget.run_panel.status_label.text()


def test_a_saved_stack_reopens_with_every_computed_slice(
        viewer_widget, run_and_wait, cells_image, tmp_path, make_napari_viewer, qtbot):
    viewer, widget = viewer_widget
    stack = np.stack([cells_image, cells_image[::-1]])
    viewer.add_image(stack, name="stack")
    widget.source.scope_combo.setCurrentText("all slices")
    run_and_wait(widget)
    record = widget.current_record()
    assert sorted(record.results) == [(0,), (1,)]
    viewer.layers.selection = set(record.outputs.values())
    written = viewer.layers.save(str(tmp_path / "saved"), selected=True, plugin="napari-attnreg")
    assert sum(p.endswith(".attnreg.npz") for p in written) == 2  # one per slice
    again = make_napari_viewer()
    dock = _dock(again)
    again.add_image(stack, name="stack")
    again.open(str(tmp_path / "saved"), plugin="napari-attnreg")
    qtbot.waitUntil(lambda: dock.current_record() is not None, timeout=5000)
    reopened = dock.current_record()
    assert sorted(reopened.results) == [(0,), (1,)]
    np.testing.assert_array_equal(reopened.results[(1,)].attention, record.results[(1,)].attention)


def test_a_saved_time_lapse_reopens_with_its_axis_names(
        viewer_widget, run_and_wait, cells_image, tmp_path, make_napari_viewer, qtbot):
    """The saved maps' files keep no axis names: reopened, their layers read '-3' beside an
    image whose slider reads 't'."""
    viewer, widget = viewer_widget
    movie = np.stack([cells_image, cells_image[::-1]])
    viewer.add_image(movie, name="movie", axis_labels=("t", "y", "x"))
    run_and_wait(widget)
    record = widget.current_record()
    assert all(lay.axis_labels == ("t", "y", "x") for lay in record.outputs.values())
    viewer.layers.selection = set(record.outputs.values())
    viewer.layers.save(str(tmp_path / "saved"), selected=True, plugin="napari-attnreg")
    again = make_napari_viewer()
    dock = _dock(again)
    again.add_image(movie, name="movie", axis_labels=("t", "y", "x"))
    again.open(str(tmp_path / "saved"), plugin="napari-attnreg")
    qtbot.waitUntil(lambda: dock.current_record() is not None, timeout=5000)
    for layer in again.layers:
        assert layer.axis_labels == ("t", "y", "x"), layer.name


def test_a_saved_folder_reopens_at_the_thresholds_in_force_when_saved(
        viewer_widget, run_and_wait, cells_image, tmp_path, make_napari_viewer, qtbot):
    """Thresholds moved after the run and then saved come back with the folder: the panel
    and the count show them, as the saved significant layer does (the reopened dock showed
    the run's first thresholds, which the attention layer's metadata still holds)."""
    viewer, widget = _run_directional(viewer_widget, run_and_wait, cells_image)
    panel = widget.thresholds_panel
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        panel.q_th_slider.setValue(0.35)
    moved = widget.thresholds()
    assert moved["q_th"] == pytest.approx(0.35)
    record = widget.current_record()
    saved_significant = record.outputs["significant"].data.copy()
    viewer.layers.selection = set(record.outputs.values())
    folder = tmp_path / "saved"
    viewer.layers.save(str(folder), selected=True, plugin="napari-attnreg")

    viewer2 = make_napari_viewer()
    widget2 = _dock(viewer2)
    viewer2.add_image(cells_image, name="cells")
    viewer2.open(str(folder), plugin="napari-attnreg")
    qtbot.waitUntil(lambda: widget2.current_record() is not None, timeout=5000)
    assert widget2.thresholds() == moved
    assert panel.thresholds() == widget2.thresholds_panel.thresholds()
    reopened = widget2.current_record()
    np.testing.assert_array_equal(reopened.outputs["significant"].data, saved_significant)
    np.testing.assert_array_equal(reopened.shown(()).significant(),
                                  record.shown(()).significant())


def _weights_file_result(tmp_path, cells_image):
    """A result made with a local weights file (a timm ViT-Tiny, random weights saved)."""
    import timm
    import torch
    from safetensors.torch import save_file

    from napari_attnreg.api import regularize

    torch.manual_seed(0)
    module = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    weights = tmp_path / "lab_vit.safetensors"
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(weights))
    result = regularize(cells_image[:64, :64], model=str(weights), arch="vit_tiny_patch16_224",
                        n_boot=8, chunk_size=8, device="cpu")
    return weights, result.save(tmp_path / "cells.attnreg.npz")


def test_a_reopened_result_chooses_its_model_in_the_picker_and_a_rerun_uses_it(
        cells_image, tmp_path, make_napari_viewer, qtbot):
    """The picker kept showing the demo model while the status named the result's: a re-run
    used the demo model."""
    weights, path = _weights_file_result(tmp_path, cells_image)
    viewer = make_napari_viewer()
    widget = _dock(viewer)
    assert widget.model.source() == "demo"
    viewer.add_image(cells_image[:64, :64], name="cells")
    viewer.open(str(path), plugin="napari-attnreg")
    qtbot.waitUntil(lambda: widget.current_record() is not None, timeout=5000)
    assert widget.model.source() == "file"
    spec = widget.model_spec()
    assert (spec.name, spec.arch) == (str(weights), "vit_tiny_patch16_224")
    assert "the one this result was made with" in widget.run_panel.status_label.text()
    widget.options.controls["n_boot"].setValue(8)
    widget.options.controls["device"].setCurrentText("cpu")
    with qtbot.waitSignal(widget.run_finished, timeout=60_000) as blocker:
        widget.run()
    made = next(iter(blocker.args[0].results.values())).metadata
    assert (made["model"], made["weights"]) == ("vit_tiny_patch16_224", str(weights))


def test_a_reopened_result_whose_model_cannot_be_chosen_says_so(
        cells_image, tmp_path, make_napari_viewer, qtbot):
    weights, path = _weights_file_result(tmp_path, cells_image)
    weights.unlink()  # the result travelled to another machine; its weights did not
    viewer = make_napari_viewer()
    widget = _dock(viewer)
    viewer.add_image(cells_image[:64, :64], name="cells")
    viewer.open(str(path), plugin="napari-attnreg")
    qtbot.waitUntil(lambda: widget.current_record() is not None, timeout=5000)
    status = widget.run_panel.status_label.text()
    assert "The model picker still shows 'demo', not this result's model" in status
    assert "lab_vit.safetensors" in status and "not on this machine" in status
    assert "patches significant" in status  # the result's own summary stays


def test_a_reopened_result_shows_its_preset_and_a_new_choice_is_for_the_next_run(
        viewer_widget, run_and_wait, cells_image, tmp_path, make_napari_viewer, qtbot):
    """The Statistics box kept the next run's step-down while the thresholds offered the
    reopened directional result's rules (the notebook's open_result did the same)."""
    _, widget_first = _run_directional(viewer_widget, run_and_wait, cells_image)
    path = widget_first.current_record().results[()].save(tmp_path / "cells.attnreg.npz")
    viewer = make_napari_viewer()
    widget = _dock(viewer)
    assert widget.preset() == "stepdown"
    viewer.add_image(cells_image, name="cells")
    viewer.open(str(path), plugin="napari-attnreg")
    qtbot.waitUntil(lambda: widget.current_record() is not None, timeout=5000)
    assert widget.preset() == widget.session.preset == "directional"
    status = widget.run_panel.status_label.text()
    assert "Statistics set to directional" in status and "patches significant" in status
    presets = widget.options.controls["preset"]
    presets.setCurrentIndex(presets.findData("paper"))  # the analyst's choice, next run only
    status = widget.run_panel.status_label.text()
    assert "paper applies to the next run" in status and "keeps its directional" in status
    assert widget.current_record().preset == "directional"
    assert widget.thresholds_panel.thresholds().rule == "q"  # still the result's own
