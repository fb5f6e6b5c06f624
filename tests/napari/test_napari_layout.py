"""The dock at a 1280x800 window, docked the way napari docks a plugin (Plugins menu): the
canvas keeps most of the width, every message wraps inside the dock, and a screenshot of the
whole window is written at that size."""

from __future__ import annotations

import pytest

WINDOW = (1280, 800)
#: The canvas keeps at least this share of the window's width (was ~0.37 beside two columns).
CANVAS_SHARE = 0.55


@pytest.fixture
def small_window_dock(make_napari_viewer, tiny_backbone, qtbot):
    """A shown 1280x800 viewer, then the dock added from the Plugins menu's entry."""
    viewer = make_napari_viewer(show=True)
    window = viewer.window._qt_window
    window.resize(*WINDOW)
    qtbot.waitUntil(lambda: window.width() == WINDOW[0], timeout=3000)
    _, widget = viewer.window.add_plugin_dock_widget("napari-attnreg", "Attention Regularization")
    widget.set_model(tiny_backbone, name="tiny")
    widget.options.controls["n_boot"].setValue(16)
    widget.options.controls["device"].setCurrentText("cpu")
    return viewer, widget


def _dock_of(widget):
    from qtpy.QtWidgets import QDockWidget

    dock = widget.parentWidget()
    while not isinstance(dock, QDockWidget):
        dock = dock.parentWidget()
    return dock


def _assert_fully_readable(label, scroll):
    """A message label wraps, lies inside the dock's visible width, and its text needs no more
    height than it was given (nothing cut or elided)."""
    assert label.wordWrap(), label.text()
    right = label.mapTo(scroll.viewport(), label.rect().topRight()).x()
    assert right <= scroll.viewport().width(), (right, scroll.viewport().width())
    assert label.heightForWidth(label.width()) <= label.height(), label.text()


def test_at_1280x800_the_canvas_keeps_most_of_the_width(small_window_dock, run_and_wait,
                                                       cells_image, qtbot, tmp_path):
    import imageio.v3 as iio
    from qtpy.QtWidgets import QDockWidget, QScrollArea

    viewer, widget = small_window_dock
    window = viewer.window._qt_window
    viewer.add_image(cells_image, name="cells")
    canvas = viewer.window._qt_viewer.canvas.native
    qtbot.waitUntil(lambda: canvas.width() >= CANVAS_SHARE * WINDOW[0], timeout=5000)

    # napari's layer controls are a tab beside the dock; the layer list stays in view
    dock = _dock_of(widget)
    controls = window.findChild(QDockWidget, "layer controls")
    assert dock in window.tabifiedDockWidgets(controls)
    assert window.findChild(QDockWidget, "layer list").isVisible()
    assert not widget.sections["Run options"].isExpanded()  # folded: Run is in view
    assert widget.run_panel.run_button.isVisible()
    assert dock.minimumSizeHint().width() <= 400  # was 468: drop-downs no longer force it

    run_and_wait(widget)
    qtbot.wait(200)
    assert canvas.width() >= CANVAS_SHARE * WINDOW[0], canvas.width()
    scroll = widget.findChild(QScrollArea)
    labels = [widget.run_panel.status_label, widget.inspector.label, widget.roi_panel.status]
    widget.result_tabs.setCurrentWidget(widget.roi_panel)
    qtbot.wait(50)
    for label in labels[:1] + labels[2:]:
        _assert_fully_readable(label, scroll)
    widget.result_tabs.setCurrentWidget(widget.inspector)
    qtbot.wait(50)
    _assert_fully_readable(widget.inspector.label, scroll)
    assert "significant" in widget.run_panel.status_label.text()  # the summary, not "Ready."

    shot = viewer.screenshot(canvas_only=False, flash=False)
    assert shot.shape[1] >= 1200  # the whole window at 1280 px
    iio.imwrite(tmp_path / "window_1280x800.png", shot)


def test_napari_remembering_the_left_side_gives_a_tab_not_a_strip(small_window_dock, qtbot):
    """napari remembers that the dock was on the left, not that it was a tab: re-added there,
    it would be a strip under the layer list; it becomes the tab again."""
    from qtpy.QtWidgets import QDockWidget

    viewer, widget = small_window_dock
    window = viewer.window._qt_window
    viewer.window.remove_dock_widget(_dock_of(widget))
    widget2 = viewer.window.add_dock_widget(
        type(widget)(viewer), name="Attention Regularization", area="left")
    window.resize(1920, 1080)  # a wide window: only the remembered side moves it
    qtbot.waitUntil(lambda: widget2.isVisible(), timeout=3000)
    controls = window.findChild(QDockWidget, "layer controls")
    qtbot.waitUntil(lambda: widget2 in window.tabifiedDockWidgets(controls), timeout=3000)


def test_a_wide_window_keeps_the_dock_on_its_own_side(make_napari_viewer, qtbot):
    from qtpy.QtCore import Qt
    from qtpy.QtWidgets import QDockWidget

    viewer = make_napari_viewer(show=True)
    window = viewer.window._qt_window
    window.resize(1900, 1000)
    qtbot.waitUntil(lambda: window.width() == 1900, timeout=3000)
    _, widget = viewer.window.add_plugin_dock_widget("napari-attnreg", "Attention Regularization")
    qtbot.wait(100)
    dock = _dock_of(widget)
    assert window.dockWidgetArea(dock) == Qt.DockWidgetArea.RightDockWidgetArea
    assert not window.tabifiedDockWidgets(window.findChild(QDockWidget, "layer controls"))
    assert widget.sections["Run options"].isExpanded()


def test_the_slice_cue_comes_in_short_lines():
    """napari's canvas text overlay does not wrap: the cue is cut into lines that fit a
    narrow canvas, and still names the slices."""
    from types import SimpleNamespace

    from napari_attnreg._napari.slice_cue import CUE_WIDTH, missing_slice_text

    geometry = SimpleNamespace(stack_axes=(0,), ndim=3, translate=(0.0, 0.0, 0.0),
                               scale=(1.0, 1.0, 1.0), stack_shape=(12,))
    record = SimpleNamespace(geometry=geometry, source_name="a rather long image name.tif",
                             results={(p,): None for p in range(6)})
    text = missing_slice_text(record, (9.0, 0.0, 0.0))
    lines = text.split("\n")
    assert len(lines) >= 3 and all(len(line) <= CUE_WIDTH for line in lines), lines
    assert "slice 9 has no result" in text and "and 2 more" in text
    assert "'Compute remaining slices' in the dock" in text


def test_a_diagnostics_toast_starts_with_the_warning_itself():
    """napari shows only a toast's first line until it is expanded: the first line must say
    what is wrong, after the image's name, not a heading."""
    from napari_attnreg._napari.status import diagnostics_message

    text = diagnostics_message("mosaic", ["⚠ B = 100 is too few for 7225 tiles", "⚠ second"])
    first, *rest = text.split("\n")
    assert first == "'mosaic': ⚠ B = 100 is too few for 7225 tiles"
    assert rest == ["⚠ second"]
