"""The Run shortcut as an analyst uses it: a key pressed in a real viewer, and napari's
action manager triggering the action by name (menus and command palettes do)."""

from __future__ import annotations

import pytest


def _press_run_key(qtbot, target) -> None:
    from qtpy.QtCore import Qt

    target.setFocus()
    qtbot.keyClick(target, Qt.Key.Key_R,
                   Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)


@pytest.mark.parametrize("focus", ["canvas", "layer list"])
def test_ctrl_shift_r_pressed_in_the_viewer_starts_a_run(viewer_widget, cells_image, qtbot,
                                                         focus):
    viewer, widget = viewer_widget
    viewer.window.show()
    viewer.add_image(cells_image, name="cells")
    qt_viewer = viewer.window._qt_viewer
    target = qt_viewer.canvas.native if focus == "canvas" else qt_viewer.layers
    with qtbot.waitSignal(widget.run_finished, timeout=60_000) as blocker:
        _press_run_key(qtbot, target)
        assert widget.busy
    assert blocker.args[0].ok and "cells · attention" in viewer.layers


def test_the_run_action_is_stored_as_napari_stores_its_own_and_triggers_by_name(
        viewer_widget, cells_image, qtbot):
    from napari.utils.action_manager import action_manager
    from napari.utils.key_bindings import KeyBinding

    from napari_attnreg._napari.run_panel import RUN_ACTION, RUN_SHORTCUT

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    stored = action_manager._shortcuts[RUN_ACTION]
    assert stored and all(isinstance(s, KeyBinding) for s in stored)
    assert KeyBinding.from_str(RUN_SHORTCUT) in stored
    with qtbot.waitSignal(widget.run_finished, timeout=60_000) as blocker:
        action_manager.trigger(RUN_ACTION)  # the current viewer is injected
        assert widget.busy
    assert blocker.args[0].ok


def test_ctrl_shift_r_runs_the_dock_opened_from_the_plugins_menu(make_napari_viewer,
                                                                tiny_backbone, cells_image,
                                                                qtbot):
    """Opened as the Plugins menu opens it, the dock gets a proxy of the viewer, not the
    viewer: the shortcut looked its dock up by that proxy and pressed nothing."""
    viewer = make_napari_viewer()
    viewer.window.show()
    _, widget = viewer.window.add_plugin_dock_widget("napari-attnreg", "Attention Regularization")
    assert widget.viewer is not viewer  # napari's PublicOnlyProxy
    widget.set_model(tiny_backbone, name="tiny")
    widget.options.controls["n_boot"].setValue(16)
    widget.options.controls["device"].setCurrentText("cpu")
    viewer.add_image(cells_image, name="cells")
    with qtbot.waitSignal(widget.run_finished, timeout=60_000) as blocker:
        _press_run_key(qtbot, viewer.window._qt_viewer.canvas.native)
        assert widget.busy
    assert blocker.args[0].ok and "cells · attention" in viewer.layers
