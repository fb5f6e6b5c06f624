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


# ---- 2. ROI features and linked selection -----------------------------------------------------
def test_new_shapes_layer_becomes_the_roi_layer_and_gets_features(viewer_widget, run_and_wait,
                                                                  cells_image, qtbot):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    panel = widget.roi_panel
    assert panel.current_layer() is None  # the significant Labels output is never picked
    shapes = viewer.add_shapes(name="drawn")  # what the 'new shapes layer' button does
    assert panel.current_layer() is shapes  # no reopening of the dock
    shapes.add_rectangles(np.array([[15, 10], [50, 45]]))
    shapes.add_ellipses(np.array([[80, 70], [15, 15]]))
    qtbot.waitUntil(lambda: len(panel.rows) == 2, timeout=5000)
    features = shapes.features
    assert list(features["label"]) == [1, 2]
    for row, (_, feature) in zip(panel.rows, features.iterrows()):
        assert feature["mean_attention"] == pytest.approx(row["mean_attention"])
        assert feature["fisher_p"] == pytest.approx(row["fisher_p"])

    # a row chosen in our table selects that shape; a shape selected in the layer, its row
    panel.table.selectRow(1)
    assert shapes.selected_data == {1}
    shapes.selected_data = {0}
    shapes.events.highlight()  # what napari emits when the selection changes
    assert [i.row() for i in panel.table.selectionModel().selectedRows()] == [0]


def test_labels_features_follow_napari_label_rows_and_selection(viewer_widget, run_and_wait,
                                                                cells_image, qtbot):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    objects = np.zeros(cells_image.shape, dtype=np.int32)
    objects[20:40, 15:35] = 2
    objects[70:90, 60:80] = 5
    labels = viewer.add_labels(objects, name="nuclei")
    panel = widget.roi_panel
    assert panel.current_layer() is labels
    qtbot.waitUntil(lambda: len(panel.rows) == 2, timeout=5000)
    features = labels.features
    # napari's features table and status line: row i is label i
    assert list(features["index"]) == list(range(6))
    assert np.isnan(features.loc[1, "mean_attention"])
    assert features.loc[5, "mean_attention"] == pytest.approx(panel.rows[1]["mean_attention"])
    # labels.get_status reads the features of the label under the cursor
    status = labels.get_status((80.0, 70.0), world=True)
    assert "mean_attention" in str(status)
    panel.table.selectRow(1)
    assert labels.selected_label == 5
    labels.selected_label = 2
    assert [i.row() for i in panel.table.selectionModel().selectedRows()] == [0]


# ---- 3. object size guidance ------------------------------------------------------------------
def test_many_small_objects_are_counted_with_the_run_that_resolves_them(viewer_widget,
                                                                         run_and_wait,
                                                                         cells_image, qtbot):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    result = widget.current_record().any_result
    sy, sx = result.token_scale
    assert sy > 3 and sx > 3  # 224-px model input over a 120×100 image: ~7-px patches
    objects = np.zeros(cells_image.shape, dtype=np.int32)
    for k, (r, c) in enumerate((r, c) for r in range(2, 118, 6) for c in range(2, 98, 6)):
        objects[r:r + 2, c:c + 2] = k + 1  # 2×2-pixel "nuclei", far below one patch
    n = int(objects.max())
    assert n > 100
    viewer.add_labels(objects, name="tiny nuclei")
    qtbot.waitUntil(lambda: len(widget.roi_panel.rows) == n, timeout=20_000)
    status = widget.roi_panel.status.text()
    assert f"{n} of {n} ROIs smaller than one patch" in status
    assert "ROI 1," not in status  # counted, not listed
    assert "upsample the image" in status  # 2-px objects are below even native patches


def test_size_advice_names_tiled_mode_and_tile_scale():
    from napari_attnreg.core.stats.roi import object_size_advice

    areas = {k: 600.0 for k in range(1, 111)}  # ~28-px objects under 36-px patches
    untiled = object_size_advice(areas, (36.5, 36.5), (16, 16))
    assert untiled.startswith("110 of 110 ROIs smaller than one patch")
    assert "Run 'Tiled (native resolution)'" in untiled and "'Downsample ×' 1.5" in untiled
    tiled = object_size_advice(areas, (64.0, 64.0), (16, 16), tiled=True, tile_scale=4.0)
    assert "Lower 'Downsample ×' (now 4) to 1.5" in tiled
    assert object_size_advice({1: 5000.0}, (36.5, 36.5), (16, 16)) is None


# ---- 4. the remaining slices of a stack ----------------------------------------------------------
def test_remaining_slices_button_and_the_cue_on_slices_without_a_result(viewer_widget,
                                                                         run_and_wait, qtbot):
    viewer, widget = viewer_widget
    rng = np.random.default_rng(0)
    viewer.add_image(rng.random((3, 64, 64)).astype(np.float32), name="stack")
    viewer.dims.set_current_step(0, 1)
    run_and_wait(widget)  # Planes: the current slice
    record = widget.current_record()
    assert sorted(record.results) == [(1,)]
    button = widget.run_panel.remaining_button
    assert button.isVisibleTo(widget) and "(2)" in button.text()
    attention = viewer.layers["stack · attention"]
    assert np.isnan(attention.data[0]).all() and np.isfinite(attention.data[1]).all()
    first = np.array(attention.data[1])

    # the slice in view has a result: no cue; a slice without one: the canvas says so
    from napari_attnreg._napari.slice_cue import text_overlay

    overlay = text_overlay(viewer)
    assert not overlay.visible
    viewer.dims.set_current_step(0, 2)
    assert overlay.visible
    assert "slice 1 only" in overlay.text and "slice 2 has no result" in overlay.text

    with qtbot.waitSignal(widget.run_finished, timeout=60_000) as blocker:
        button.click()
    outcome = blocker.args[0]
    assert outcome.ok and sorted(outcome.results) == [(0,), (2,)]  # only the missing slices
    record = widget.current_record()
    assert sorted(record.results) == [(0,), (1,), (2,)]
    assert np.isfinite(attention.data).all()  # the same layer, now complete
    np.testing.assert_array_equal(attention.data[1], first)  # slice 1 kept, not recomputed
    assert not button.isVisibleTo(widget)
    assert not overlay.visible  # slice 2 has its result now


def test_the_slider_moved_during_a_run_lands_on_a_slice_the_cue_names(
        viewer_widget, qtbot):
    """The analyst starts a run on slice 1 and moves on to slice 2 while it runs: the result
    goes to slice 1 and the canvas says slice 2 has none (the cue stayed blank until the
    slider moved again: its check ran before the run's layers were added)."""
    from napari_attnreg._napari.slice_cue import text_overlay

    viewer, widget = viewer_widget
    rng = np.random.default_rng(0)
    viewer.add_image(rng.random((3, 64, 64)).astype(np.float32), name="stack")
    viewer.dims.set_current_step(0, 1)
    with qtbot.waitSignal(widget.run_finished, timeout=60_000):
        widget.run()
        viewer.dims.set_current_step(0, 2)
    assert sorted(widget.current_record().results) == [(1,)]  # the slice shown at Run
    overlay = text_overlay(viewer)
    assert overlay.visible and "slice 2 has no result" in overlay.text


def test_remaining_slices_refuse_another_model(viewer_widget, run_and_wait, qtbot,
                                               fresh_tiny_backbone):
    viewer, widget = viewer_widget
    rng = np.random.default_rng(0)
    viewer.add_image(rng.random((2, 64, 64)).astype(np.float32), name="stack")
    run_and_wait(widget)
    widget.set_model(fresh_tiny_backbone, name="another")
    assert widget.run_remaining() is None
    assert "choose those again" in widget.run_panel.status_label.text()
    assert sorted(widget.current_record().results) == [(0,)]


# ---- 5. small items ------------------------------------------------------------------------------
def test_outline_closes_at_the_image_edge_when_everything_is_significant(viewer_widget,
                                                                         run_and_wait,
                                                                         cells_image, qtbot):
    from napari_attnreg.core.results.display import SIGNIFICANT_RGB

    viewer, widget = viewer_widget
    viewer.window.show()
    image = viewer.add_image(cells_image, name="cells")
    presets = widget.options.controls["preset"]
    presets.setCurrentIndex(presets.findData("directional"))
    run_and_wait(widget)
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.q_th_slider.setValue(1.0)  # every patch significant
    record = widget.current_record()
    assert record.shown(()).significant().all()
    image.visible = False
    for kind, layer in record.outputs.items():
        layer.visible = kind == "significant"
    viewer.reset_view()
    shot = viewer.screenshot(canvas_only=True, flash=False)[..., :3].astype(int)
    outline = np.all(np.abs(shot - np.array(SIGNIFICANT_RGB)) < 40, axis=-1)
    # before: nothing was drawn at all (no boundary inside a fully significant map)
    assert outline.any()
    rows, cols = np.nonzero(outline)
    # a frame around the image: drawn near all four edges, and not in the middle
    h, w = rows.max() - rows.min(), cols.max() - cols.min()
    assert h > 0.5 * shot.shape[0] or w > 0.5 * shot.shape[1]
    middle = outline[rows.min() + h // 4: rows.max() - h // 4, cols.min() + w // 4:
                     cols.max() - w // 4]
    assert not middle.any()


def test_colorbars_are_titled_with_their_map(viewer_widget, run_and_wait, cells_image):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    for kind in ("attention", "pvalue", "posterior", "regularized"):
        layer = widget.current_record().outputs[kind]
        assert layer.colorbar.visible
        assert layer.name_overlay.visible and layer.name_overlay.position == \
            layer.colorbar.position  # tiled beside its own bar, saying which map it is


def test_preferences_name_each_setting_as_the_dock_does():
    from napari_attnreg._napari.settings import _schema
    from napari_attnreg.core.run.options import option

    schema = _schema()
    for key in ("n_boot", "device", "preset"):
        assert option(key).label in schema[key].title, key
    # "Null images" is the dock's null-generator choice, never the number B
    assert option("method").label not in schema["n_boot"].title


def test_catalogue_access_link_is_readable_on_every_napari_theme(qtbot):
    import re

    from napari.utils.theme import available_themes, get_theme

    from napari_attnreg._napari.model_picker import CataloguePicker
    from napari_attnreg._napari.status import contrast, link_color

    for theme in available_themes():
        background = get_theme(theme).background.as_hex()
        assert contrast(link_color(background), background) >= 4.5, theme
    picker = CataloguePicker()
    qtbot.addWidget(picker)
    picker.set_model_id("uni")  # gated: the label links to the access request page
    color = re.search(r"<a style='color:(#[0-9a-fA-F]{6})'", picker.access_label.text())
    assert color is not None  # Qt's default link blue is unreadable on the dark theme
    assert contrast(color.group(1), get_theme("dark").background.as_hex()) >= 4.5


def test_help_link_opens_the_method_page_rendered_not_raw_markdown(qtbot, monkeypatch):
    from pathlib import Path
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    from qtpy.QtGui import QDesktopServices

    from napari_attnreg._napari import status
    from napari_attnreg.core.docs import docs_markdown

    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toString()))
    label = status.help_link()
    qtbot.addWidget(label)
    assert not label.openExternalLinks()  # the link is ours to handle
    label.linkActivated.emit(status.HELP_HREF)
    assert len(opened) == 1 and opened[0].endswith("method.html")
    html = Path(url2pathname(urlparse(opened[0]).path)).read_text(encoding="utf-8")
    title = docs_markdown("method").read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
    assert "<html" in html and title in html and "\n# " not in html


def test_run_shortcut_is_listed_in_preferences_shortcuts(viewer_widget, qtbot):
    from napari._qt.widgets.qt_keyboard_settings import ShortcutEditor
    from napari.utils.interactions import Shortcut

    from napari_attnreg._napari.run_panel import RUN_SHORTCUT

    editor = ShortcutEditor()
    qtbot.addWidget(editor)
    editor.layer_combo_box.setCurrentText(ShortcutEditor.VIEWER_KEYBINDINGS)
    table = editor._table
    rows = {table.item(r, editor._action_name_col).text(): table.item(r, editor._shortcut_col)
            .text() for r in range(table.rowCount())}
    ours = [name for name in rows if name.startswith("Attention Regularization: Run")]
    assert ours, "the run action is not in Preferences ▸ Shortcuts"
    assert rows[ours[0]] == Shortcut(RUN_SHORTCUT).platform


def test_a_rebound_run_shortcut_runs_and_the_old_one_does_not(viewer_widget, cells_image,
                                                               qtbot):
    from napari.components import ViewerModel
    from napari.utils.action_manager import action_manager
    from napari.utils.key_bindings import KeyBinding

    from napari_attnreg._napari.run_panel import RUN_ACTION, RUN_SHORTCUT

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    action_manager.unbind_shortcut(RUN_ACTION)  # what Preferences ▸ Shortcuts does
    action_manager.bind_shortcut(RUN_ACTION, "Control-Alt-R")
    try:
        assert KeyBinding.from_str(RUN_SHORTCUT) not in ViewerModel.class_keymap
        action = ViewerModel.class_keymap[KeyBinding.from_str("Control-Alt-R")]
        with qtbot.waitSignal(widget.run_finished, timeout=60_000):
            action(viewer)
    finally:
        action_manager.unbind_shortcut(RUN_ACTION)  # restored as the plugin binds it
        action_manager.bind_shortcut(RUN_ACTION, KeyBinding.from_str(RUN_SHORTCUT))


# ---- 6. figure export -------------------------------------------------------------------------------
def test_export_figure_is_the_result_at_native_resolution_not_the_canvas(
        viewer_widget, run_and_wait, cells_image, tmp_path):
    import imageio.v3 as iio

    from napari_attnreg._napari.figure import export_figure

    viewer, widget = viewer_widget
    viewer.window.show()
    viewer.add_image(cells_image, name="cells")
    viewer.add_image(np.ones((400, 400)), name="another image", colormap="red")
    widget.set_layer(viewer.layers["cells"])
    run_and_wait(widget)
    record = widget.current_record()
    path = export_figure(viewer, record, viewer.layers["cells"], tmp_path / "figure")
    figure = iio.imread(path)
    h, w = cells_image.shape
    # the image drawn at a whole multiple of its own pixels (never fewer), the strip beside
    assert figure.shape[0] >= h and figure.shape[1] > w
    # nothing of the other image (red) made it into the figure
    rgb = figure[..., :3].astype(int)
    red = (rgb[..., 0] > 200) & (rgb[..., 1] < 40) & (rgb[..., 2] < 40)
    assert red.mean() < 0.001
    assert widget.figure_button.toolTip()


def test_export_figure_of_fluorescence_channels_draws_the_channels_analysed(
        viewer_widget, run_and_wait, tmp_path):
    """A 16-bit image with its channels first (DAPI/GFP/mCherry-like), run on channels 0 and
    2: the figure drew the raw 16-bit channels as RGB (black), or the first channel alone
    when fewer than three were analysed."""
    import imageio.v3 as iio

    from napari_attnreg._napari.figure import export_figure, plane_image

    viewer, widget = viewer_widget
    yy, xx = np.mgrid[0:128, 0:128]
    centres = ((30, 30), (64, 64), (100, 100))  # one blob per channel
    cyx = np.stack([200 + 3000 * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 60)
                    for cy, cx in centres]).astype(np.uint16)
    layer = viewer.add_image(cyx, name="fluo")
    widget.source.channel_axis_combo.setCurrentIndex(
        widget.source.channel_axis_combo.findData(0))
    widget.source.channels_edit.setText("0,2")
    run_and_wait(widget)
    record = widget.current_record()
    image = plane_image(layer, record, ())
    assert image.shape == (128, 128, 2) and 0 <= image.min() and image.max() <= 1
    assert image[30, 30, 0] > 0.9 and image[100, 100, 0] < 0.1  # channel 0 first
    assert image[100, 100, 1] > 0.9 and image[30, 30, 1] < 0.1  # channel 2 next
    assert image[64, 64].max() < 0.1  # channel 1 was not analysed, so not drawn
    figure = iio.imread(export_figure(viewer, record, layer, tmp_path / "fluo.png"))
    k = figure.shape[0] // 128  # the image is drawn at k figure pixels per image pixel
    red = figure[30 * k + k // 2, 30 * k + k // 2, :3].astype(int)
    green = figure[100 * k + k // 2, 100 * k + k // 2, :3].astype(int)
    # under the map's overlay: channel 0 red, channel 2 green, channel 1 (centre) not drawn
    assert red[0] > 80 and red[1] < 20 and green[1] > 80 and green[0] < 20
    assert figure[64 * k, 64 * k, :3].max() < 20


def test_export_figure_draws_and_writes_off_the_gui_thread(
        viewer_widget, run_and_wait, cells_image, tmp_path, monkeypatch, qtbot, notifications):
    """*Export figure…* draws and writes on a worker thread, the button disabled meanwhile: a
    slide's figure at level 0 took half a minute on the GUI thread, the window frozen."""
    import threading

    from qtpy.QtWidgets import QFileDialog

    from napari_attnreg._napari import figure

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    drawn = threading.Event()
    release = threading.Event()
    threads = []

    def slow_figure(result, image, path, **kwargs):
        threads.append(threading.current_thread() is threading.main_thread())
        drawn.set()
        release.wait(timeout=10)
        path.write_bytes(b"png")
        return path

    monkeypatch.setattr(figure, "publication_figure", slow_figure)
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda *a, **k: (str(tmp_path / "fig.png"), "")))
    button = widget.figure_button
    button.click()
    assert not release.is_set()  # the click returned before the figure was written
    assert not button.isEnabled() and button.text() == "Exporting figure…"
    qtbot.waitUntil(drawn.is_set, timeout=10_000)
    release.set()
    qtbot.waitUntil(button.isEnabled, timeout=10_000)
    assert threads == [False]
    assert button.text() == "Export figure…" and (tmp_path / "fig.png").is_file()
    assert f"Figure written to {tmp_path / 'fig.png'}" in [n.message for n in notifications]
