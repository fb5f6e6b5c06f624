"""The significant outline: thin on screen at any zoom, around exactly the significant patches,
leaving the patch it marks visible."""

from __future__ import annotations

import numpy as np
from shapely import Point, Polygon


def _mask(shape=(14, 14)) -> np.ndarray:
    mask = np.zeros(shape, dtype=np.int32)  # the cells image's token grid on the tiny ViT
    mask[2, 2] = 1  # a lone patch
    mask[5:7, 4:6] = 1  # a 2x2 region
    return mask


def _set_significant(viewer, labels, mask):
    from napari_attnreg._napari.layers import OUTLINE_SUPERSAMPLE
    from napari_attnreg._napari.outline import sync_outline

    k = OUTLINE_SUPERSAMPLE
    labels.data = np.kron(mask, np.ones((k, k), dtype=np.int32))
    return sync_outline(viewer, labels)


def test_outline_surrounds_exactly_the_significant_patches(viewer_widget, run_and_wait,
                                                          cells_image, qtbot):
    from napari_attnreg._napari.layers import OUTLINE_SUPERSAMPLE as K

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    labels = viewer.layers["cells · significant"]
    outline = viewer.layers["cells · significant outline"]
    assert viewer.layers.index(outline) == viewer.layers.index(labels) + 1
    assert not labels.visible and outline.visible  # the outline draws the labels
    assert labels.contour == 0
    mask = _mask()
    assert _set_significant(viewer, labels, mask) is outline
    assert len(outline.data) == 2 and set(outline.shape_type) == {"path"}
    polygons = [Polygon(path) for path in outline.data]
    inside = np.array([[any(p.contains(Point(r * K + (K - 1) / 2, c * K + (K - 1) / 2))
                            for p in polygons) for c in range(mask.shape[1])]
                       for r in range(mask.shape[0])])
    np.testing.assert_array_equal(inside, mask == 1)
    # painting into the labels redraws the outline (an annotation the analyst adds)
    labels.brush_size = 8
    labels.paint((2, 2), 1, refresh=True)
    qtbot.waitUntil(lambda: len(outline.data) == 3, timeout=5000)


def test_outline_stays_thin_on_screen_when_zoomed(viewer_widget, run_and_wait, cells_image):
    from napari_attnreg._napari.outline import OUTLINE_PX, camera_of

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    outline = _set_significant(viewer, viewer.layers["cells · significant"], _mask())
    camera = camera_of(viewer)
    for zoom in (0.5, 2.0, 16.0):
        camera.zoom = zoom
        on_screen = np.asarray(outline.edge_width) * zoom * outline.scale[-1]
        np.testing.assert_allclose(on_screen, OUTLINE_PX, rtol=1e-6)


def test_a_lone_significant_patch_stays_visible_inside_its_outline(viewer_widget,
                                                                   run_and_wait, cells_image):
    from napari_attnreg._napari.outline import camera_of
    from napari_attnreg.core.results.display import SIGNIFICANT_COLOR

    viewer, widget = viewer_widget
    viewer.window.show()
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    outline = _set_significant(viewer, viewer.layers["cells · significant"], _mask())
    for layer in viewer.layers:
        layer.visible = layer is outline
    camera = camera_of(viewer)
    # the lone patch (16x16 image pixels) drawn 128 screen pixels wide
    camera.center = (2 * 16 + 7.5, 2 * 16 + 7.5)
    camera.zoom = 8.0
    shot = viewer.screenshot(canvas_only=True, flash=False)[..., :3].astype(int)
    color = (np.array([int(SIGNIFICANT_COLOR[i:i + 2], 16) for i in (1, 3, 5)]))
    marked = np.abs(shot - color).sum(axis=-1) < 60
    rows, cols = np.nonzero(marked)
    assert marked.any()
    box = marked[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
    assert box.shape[0] > 100 and box.shape[1] > 100  # the ring spans the zoomed patch
    assert box.mean() < 0.1  # a thin ring: the patch inside stays visible


def test_significant_regions_go_to_geojson_and_come_back_as_roi_shapes(
        viewer_widget, run_and_wait, cells_image, tmp_path, monkeypatch):
    from napari_attnreg._napari.figure import export_geojson
    from napari_attnreg.core.results.result import AttentionResult
    from napari_attnreg.io.geojson import read_geojson_rois

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    monkeypatch.setattr(AttentionResult, "significant",
                        lambda self, *a, **k: _mask(self.grid_shape) == 1)
    record = widget.current_record()
    # the exported regions are the patches the thresholds make significant
    path = export_geojson(viewer, record, tmp_path / "cells")
    result = record.shown(())
    covered = read_geojson_rois(path, result.image_shape) > 0
    np.testing.assert_array_equal(covered, result.to_pixels(result.significant().astype(float))
                                  > 0.5)
    assert covered.any()
    # QuPath-style annotations open as a Shapes layer the ROI panel takes
    import json

    from napari_attnreg.io.geojson import significant_features
    collection = significant_features(result)
    polygon = {"type": "Polygon", "coordinates": [[[16, 32], [32, 32], [32, 48], [16, 48],
                                                   [16, 32]]]}
    collection["features"] = [{"type": "Feature", "properties": {}, "geometry": polygon}]
    roi_file = tmp_path / "qupath.geojson"
    roi_file.write_text(json.dumps(collection), encoding="utf-8")
    (rois,) = viewer.open(str(roi_file), plugin="napari-attnreg")
    assert rois.name == "qupath ROIs" and list(rois.shape_type) == ["polygon"]
    np.testing.assert_allclose(rois.data[0].min(axis=0), [31.5, 15.5])  # (row, col) centres


def test_qupath_annotations_land_on_a_micron_scaled_image_in_its_pixels(
        viewer_widget, run_and_wait, cells_image, tmp_path, notifications):
    """GeoJSON annotations (image pixels) opened over a µm-scaled image that is no slide are
    laid on its pixels, in its units: left at scale 1 in pixel units they lay three times too
    far out (the ROI table measured the wrong region), and napari warned of inconsistent
    units at every layer the run added."""
    import json

    viewer, widget = viewer_widget
    image = viewer.add_image(cells_image, name="cells", scale=(0.325, 0.325),
                             translate=(10.0, 5.0), units="µm")
    polygon = {"type": "Polygon", "coordinates": [[[10, 20], [50, 20], [50, 60], [10, 60],
                                                   [10, 20]]]}  # x, y in pixel corners
    roi_file = tmp_path / "qupath.geojson"
    roi_file.write_text(json.dumps({"type": "FeatureCollection", "features": [
        {"type": "Feature", "properties": {}, "geometry": polygon}]}), encoding="utf-8")
    (rois,) = viewer.open(str(roi_file), plugin="napari-attnreg")
    np.testing.assert_allclose(rois.scale, image.scale)
    np.testing.assert_allclose(rois.translate, image.translate)
    assert tuple(rois.units) == tuple(image.units)
    # the corners' pixel centres lie on the image's same pixels
    for vertex in rois.data[0]:
        np.testing.assert_allclose(image.world_to_data(rois.data_to_world(vertex)), vertex)
    notifications.clear()
    run_and_wait(widget)
    assert not [n for n in notifications if "Inconsistent units" in str(n.message)]
    assert widget.roi_panel.current_layer() is rois
    [row] = widget.roi_panel.rows
    assert row["area_px"] == 40 * 40


def test_qupath_annotations_with_holes_and_parts_are_one_roi_each_named_as_in_qupath(
        viewer_widget, run_and_wait, cells_image, tmp_path, qtbot):
    """Only each polygon's outer ring was read: a hole (necrosis left out of a tumour) was
    measured as ROI, a two-part annotation became two ROIs (every later ROI id shifted), and
    QuPath's names and classes were dropped."""
    import json

    from napari_attnreg.io.geojson import read_geojson_rois

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    square = [[10, 10], [70, 10], [70, 60], [10, 60], [10, 10]]
    hole = [[30, 25], [30, 45], [50, 45], [50, 25], [30, 25]]
    features = [
        {"type": "Feature", "properties": {
            "objectType": "annotation", "name": "tumour",
            "classification": {"name": "Tumor", "color": [200, 0, 0]}},
         "geometry": {"type": "Polygon", "coordinates": [square, hole]}},
        {"type": "Feature", "properties": {"objectType": "annotation", "name": "islands"},
         "geometry": {"type": "MultiPolygon", "coordinates": [
             [[[75, 70], [95, 70], [95, 90], [75, 90], [75, 70]]],
             [[[5, 80], [25, 80], [25, 110], [5, 110], [5, 80]]]]}},
        {"type": "Feature", "properties": {
            "objectType": "detection", "classification": {"name": "Stroma"}},
         "geometry": {"type": "Polygon", "coordinates": [[[80, 10], [95, 10], [95, 30],
                                                          [80, 10]]]}},
    ]
    path = tmp_path / "qupath.geojson"
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}),
                    encoding="utf-8")
    (rois,) = viewer.open(str(path), plugin="napari-attnreg")
    assert len(rois.data) == 3  # one ROI per annotation
    assert list(rois.features["name"]) == ["tumour", "islands", ""]
    assert list(rois.features["classification"]) == ["Tumor", "", "Stroma"]
    assert list(rois.features["object_type"]) == ["annotation", "annotation", "detection"]
    np.testing.assert_allclose(rois.edge_color[0], [200 / 255, 0, 0, 1])
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.roi_panel.set_layer(rois)
    rows = blocker.args[0]
    expected = read_geojson_rois(path, cells_image.shape)  # pixel centres inside, holes out
    assert [r["label"] for r in rows] == [1, 2, 3]
    assert [r["area_px"] for r in rows] == [int((expected == i).sum()) for i in (1, 2, 3)]
    assert rows[0]["area_px"] == 60 * 50 - 20 * 20 and rows[1]["area_px"] == 20 * 20 + 20 * 30
    # the dock's table names them beside the ROI number
    table = widget.roi_panel.table
    headers = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    assert headers[:5] == ["ROI", "Name", "Classification", "Object type", "Area (px)"]
    assert [table.item(r, 1).text() for r in range(3)] == ["tumour", "islands", ""]
    # the features table keeps QuPath's names beside the statistics
    assert list(rois.features["name"]) == ["tumour", "islands", ""]
    assert rois.features["area_px"].tolist() == [r["area_px"] for r in rows]
    # ... and so does the CSV: each row says which annotation it measures
    import csv

    with open(widget.roi_panel.export_csv(tmp_path / "rois.csv"), newline="") as fh:
        read = list(csv.DictReader(fh))
    assert [(r["label"], r["name"], r["classification"]) for r in read] == [
        ("1", "tumour", "Tumor"), ("2", "islands", ""), ("3", "", "Stroma")]
    assert list(read[0])[:3] == ["label", "name", "classification"]


def test_drawn_rois_go_to_qupath_geojson_with_their_statistics_and_come_back_in_place(
        viewer_widget, run_and_wait, cells_image, tmp_path, qtbot):
    """napari exported only the significant regions: the analyst's own ROIs could not reach
    QuPath. They go out in QuPath's frame (pixel corners at whole numbers, y down) and open
    again where they were drawn, holes and names kept."""
    import json

    from napari_attnreg.io.geojson import read_geojson_rois

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells", scale=(0.5, 0.5), translate=(3, 4),
                     units="µm")
    run_and_wait(widget)
    square = [[10, 10], [70, 10], [70, 60], [10, 60], [10, 10]]
    hole = [[30, 25], [30, 45], [50, 45], [50, 25], [30, 25]]
    qupath = tmp_path / "qupath.geojson"
    qupath.write_text(json.dumps({"type": "FeatureCollection", "features": [
        {"type": "Feature", "properties": {"name": "tumour", "classification": {
            "name": "Tumor", "color": [200, 0, 0]}},
         "geometry": {"type": "Polygon", "coordinates": [square, hole]}}]}), encoding="utf-8")
    (rois,) = viewer.open(str(qupath), plugin="napari-attnreg")
    # and one drawn in napari (world µm): pixel centres rows 20-40, columns 70-90
    rois.add_rectangles(np.array([[(20 * 0.5 + 3), (70 * 0.5 + 4)],
                                  [(40 * 0.5 + 3), (90 * 0.5 + 4)]]) / rois.scale
                        - np.asarray(rois.translate) / rois.scale)
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.roi_panel.set_layer(rois)
    rows = blocker.args[0]
    out = widget.roi_panel.export_geojson(tmp_path / "mine")
    assert out.name == "mine.geojson"
    written = json.loads(out.read_text(encoding="utf-8"))["features"]
    assert [f["properties"]["name"] for f in written] == ["tumour", "ROI 2"]
    assert written[0]["properties"]["classification"]["name"] == "Tumor"
    assert len(written[0]["geometry"]["coordinates"]) == 2  # the hole is a ring of its own
    assert written[0]["properties"]["measurements"]["area_px"] == rows[0]["area_px"]
    ring = np.asarray(written[1]["geometry"]["coordinates"][0])
    # napari's pixel centres are QuPath's + 0.5 (x, y): no half-pixel shift, y not flipped
    np.testing.assert_allclose(ring.min(axis=0), [70.5, 20.5])
    np.testing.assert_allclose(ring.max(axis=0), [90.5, 40.5])
    np.testing.assert_allclose(np.asarray(written[0]["geometry"]["coordinates"][1]).min(axis=0),
                               [30, 25])  # the hole where QuPath had it
    # read back, the QuPath region covers the pixels the table measured, in the same place
    labels = read_geojson_rois(out, cells_image.shape)
    assert int((labels == 1).sum()) == rows[0]["area_px"] == 60 * 50 - 20 * 20
    (again,) = viewer.open(str(out), plugin="napari-attnreg")
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.roi_panel.set_layer(again)
    assert [r["area_px"] for r in blocker.args[0]] == [r["area_px"] for r in rows]
    assert list(again.features["name"]) == ["tumour", "ROI 2"]
