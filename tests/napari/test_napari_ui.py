"""What an analyst meets in the dock: selection, Run state, tooltips, help, layout, shortcut."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gui


def _inputs(root):
    """Every control the analyst can operate (not the line edit inside a spin box or combo)."""
    from qtpy.QtWidgets import (
        QAbstractButton,
        QAbstractItemView,
        QAbstractSlider,
        QAbstractSpinBox,
        QComboBox,
        QLineEdit,
        QScrollBar,
        QWidget,
    )

    kinds = (QAbstractButton, QAbstractSlider, QAbstractSpinBox, QComboBox, QLineEdit)
    parts = (QAbstractSpinBox, QComboBox, QAbstractItemView)  # their own inner widgets
    return [w for w in root.findChildren(QWidget)
            if isinstance(w, kinds) and not any(isinstance(p, parts) for p in _ancestors(w))
            and not isinstance(w, QScrollBar)]  # the dock's own scroll bars


def _ancestors(widget):
    parent = widget.parent()
    while parent is not None:
        yield parent
        parent = parent.parent()


def test_image_combo_follows_selection_and_new_images(viewer_widget, run_and_wait, cells_image):
    viewer, widget = viewer_widget
    ct = viewer.add_image(cells_image, name="CT")
    assert widget.current_layer() is ct
    mr = viewer.add_image(np.flipud(cells_image), name="MR")
    assert widget.current_layer() is mr  # a newly opened image is the one chosen
    viewer.layers.selection.active = ct
    assert widget.current_layer() is ct  # follows the layer list
    ct.visible = False
    viewer.layers.selection.active = mr  # MR selected and the only visible layer …
    outcome = run_and_wait(widget)
    assert outcome.ok
    assert widget.current_record().source_name == "MR"  # … so Run runs MR, not the CT
    assert "MR · attention" in viewer.layers and "CT · attention" not in viewer.layers
    # selecting an output layer keeps the chosen image
    viewer.layers.selection.active = viewer.layers["MR · attention"]
    assert widget.current_layer() is mr


def test_run_needs_an_image_and_the_hint_names_a_real_menu(viewer_widget, notifications):
    from npe2 import PluginManifest

    from napari_attnreg._napari.results_io import sample_menu_hint

    viewer, widget = viewer_widget
    button = widget.run_panel.run_button
    assert not button.isEnabled()
    hint = sample_menu_hint()
    assert hint in button.toolTip()
    image = viewer.add_image(np.zeros((8, 8)), name="img")
    assert button.isEnabled()
    viewer.layers.remove(image)
    assert not button.isEnabled()
    assert widget.run() is None and hint in notifications[-1].message
    # napari 0.9 lists the samples under File ▸ Open Sample ▸ <manifest display name>
    manifest = PluginManifest.from_distribution("napari-attnreg")
    assert f"File ▸ Open Sample ▸ {manifest.display_name} ▸ " in hint
    menus = {a.text().replace("&", ""): a.menu() for a in viewer.window.file_menu.actions()}
    samples = {a.text().replace("&", "") for a in menus["Open Sample"].actions()}
    assert manifest.display_name in samples


def test_every_control_has_a_tooltip_and_there_is_a_help_link(viewer_widget):
    _viewer, widget = viewer_widget
    widget.options.advanced.expand(animate=False)
    controls = _inputs(widget)
    assert len(controls) > 30
    missing = [f"{type(w).__name__} {w.objectName() or getattr(w, 'text', lambda: '')()!r}"
               for w in controls if not w.toolTip().strip()]
    assert not missing, "\n".join(missing)
    # the method page, rendered by the dock (test_napari_analyst), never raw Markdown
    assert " href='attnreg-help:method'" in widget.title.text()


def _needed(widget):
    """Width a control needs: its size hint; a slider's value label sizes itself to its text."""
    from superqt.sliders._labeled import SliderLabel

    if isinstance(widget, SliderLabel):
        return widget.fontMetrics().horizontalAdvance(widget.text())
    return widget.sizeHint().width()


def test_controls_and_dock_title_are_not_clipped(viewer_widget, qtbot, cells_image):
    from qtpy.QtCore import QPoint
    from qtpy.QtWidgets import QDockWidget, QLabel, QScrollArea

    viewer, widget = viewer_widget
    viewer.window._qt_window.resize(1280, 800)
    viewer.window.show()
    viewer.add_image(np.stack([cells_image] * 3), name="channels")
    widget.source.channel_axis_combo.setCurrentIndex(1)  # the channels field shows
    widget.model.set_source("file")  # path and architecture fields show
    widget.options.controls["method"].setCurrentText("normal")  # the std × spin box shows
    qtbot.waitExposed(widget)
    qtbot.wait(50)
    watched = [widget.options.controls["std_factor"], widget.source.channels_edit,
               widget.model.weights_edit, widget.model.arch_edit]
    assert all(w.isVisible() for w in watched)
    clipped = [f"{type(w).__name__} {w.toolTip()[:30]!r}: {w.width()} < {_needed(w)}"
               for w in _inputs(widget) if w.isVisible() and w.width() < _needed(w)]
    assert not clipped, "\n".join(clipped)
    dock = widget.parent()
    while dock is not None and not isinstance(dock, QDockWidget):
        dock = dock.parent()
    # and the dock shows the whole widget: nothing cut by the dock's edge or its scroll area
    right_edge = widget.mapTo(dock, QPoint(widget.width(), 0)).x()
    assert right_edge <= dock.width(), (right_edge, dock.width())
    scroll = widget.findChild(QScrollArea)
    viewport = scroll.viewport()
    # the dock widens to the content's minimum once the new rows are laid out
    qtbot.waitUntil(lambda: viewport.width() >= scroll.widget().minimumSizeHint().width(),
                    timeout=3000)
    cut = [f"{type(w).__name__} {w.toolTip()[:30]!r}" for w in _inputs(widget) if w.isVisible()
           and w.mapTo(viewport, QPoint(w.width(), 0)).x() > viewport.width()]
    assert not cut, "\n".join(cut)
    title = [label for label in dock.findChildren(QLabel) if label.text() ==
             "Attention Regularization"]
    assert title and all(label.width() >= label.sizeHint().width() for label in title)


def test_keyboard_shortcut_runs(viewer_widget, qtbot, cells_image):
    from napari.utils.key_bindings import KeyBinding

    from napari_attnreg._napari.run_panel import RUN_SHORTCUT

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    assert "Ctrl+Shift+R" in widget.run_panel.run_button.toolTip()
    from napari.components import ViewerModel

    # napari's action manager binds the shortcut for every viewer (Preferences ▸ Shortcuts)
    action = ViewerModel.class_keymap[KeyBinding.from_str(RUN_SHORTCUT)]
    with qtbot.waitSignal(widget.run_finished, timeout=60_000) as blocker:
        action(viewer)
        assert widget.busy
        action(viewer)  # a second press while it runs starts nothing
    assert blocker.args[0].ok and "cells · attention" in viewer.layers


def test_threshold_move_updates_napari_status_count(viewer_widget, run_and_wait, cells_image,
                                                    qtbot):
    from napari_attnreg.core.results.display import significance_caption

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    presets = widget.options.controls["preset"]  # the q rule and its slider
    presets.setCurrentIndex(presets.findData("directional"))
    run_and_wait(widget)
    before = viewer.status
    result = widget.current_record().results[()]
    assert significance_caption(result, widget.thresholds()) in before
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.q_th_slider.setValue(1.0)  # every patch has q ≤ 1
    caption = significance_caption(result, widget.thresholds())
    assert viewer.status != before and caption in viewer.status
    n = result.grid_shape[0] * result.grid_shape[1]
    assert f"{n}/{n}" in caption


def test_save_results_calls_the_plugin_writer(viewer_widget, run_and_wait, cells_image, qtbot,
                                              tmp_path, monkeypatch):
    import csv
    import sys
    import types
    from pathlib import Path

    from napari_attnreg._napari.results_io import save_results

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    assert not widget.save_button.isEnabled()
    run_and_wait(widget)
    assert widget.save_button.isEnabled()
    record = widget.current_record()
    calls = []
    fake = types.ModuleType("napari_attnreg._napari.io")

    def write_outputs(path, layer_data):
        calls.append((path, layer_data))
        return [path]

    fake.write_outputs = write_outputs
    monkeypatch.setitem(sys.modules, "napari_attnreg._napari.io", fake)
    shapes = viewer.add_shapes([np.array([[10, 10], [60, 60]])], shape_type="rectangle")
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000):
        widget.roi_panel.set_layer(shapes)
    target = tmp_path / "cells_attnreg.ome.tif"
    written = save_results(viewer, record, widget.roi_panel.rows, target)
    (path, layer_data), = calls
    assert path == str(target) and len(layer_data) == 5
    scales = {tuple(meta["scale"]) for _data, meta, _kind in layer_data}
    assert tuple(record.outputs["attention"].scale) in scales
    assert {meta["metadata"]["attnreg"]["run_id"] for _d, meta, _k in layer_data} == \
        {record.run_id}
    assert written[-1] == str(tmp_path / "roi_table.csv")
    with open(written[-1], newline="", encoding="utf-8") as fh:
        row = next(csv.DictReader(fh))
    assert row["source_image"] == "cells" and row["run_id"] == record.run_id

    # the plugin's own writer: OME-TIFF per layer in a folder, with its provenance
    monkeypatch.undo()
    written = save_results(viewer, record, widget.roi_panel.rows, tmp_path / "real.ome.tif")
    names = {Path(p).name for p in written}
    assert sum(n.endswith(".ome.tif") for n in names) == 5 and "roi_table.csv" in names
    assert all(Path(p).exists() for p in written)


def test_a_new_dock_starts_from_the_plugin_settings(make_napari_viewer, monkeypatch):
    from napari_attnreg._napari import widget as widget_mod
    from napari_attnreg._napari.settings import RunDefaults

    monkeypatch.setattr(widget_mod, "run_defaults",
                        lambda: RunDefaults(model="uni", device="cpu", n_boot=77, preset="paper"))
    dock = widget_mod.AttentionWidget(make_napari_viewer())
    assert dock.preset() == "paper" and dock.options.value("n_boot") == 77
    assert dock.options.value("device") == "cpu"
    assert dock.model.model_spec().source == "catalogue"
    assert dock.model.model_spec().name == "uni"
    assert dock.thresholds_panel.thresholds().rule == "lfdr"  # the paper's rule came along
    # the paper's own options are editable under paper, the directional one is not
    assert dock.options.controls["alternative"].isEnabled()
    assert not dock.options.controls["null_pool"].isEnabled()


def test_a_threshold_move_computes_the_significance_mask_once(viewer_widget, run_and_wait,
                                                              cells_image, qtbot, monkeypatch):
    from napari_attnreg.core.results import result as result_mod
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    presets = widget.options.controls["preset"]  # the q rule and its slider
    presets.setCurrentIndex(presets.findData("directional"))
    run_and_wait(widget)
    calls = []
    real = result_mod.AttentionResult._compute_mask
    monkeypatch.setattr(result_mod.AttentionResult, "_compute_mask",
                        lambda self, t: calls.append(t["rule"]) or real(self, t))
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.q_th_slider.setValue(0.37)
    # layers (regularized map, Labels), status count and ROI table share one mask
    assert calls == ["q"], calls
