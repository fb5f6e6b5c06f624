"""What an analyst reads off the viewer: patch inspector, ROI features, object size, slices."""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg.core.results.patch_report import patch_report

pytestmark = pytest.mark.gui


def _canvas_point(viewer, world_row: float, world_col: float):
    """The canvas pixel (QPoint) that shows world position (row, col) of a 2D view."""
    from qtpy.QtCore import QPoint

    canvas = viewer.window._qt_viewer.canvas
    transform = canvas.view.transform * canvas.view.scene.transform
    x, y = transform.map([world_col, world_row])[:2]
    return QPoint(int(round(x)), int(round(y)))


def _click(qtbot, viewer, world_row: float, world_col: float) -> None:
    from qtpy.QtCore import Qt

    native = viewer.window._qt_viewer.canvas.native
    qtbot.mouseClick(native, Qt.MouseButton.LeftButton, pos=_canvas_point(viewer, world_row,
                                                                         world_col))


# ---- 1. patch inspector ----------------------------------------------------------------------
def test_inspector_click_shows_the_patch_and_its_stepdown_null(viewer_widget, run_and_wait,
                                                               cells_image, qtbot):
    viewer, widget = viewer_widget
    image = viewer.add_image(cells_image, name="cells", scale=(0.5, 0.5))
    run_and_wait(widget)
    viewer.reset_view()
    qtbot.wait(50)
    record = widget.current_record()
    result = record.shown(())
    row, col = 30, 25  # the first blob, in image pixels; world = pixels × 0.5
    with qtbot.waitSignal(widget.inspector.inspected, timeout=5000) as blocker:
        _click(qtbot, viewer, row * 0.5, col * 0.5)
    report = blocker.args[0]
    assert report is not None and not widget.inspector.follow_check.isChecked()  # pinned
    i, j = report.token
    expected = patch_report(result, row, col)
    # canvas pixels are coarser than image pixels: the click lands on the same patch
    assert abs(i - expected.token[0]) <= 1 and abs(j - expected.token[1]) <= 1
    assert dict(report.values)["adjusted p"] == f"{result.q[i, j]:.3g}"
    assert report.significant == bool(result.significant()[i, j])
    text = widget.inspector.label.text()
    assert f"patch ({i}, {j})" in text and "null maps reached its step statistic" in text
    # the count is the one that makes the stored step p: p = (1 + n)/(1 + B)
    n_boot = result.null_summary["B"]
    line = next(s for s in report.null_lines if "null maps reached" in s)
    reached = int(line.split(" of ")[0])
    assert result.p[i, j] == pytest.approx((1 + reached) / (1 + n_boot))
    assert not widget.inspector.histogram.isVisibleTo(widget.inspector)  # step-down keeps no null histogram

    # a pinned patch stays while the mouse moves on; ticking 'follow' hovers again
    widget.inspector._on_move(viewer, type("E", (), {"position": (1.0, 1.0)})())
    qtbot.wait(150)
    assert widget.inspector.report.token == (i, j)
    assert image.world_to_data((1.0, 1.0)) is not None


def test_inspector_hover_directional_shows_z_against_the_pooled_null(viewer_widget,
                                                                     run_and_wait,
                                                                     cells_image, qtbot):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    presets = widget.options.controls["preset"]
    presets.setCurrentIndex(presets.findData("directional"))
    run_and_wait(widget)
    result = widget.current_record().shown(())
    with qtbot.waitSignal(widget.inspector.inspected, timeout=5000) as blocker:
        widget.inspector._on_move(viewer, type("E", (), {"position": (80.0, 70.0)})())
    report = blocker.args[0]
    assert report == patch_report(result, 80.0, 70.0)
    assert "Pooled null z" in widget.inspector.label.text()
    assert widget.inspector.histogram.isVisibleTo(widget.inspector) and report.statistic == pytest.approx(
        result.z[report.token])
    # thresholds move: the shown patch is judged again with the new rule
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.q_th_slider.setValue(1.0)
    assert widget.inspector.report.significant  # every patch has q ≤ 1
    assert "(q ≤ 1)" in widget.inspector.label.text()


def test_inspector_says_when_the_slice_has_no_result(viewer_widget, run_and_wait, qtbot):
    viewer, widget = viewer_widget
    rng = np.random.default_rng(0)
    viewer.add_image(rng.random((3, 64, 64)).astype(np.float32), name="stack")
    viewer.dims.set_current_step(0, 1)
    run_and_wait(widget)  # the current slice only
    report = widget.inspector.inspect_world((1.0, 30.0, 30.0))
    assert report is not None
    assert widget.inspector.inspect_world((2.0, 30.0, 30.0)) is None
    assert "no result yet" in widget.inspector.label.text()
