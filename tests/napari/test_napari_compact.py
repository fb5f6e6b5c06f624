"""The dock at 1280x800: compact (inspector and ROI table in tabs), messages readable, and a
screenshot of the whole window at that size."""

from __future__ import annotations


def test_at_1280x800_the_dock_leaves_the_canvas_room_and_messages_fit(viewer_widget,
                                                                     run_and_wait,
                                                                     cells_image, qtbot,
                                                                     tmp_path):
    import imageio.v3 as iio
    from qtpy.QtWidgets import QScrollArea

    viewer, widget = viewer_widget
    window = viewer.window._qt_window
    window.resize(1280, 800)
    viewer.window.show()
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    qtbot.wait(100)
    canvas = viewer.window._qt_viewer.canvas.native
    assert canvas.width() >= 500, canvas.width()  # was ~370 px with the stacked dock
    # the inspector and the ROI table are tabs of one place, not two stacked panels
    tabs = widget.result_tabs
    assert [tabs.tabText(i) for i in range(tabs.count())] == ["Patch inspector",
                                                              "ROI statistics"]
    # the status line wraps inside the dock: every word readable without scrolling sideways
    status = widget.run_panel.status_label
    assert status.wordWrap()
    scroll = widget.findChild(QScrollArea)
    assert status.width() <= scroll.viewport().width()
    shot = viewer.screenshot(canvas_only=False, flash=False)
    assert shot.shape[1] >= 1200  # the whole window at 1280 px
    iio.imwrite(tmp_path / "window_1280x800.png", shot)


def test_folding_the_run_options_gives_the_result_tabs_the_height(viewer_widget, qtbot):
    viewer, widget = viewer_widget
    viewer.window._qt_window.resize(1280, 800)
    viewer.window.show()
    qtbot.wait(100)
    options, outputs = widget.sections["Run options"], widget.sections["Outputs"]
    # at 1280x800 the dock shares napari's column and starts with the run options folded
    qtbot.waitUntil(lambda: not options.isExpanded(), timeout=3000)
    options.expand(animate=False)
    qtbot.waitUntil(lambda: options.content().height() >= widget.options.sizeHint().height(),
                    timeout=3000)
    assert options.isExpanded() and outputs.isExpanded()
    assert widget.options.isVisibleTo(widget) and widget.save_button.isVisibleTo(widget)
    assert options.toggleButton().toolTip()
    top = widget.result_tabs.mapTo(widget, widget.result_tabs.rect().topLeft()).y()
    options.collapse(animate=False)
    outputs.collapse(animate=False)
    qtbot.waitUntil(lambda: widget.result_tabs.mapTo(
        widget, widget.result_tabs.rect().topLeft()).y() < top - 150, timeout=3000)
    assert options.content().maximumHeight() == 0  # folded: no height left to the options
    options.expand(animate=False)  # open again: every control back
    qtbot.waitUntil(lambda: options.content().height() >= widget.options.sizeHint().height(),
                    timeout=3000)


def test_the_roi_table_says_when_too_few_patches_are_significant_for_enrichment():
    import numpy as np

    from napari_attnreg._napari.roi_panel import MIN_SIGNIFICANT_FOR_ENRICHMENT, enrichment_advice

    class Shown:
        def __init__(self, n):
            self.n = n

        def significant(self):
            mask = np.zeros(64, bool)
            mask[:self.n] = True
            return mask

    class Record:
        def __init__(self, n):
            self.results = {(): None}
            self._n = n

        def shown(self, plane):
            return Shown(self._n)

    few = enrichment_advice(Record(MIN_SIGNIFICANT_FOR_ENRICHMENT - 1))
    assert few and "too few for the enrichment test" in few and "mean evidence" in few
    assert enrichment_advice(Record(MIN_SIGNIFICANT_FOR_ENRICHMENT)) is None


def test_diagnostics_of_some_slices_name_their_slices(monkeypatch):
    from napari_attnreg._napari import status

    lines = {(0,): ["⚠ spread 0.55", "Model domain: demo"],
             (1,): ["⚠ spread 0.61", "Model domain: demo"]}
    monkeypatch.setattr(status, "diagnostics_lines", lambda result, include_info=True:
                        lines[result])

    class Record:
        results = {(0,): (0,), (1,): (1,)}
        geometry = None  # a stack whose file named no axes

    shown = status.plane_diagnostics(Record())
    assert shown == ["⚠ slice 0: spread 0.55", "⚠ slice 1: spread 0.61", "Model domain: demo"]
