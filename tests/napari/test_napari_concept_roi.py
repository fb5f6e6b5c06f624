"""'Concept from ROI' in the dock: a drawn ROI becomes the target of a class map.

Real viewer (Xvfb), a tiny random-init ViT; the concept must equal the core's
``concept_from`` on the same image and mask, and the run's displays must name the map.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from qtpy.QtCore import Qt

from napari_attnreg import concept_from

RECT = np.array([[20.0, 15.0], [20.0, 45.0], [50.0, 45.0], [50.0, 15.0]])
OTHER = np.array([[70.0, 55.0], [70.0, 90.0], [100.0, 90.0], [100.0, 55.0]])


@pytest.fixture
def dock(viewer_widget, cells_image):
    viewer, widget = viewer_widget
    layer = viewer.add_image(cells_image, name="cells")
    widget.set_layer(layer)
    widget.options.set("map", "cdam")
    return viewer, widget, layer


def _press(qtbot, widget):
    with qtbot.waitSignal(widget.concept.built, timeout=60_000) as blocker:
        qtbot.mouseClick(widget.concept.button, Qt.MouseButton.LeftButton)
    return blocker.args[0]


def test_a_drawn_rectangle_becomes_the_sessions_target(dock, qtbot, tiny_backbone,
                                                       cells_image):
    viewer, widget, _ = dock
    shapes = viewer.add_shapes([RECT], shape_type="rectangle", name="nuclei")
    vector = _press(qtbot, widget)
    mask = shapes.to_labels(labels_shape=cells_image.shape)
    expected = concept_from(cells_image, tiny_backbone, mask)
    target = widget.session.settings["target"]
    assert isinstance(target, np.ndarray) and target.shape == (tiny_backbone.embed_dim,)
    np.testing.assert_allclose(target, expected, rtol=1e-5, atol=1e-6)
    assert vector is target or np.array_equal(vector, target)
    assert widget.concept.label.text() == "target: concept from 1 region of nuclei"
    assert widget.options.value("target") is widget.concept.vector
    assert np.array_equal(widget.run_config().target, expected)


def test_the_concept_runs_and_every_display_names_the_map(dock, qtbot, run_and_wait,
                                                          tmp_path):
    viewer, widget, _ = dock
    viewer.add_shapes([RECT], shape_type="rectangle", name="nuclei")
    _press(qtbot, widget)
    outcome = run_and_wait(widget)
    assert outcome.ok, outcome.message
    record = widget.current_record()
    names = [layer.name for layer in record.outputs.values()]
    assert all(" · CDAM for concept · " in name for name in names), names
    raw = record.outputs["attention"]
    lo, hi = raw.contrast_limits
    assert lo == pytest.approx(-hi) and hi > 0  # a signed map's colour bar is centred at 0
    assert "RdBu" in raw.colormap.name
    assert "red for it, blue against it" in raw.metadata["attnreg"]["legend"]
    report = widget.inspector.inspect_world(viewer.layers["cells"].data_to_world((35, 30)))
    assert report is not None and ("map", "CDAM for concept") in report.values
    assert "CDAM for concept" in widget.inspector.label.text()
    # saved and reopened, the raw map keeps its diverging colormap (the concept in the files)
    from napari_attnreg._napari.io import read_saved_folder
    from napari_attnreg._napari.results_io import save_results

    written = save_results(viewer, record, [], tmp_path / "saved")
    reopened = {kw["name"]: kw for _, kw, _ in read_saved_folder(str(Path(written[0]).parent))}
    assert "RdBu" in reopened[raw.name]["colormap"].name


def test_without_a_roi_the_dock_says_what_to_draw(dock, qtbot):
    _, widget, _ = dock
    before = widget.session.settings.get("target")
    assert _press(qtbot, widget) is None
    assert "Draw rectangles or polygons in a Shapes layer" in widget.concept.label.text()
    assert widget.session.settings.get("target") == before


def test_an_empty_shapes_layer_is_no_roi(dock, qtbot):
    viewer, widget, _ = dock
    viewer.add_shapes(name="empty")
    assert _press(qtbot, widget) is None
    assert "'empty' has no region on 'cells'" in widget.concept.label.text()


def test_a_map_without_a_target_offers_cdam(dock, qtbot):
    viewer, widget, _ = dock
    widget.options.set("map", "attention")
    viewer.add_shapes([RECT], shape_type="rectangle", name="nuclei")
    assert _press(qtbot, widget) is None
    assert widget.concept.switch_button.isVisibleTo(widget.concept)
    assert "class map (cdam or gradcam)" in widget.concept.label.text()
    with qtbot.waitSignal(widget.concept.built, timeout=60_000) as blocker:
        qtbot.mouseClick(widget.concept.switch_button, Qt.MouseButton.LeftButton)
    assert widget.options.value("map") == "cdam" and blocker.args[0] is not None


def test_only_the_selected_shapes_and_labels_regions(dock, qtbot, tiny_backbone, cells_image):
    viewer, widget, _ = dock
    shapes = viewer.add_shapes([RECT, OTHER], shape_type="rectangle", name="nuclei")
    shapes.selected_data = {1}
    _press(qtbot, widget)
    assert widget.concept.label.text() == "target: concept from 1 region of nuclei"
    mask = np.zeros(cells_image.shape, bool)
    mask[70:101, 55:91] = True
    np.testing.assert_allclose(widget.session.settings["target"],
                               concept_from(cells_image, tiny_backbone, mask), atol=1e-5)
    labels = np.zeros(cells_image.shape, np.int32)
    labels[10:40, 10:40], labels[60:90, 50:90] = 3, 7
    viewer.add_labels(labels, name="painted")  # becomes the selected layer
    _press(qtbot, widget)
    assert widget.concept.label.text() == "target: concept from 2 regions of painted"


def test_clear_and_typing_a_target_forget_the_concept(dock, qtbot):
    viewer, widget, _ = dock
    viewer.add_shapes([RECT], shape_type="rectangle", name="nuclei")
    _press(qtbot, widget)
    qtbot.mouseClick(widget.concept.clear_button, Qt.MouseButton.LeftButton)
    assert widget.session.settings["target"] == "predicted"
    _press(qtbot, widget)
    qtbot.keyClicks(widget.options.controls["target"], "3")
    assert widget.concept.vector is None and widget.options.value("target") == "3"


def test_the_concept_sees_the_channels_as_the_run_does(viewer_widget, qtbot, tiny_backbone,
                                                      cells_image):
    viewer, widget = viewer_widget
    two = np.stack([cells_image, cells_image[::-1]]).astype(np.float32)  # (C, H, W)
    widget.set_layer(viewer.add_image(two, name="two channels"))
    source = widget.source
    source.channel_axis_combo.setCurrentIndex(source.channel_axis_combo.findData(0))
    source.merge_combo.setCurrentText("max")
    widget.options.set("map", "cdam")
    shapes = viewer.add_shapes([RECT], shape_type="rectangle", name="nuclei")
    _press(qtbot, widget)
    mask = shapes.to_labels(labels_shape=cells_image.shape)
    np.testing.assert_allclose(
        widget.session.settings["target"],
        concept_from(two, tiny_backbone, mask, channel_axis=0, merge="max"), atol=1e-5)
