"""The dock's one-click reader preference for .dcm and the plugin's saved files."""

from __future__ import annotations


def test_one_click_sets_napari_reader_preference_and_hides(viewer_widget, qtbot):
    from napari.settings import get_settings
    from qtpy.QtCore import Qt

    from napari_attnreg._napari.reader_choice import PATTERNS, PLUGIN

    viewer, widget = viewer_widget
    plugins = get_settings().plugins
    before = dict(plugins.extension2reader)
    plugins.extension2reader = {k: v for k, v in before.items() if k not in PATTERNS}
    try:
        widget.reader_button.setVisible(True)
        qtbot.mouseClick(widget.reader_button, Qt.MouseButton.LeftButton)
        assert all(plugins.extension2reader[p] == PLUGIN for p in PATTERNS)
        assert not widget.reader_button.isVisible()
    finally:
        plugins.extension2reader = before
