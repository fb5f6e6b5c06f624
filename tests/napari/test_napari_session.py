"""Results on several images: the dock shows the selected image's thresholds and count (#16)."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from napari_attnreg._napari.layers import token_grid
from napari_attnreg.core.results.display import significance_caption
from napari_attnreg.core.run.thresholds import Thresholds

pytestmark = pytest.mark.gui


def _record(widget, name):
    return next(r for r in widget.records() if r.source_name == name)


def _status(widget):
    return widget.run_panel.status_label.text()


@pytest.fixture
def two_results(viewer_widget, run_and_wait, cells_image, qtbot):
    """Directional results on images A (q ≤ 1: every patch) and B (q ≤ 0.1), B chosen."""
    viewer, widget = viewer_widget
    presets = widget.options.controls["preset"]  # the q rule and its slider
    presets.setCurrentIndex(presets.findData("directional"))
    a = viewer.add_image(cells_image, name="A")
    run_and_wait(widget)
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.q_th_slider.setValue(1.0)
    b = viewer.add_image(np.flipud(cells_image), name="B")  # a new image is the chosen one
    assert widget.current_layer() is b and widget.current_record() is None
    # B has no result: the panel shows what a run starts with, and A's count is gone
    assert widget.thresholds_panel.thresholds().q_th == pytest.approx(0.1)
    assert "significant" not in _status(widget) and "No result" in _status(widget)
    run_and_wait(widget)
    return viewer, widget, a, b


def test_selecting_an_image_shows_its_own_thresholds_and_count(two_results):
    viewer, widget, a, b = two_results
    rec_a, rec_b = _record(widget, "A"), _record(widget, "B")
    assert widget.current_record() is rec_b
    assert (rec_a.thresholds.q_th, rec_b.thresholds.q_th) == pytest.approx((1.0, 0.1))
    viewer.layers.selection.active = a
    assert widget.current_record() is rec_a and widget.session.selected_key == a.unique_id
    assert widget.thresholds_panel.q_th_slider.value() == pytest.approx(1.0)
    n = rec_a.grid_shape[0] * rec_a.grid_shape[1]
    assert f"{n}/{n} patches significant (q ≤ 1)" in _status(widget)
    assert f"{n}/{n} patches significant" in viewer.status
    viewer.layers.selection.active = b
    assert widget.thresholds_panel.q_th_slider.value() == pytest.approx(0.1)
    assert significance_caption(rec_b.any_result, rec_b.thresholds) in _status(widget)
    assert "(q ≤ 0.1)" in _status(widget)


def test_a_threshold_move_changes_only_the_selected_result(two_results, qtbot):
    viewer, widget, a, b = two_results
    rec_a, rec_b = _record(widget, "A"), _record(widget, "B")
    a_layers = {k: rec_a.outputs[k].data.copy() for k in ("regularized", "significant")}
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000) as blocker:
        widget.thresholds_panel.q_th_slider.setValue(0.5)
    assert blocker.args[0] is rec_b
    assert (rec_a.thresholds.q_th, rec_b.thresholds.q_th) == pytest.approx((1.0, 0.5))
    np.testing.assert_array_equal(token_grid(rec_b.outputs["significant"].data) == 1,
                                  rec_b.any_result.significant(q_th=0.5))
    np.testing.assert_allclose(rec_b.outputs["regularized"].data,
                               rec_b.any_result.regularized(q_th=0.5), rtol=1e-6)
    for kind, before in a_layers.items():  # the other image keeps its own layers
        np.testing.assert_array_equal(rec_a.outputs[kind].data, before)
    assert token_grid(rec_a.outputs["significant"].data).all()  # still q ≤ 1: every patch
    assert "(q ≤ 0.5)" in _status(widget)
    # a move made just before choosing another image goes to the image it was made on
    widget.thresholds_panel.q_th_slider.setValue(0.25)
    viewer.layers.selection.active = a
    assert rec_b.thresholds.q_th == pytest.approx(0.25)
    assert rec_a.thresholds.q_th == pytest.approx(1.0)
    assert widget.thresholds_panel.q_th_slider.value() == pytest.approx(1.0)


def test_apply_thresholds_uses_the_emitted_value(two_results, qtbot):
    _viewer, widget, _a, _b = two_results
    rec_b = _record(widget, "B")
    widget.thresholds_panel.q_th_slider.blockSignals(True)
    widget.thresholds_panel.q_th_slider.setValue(0.9)  # what the sliders say …
    widget.thresholds_panel.q_th_slider.blockSignals(False)
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.apply_thresholds(Thresholds.from_preset("directional").replace(q_th=0.7))
    assert rec_b.thresholds.q_th == pytest.approx(0.7)  # … is not what is applied
    assert widget.thresholds_panel.q_th_slider.value() == pytest.approx(0.7)  # and it shows


def test_roi_csv_after_selecting_uses_the_selected_results_thresholds(two_results, qtbot,
                                                                       tmp_path):
    viewer, widget, a, _b = two_results
    rec_a = _record(widget, "A")
    shapes = viewer.add_shapes([np.array([[10, 10], [60, 60]])], shape_type="rectangle",
                               name="rois")
    viewer.layers.selection.active = a
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.roi_panel.set_layer(shapes)
    assert blocker.args[0][0]["frac_significant"] == pytest.approx(1.0)  # A's q ≤ 1
    with open(widget.roi_panel.export_csv(tmp_path / "a.csv"), newline="",
              encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["source_image"] == "A" and rows[0]["run_id"] == rec_a.run_id
    assert float(rows[0]["q_th"]) == pytest.approx(1.0) and rows[0]["rule"] == "q"
    assert float(rows[0]["frac_significant"]) == pytest.approx(1.0)


def test_settings_set_in_code_reach_the_options(viewer_widget):
    _viewer, widget = viewer_widget
    widget.session.update_settings(n_boot=33)
    assert widget.options.value("n_boot") == 33
    assert widget.run_config().n_boot == 33


def test_only_the_chosen_images_maps_show_colour_bars(two_results):
    """napari draws every visible map's bar in one corner: two images' bars lay over each
    other (#28 item 4). The chosen image's maps keep theirs."""
    from napari_attnreg._napari.layers import CONTINUOUS_KINDS, find_output

    viewer, widget, a, b = two_results
    rec_a, rec_b = _record(widget, "A"), _record(widget, "B")

    def bars(record):
        return {kind: find_output(viewer, record, kind).colorbar.visible
                for kind in CONTINUOUS_KINDS}

    assert all(bars(rec_b).values()) and not any(bars(rec_a).values())
    viewer.layers.selection.active = a
    assert all(bars(rec_a).values()) and not any(bars(rec_b).values())
    shown = [layer for layer in viewer.layers
             if getattr(layer, "colorbar", None) is not None and layer.colorbar.visible
             and layer.visible]
    assert not [layer for layer in shown if layer.name.startswith("B ")]
