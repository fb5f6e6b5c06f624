"""The notebook brings along what napari shows: the publication figure, GeoJSON, and what
"significant" means in its summary."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

from napari_attnreg.core.results.outline import mask_regions
from napari_attnreg.notebook import AttentionExplorer


@pytest.fixture
def explorer(blob_image, tiny_backbone):
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=8, device="cpu", view="image")
    yield ex
    ex.close()


def test_before_run_the_result_is_none_and_exports_say_to_run(explorer, tmp_path):
    assert explorer.result is None
    with pytest.raises(ValueError, match="press Run"):
        explorer.export_figure(tmp_path / "f.png")
    with pytest.raises(ValueError, match="press Run"):
        explorer.export_geojson(tmp_path / "r.geojson")


def test_figure_geojson_and_meaning_after_a_run(explorer, blob_image, tmp_path):
    import imageio.v3 as iio

    explorer.run(wait=True)
    result = explorer.result
    figure = iio.imread(explorer.export_figure(tmp_path / "cells.png"))
    assert figure.shape[0] >= blob_image.shape[0] and figure.shape[1] > blob_image.shape[1]
    path = explorer.export_geojson(tmp_path / "cells")
    collection = json.loads(path.read_text(encoding="utf-8"))
    assert len(collection["features"]) == len(mask_regions(result.significant()))
    assert "Significant =" in explorer.summary_panel.summary.value
    assert "half-patch blocks shuffled" in explorer.summary_panel.summary.value


def test_save_result_and_export_figure_buttons_write_the_result_on_screen(
        explorer, blob_image, tmp_path):
    # only explorer.save(...) / export_figure(...) existed: no button beside Export CSV
    from napari_attnreg.core.results.result import AttentionResult

    panel = explorer.export_panel
    panel.result_path.value = str(tmp_path)
    explorer.buttons["save"].click()  # before a run: said, nothing written
    assert "press Run" in explorer.status and not list(tmp_path.iterdir())
    explorer.run(wait=True)
    explorer.p_th = 0.2  # the thresholds chosen on screen go with the saved result
    explorer.buttons["save"].click()
    saved = tmp_path / "result.attnreg.npz"  # a folder gets the default name inside it
    assert str(saved) in explorer.status and "saved" in explorer.status
    assert AttentionResult.load(saved).thresholds["p_th"] == 0.2
    panel.figure_path.value = str(tmp_path / "cells")  # the right ending is added
    explorer.overlay = "attention"
    explorer.buttons["figure"].click()
    figure = tmp_path / "cells.png"
    assert str(figure) in explorer.status and figure.read_bytes()[:4] == b"\x89PNG"
    assert "Figure of the raw attention" in explorer.status  # the map drawn, as the menu says
    # a file there is never overwritten: the earlier output (or the image) stays
    for button, path in (("save", saved), ("figure", figure)):
        before = path.read_bytes()
        explorer.buttons[button].click()
        assert "already exists and is not overwritten" in explorer.status
        assert path.read_bytes() == before
    image = tmp_path / "blobs.tif"
    image.write_bytes(b"the analyst's image")
    panel.result_path.value = str(image)
    explorer.buttons["save"].click()
    assert image.read_bytes() == b"the analyst's image"
    assert AttentionResult.load(tmp_path / "blobs.tif.npz").image_shape == blob_image.shape


def test_the_csv_button_never_overwrites_an_earlier_table(explorer, tmp_path):
    explorer.run(wait=True)
    explorer.add_roi(rectangle=(10, 10, 60, 60))
    explorer.roi_panel.csv_path.value = str(tmp_path / "table")
    explorer.buttons["export"].click()
    table = tmp_path / "table.csv"
    before = table.read_text()
    explorer.p_th = 0.5
    explorer.buttons["export"].click()
    assert "already exists" in explorer.status and table.read_text() == before
    assert "never overwritten" in explorer.buttons["export"].tooltip  # said before the click


def test_the_figure_of_a_stack_is_drawn_over_the_plane_of_its_result(
        blob_image, tiny_backbone, tmp_path):
    # with another plane on screen, plane 1's map was drawn over that plane's pixels
    import imageio.v3 as iio

    stack = np.stack([blob_image, blob_image[::-1], blob_image[:, ::-1]])
    ex = AttentionExplorer(stack, tiny_backbone, n_boot=8, device="cpu", view="image")
    ex.slice_index = (1,)
    ex.run(wait=True)
    on_its_plane = iio.imread(ex.export_figure(tmp_path / "on.png"))
    ex.slice_index = (2,)
    elsewhere = iio.imread(ex.export_figure(tmp_path / "off.png"))
    np.testing.assert_array_equal(elsewhere, on_its_plane)
    ex.close()


def test_save_and_figure_into_a_folder_write_a_default_name_inside(explorer, tmp_path):
    explorer.run(wait=True)
    assert explorer.save(tmp_path) == tmp_path / "result.attnreg.npz"
    assert explorer.export_figure(tmp_path) == tmp_path / "figure.png"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figure.png", "result.attnreg.npz"]


def test_geojson_into_a_folder_writes_a_default_name_inside(explorer, tmp_path):
    # export_geojson(folder) wrote 'folder.geojson' beside the folder
    explorer.run(wait=True)
    folder = tmp_path / "qupath"
    folder.mkdir()
    assert explorer.export_geojson(folder) == folder / "significant.geojson"
    assert json.loads((folder / "significant.geojson").read_text())["type"] == \
        "FeatureCollection"
    assert explorer.export_geojson(tmp_path / "cells.GeoJSON") == tmp_path / "cells.GeoJSON"


def test_regions_on_an_image_in_memory_go_to_qupath_geojson_and_back_pixel_for_pixel(
        explorer, blob_image, tmp_path):
    # only a slide's regions could be exported: an image's said "export the table instead"
    from napari_attnreg.io.geojson import read_geojson_rois

    ring = np.zeros(blob_image.shape, bool)
    ring[20:40, 10:40] = True
    ring[25:30, 20:30] = False  # a hole
    explorer.add_roi(mask=ring)
    explorer.add_roi(polygon=[(45, 5), (45, 30), (60, 5)])
    explorer.run(wait=True)
    path = explorer.export_roi_geojson(tmp_path / "regions")
    assert path.name == "regions.geojson"
    features = json.loads(path.read_text(encoding="utf-8"))["features"]
    assert [f["properties"]["name"] for f in features] == ["ROI 1", "ROI 2"]
    first = features[0]["geometry"]["coordinates"]
    assert len(first) == 2 and np.asarray(first[0]).min(axis=0).tolist() == [10, 20]  # x, y
    rows = explorer.roi_table()
    assert [f["properties"]["measurements"]["area_px"] for f in features] == \
        [r["area_px"] for r in rows]
    back = read_geojson_rois(path, blob_image.shape)
    np.testing.assert_array_equal(back, explorer.roi_panel.labels)


def test_qupath_annotations_come_in_as_rois_and_round_trip(explorer, blob_image, tmp_path):
    # a notebook user had no way in for QuPath's annotations but to rasterize them by hand
    square = [[10, 10], [40, 10], [40, 30], [10, 30], [10, 10]]
    hole = [[20, 15], [20, 25], [30, 25], [30, 15], [20, 15]]
    qupath = tmp_path / "qupath.geojson"
    qupath.write_text(json.dumps({"type": "FeatureCollection", "features": [
        {"type": "Feature", "properties": {"objectType": "annotation", "name": "tumour"},
         "geometry": {"type": "Polygon", "coordinates": [square, hole]}},
        {"type": "Feature", "properties": {}, "geometry": {"type": "Point", "coordinates": [1, 1]}},
        {"type": "Feature", "properties": {}, "geometry": {"type": "Polygon", "coordinates": [
            [[900, 900], [950, 900], [950, 950], [900, 900]]]}},  # another image's
        {"type": "Feature", "properties": {}, "geometry": {"type": "Polygon", "coordinates": [
            [[5, 45], [25, 45], [25, 60], [5, 60], [5, 45]]]}},
    ]}), encoding="utf-8")
    assert explorer.add_rois_from_geojson(qupath) == [1, 2]
    assert "1 annotation(s) lie off the image" in explorer.status
    labels = explorer.roi_panel.labels
    assert (labels == 1).sum() == 30 * 20 - 10 * 10 and (labels == 2).sum() == 20 * 15
    assert labels[20, 25] == 0 and labels[12, 12] == 1  # the hole is no ROI; (row, col) = (y, x)
    explorer.run(wait=True)
    out = explorer.export_roi_geojson(tmp_path / "out.geojson")
    explorer.clear_rois()
    assert explorer.add_rois_from_geojson(out) == [1, 2]
    np.testing.assert_array_equal(explorer.roi_panel.labels, labels)  # in place, as drawn
    with pytest.raises(ValueError, match="No annotation of .* lies on this image"):
        bad = tmp_path / "far.geojson"
        bad.write_text(json.dumps({"type": "Polygon", "coordinates": [
            [[900, 900], [950, 900], [950, 950], [900, 900]]]}), encoding="utf-8")
        explorer.add_rois_from_geojson(bad)
