"""The dock's ROI table on a slide run at a coarser level than its layer shows: shapes drawn
over the slide (level-0 pixels) measured as polygons give the rows of their label image on
the analysed pixels, and a shape smaller than an analysed pixel keeps a row."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

pytestmark = pytest.mark.gui

H, W = 1024, 448  # level 0; level 1 is 512 x 224


def _aperio(w: int, h: int) -> str:
    return (f"Aperio Image Library v10.0.50\n{w}x{h} [0,0 {w}x{h}] (128x128) RAW/RGB"
            "|AppMag = 20|MPP = 0.5")


@pytest.fixture(scope="module")
def two_level_slide(tmp_path_factory):
    """An Aperio SVS of two levels: glass in the top half, stained tissue in the bottom half."""
    rng = np.random.default_rng(5)
    img = np.full((H, W, 3), 236, np.uint8)
    stain = (rng.random((H, W, 3)) * 90 + np.array([130, 40, 120])).astype(np.uint8)
    img[H // 2:] = stain[H // 2:]
    path = tmp_path_factory.mktemp("rois") / "slide.svs"
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(128, 128), description=_aperio(W, H), photometric="rgb",
                  metadata=None)
        tif.write(img[::8, ::8].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)
        tif.write(img[::2, ::2].copy(), tile=(128, 128), description=_aperio(W // 2, H // 2),
                  photometric="rgb", metadata=None)
    return path


def _tiled_run_at_level_1(viewer, widget, run_and_wait, path):
    """Open the slide through the plugin and run it tiled at level 1; its layer."""
    [slide] = viewer.open(str(path), plugin="napari-attnreg")
    widget.options.controls["tiled"].setChecked(True)
    widget.options.set("level", 1)
    run_and_wait(widget, timeout=120_000)
    return slide


def test_slide_shapes_as_polygons_give_the_label_rows(two_level_slide, viewer_widget,
                                                       run_and_wait, monkeypatch, tmp_path):
    from napari_attnreg._napari import roi_geometry
    from napari_attnreg.core.stats.roi import NO_PIXELS, NOT_TESTED

    viewer, widget = viewer_widget
    slide = _tiled_run_at_level_1(viewer, widget, run_and_wait, two_level_slide)
    shapes = viewer.add_shapes(
        [np.array([[600.3, 40.7], [600.3, 300.2], [900.8, 300.2], [900.8, 40.7]]),  # tissue
         np.array([[700.0, 200.0], [980.0, 420.0], [1010.0, 150.0]]),  # over the first
         np.array([[40.0, 40.0], [40.0, 300.0], [300.0, 300.0], [300.0, 40.0]]),  # glass
         np.array([[550.0, 100.0], [30.0, 40.0]]),  # ellipse across both
         np.array([[800.1, 400.1], [800.1, 400.4], [800.4, 400.4]])],  # < a level-1 pixel
        shape_type=["polygon", "polygon", "rectangle", "ellipse", "polygon"], name="rois",
        scale=slide.scale, translate=slide.translate, units=slide.units)  # level-0 pixels
    widget.roi_panel.set_layer(shapes)
    label_rows = list(widget.roi_panel.rows)
    monkeypatch.setattr(roi_geometry, "LABEL_IMAGE_PIXELS", 0)
    widget.roi_panel.update_table()
    polygon_rows = widget.roi_panel.rows
    assert [r["label"] for r in label_rows] == [1, 2, 3, 4]  # the tiny one vanished
    assert [r["label"] for r in polygon_rows] == [1, 2, 3, 4, 5]
    for got, want in zip(polygon_rows, label_rows):
        for key, value in want.items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(got[key]), key
            else:
                assert got[key] == value, (want["label"], key, got[key], value)
    assert polygon_rows[2]["enrichment_test_note"] == NOT_TESTED
    assert polygon_rows[4]["area_px"] == 0
    assert polygon_rows[4]["enrichment_test_note"] == NO_PIXELS
    assert widget.roi_panel.table.rowCount() == 5
    # the CSV keeps every row
    text = widget.roi_panel.export_csv(tmp_path / "rois.csv").read_text()
    assert NO_PIXELS in text and NOT_TESTED in text


def test_slide_rois_go_to_geojson_in_full_resolution_pixels(two_level_slide, viewer_widget,
                                                             run_and_wait, tmp_path):
    """A slide run at level 1: the ROIs go to QuPath in level-0 pixels, where it puts them."""
    import json

    viewer, widget = viewer_widget
    slide = _tiled_run_at_level_1(viewer, widget, run_and_wait, two_level_slide)
    shapes = viewer.add_shapes(
        [np.array([[600.0, 40.0], [600.0, 300.0], [900.0, 300.0], [900.0, 40.0]])],
        shape_type="polygon", name="rois", scale=slide.scale, translate=slide.translate,
        units=slide.units)  # level-0 pixel centres
    widget.roi_panel.set_layer(shapes)
    assert widget.roi_panel.rows
    out = widget.roi_panel.export_geojson(tmp_path / "rois.geojson")
    (feature,) = json.loads(out.read_text(encoding="utf-8"))["features"]
    ring = np.asarray(feature["geometry"]["coordinates"][0])
    np.testing.assert_allclose(ring.min(axis=0), [40.5, 600.5])  # x, y: QuPath's frame
    np.testing.assert_allclose(ring.max(axis=0), [300.5, 900.5])
