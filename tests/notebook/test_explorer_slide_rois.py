"""Regions of interest on a slide in the explorer: drawn on its strided picture, measured on
the result's pixels at whatever level it analysed, glass left out, exported in QuPath's frame."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

from napari_attnreg.core.stats.roi import NOT_TESTED, roi_table  # noqa: E402
from napari_attnreg.io.slides import open_slide  # noqa: E402
from napari_attnreg.notebook import AttentionExplorer  # noqa: E402

SIZE = 1024
TISSUE = 560  # tissue rows/cols 0..559 of level 0; glass beyond
FAST = {"n_boot": 4, "device": "cpu", "view": "image", "tiled": True, "seed": 0}
#: Pixel edges (half-integers) of a rectangle in level-0 pixels: rows 200..799, cols
#: 100..399 of level 0 whichever way its edges are rounded; straddles tissue and glass.
RECT = (199.5, 99.5, 799.5, 399.5)


def _aperio(w: int, h: int) -> str:
    return (f"Aperio Image Library v10.0.50\n{w}x{h} [0,0 {w}x{h}] (256x256) RAW/RGB"
            "|AppMag = 40|MPP = 0.25")


@pytest.fixture(scope="module")
def slide(tmp_path_factory) -> Path:
    """An Aperio-style SVS of 1024², levels 1/2 and 1/4, a thumbnail; tissue top left, glass elsewhere."""
    rng = np.random.default_rng(0)
    img = np.full((SIZE, SIZE, 3), 236, np.uint8)
    stain = rng.random((TISSUE, TISSUE, 3)) * 90 + np.array([130, 40, 120])
    img[:TISSUE, :TISSUE] = stain.clip(0, 255).astype(np.uint8)
    path = tmp_path_factory.mktemp("slides") / "slide.svs"
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=_aperio(SIZE, SIZE), photometric="rgb",
                  metadata=None)
        tif.write(img[::16, ::16].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)  # an SVS's second page: its thumbnail
        for k in (2, 4):
            tif.write(img[::k, ::k].copy(), tile=(256, 256),
                      description=_aperio(SIZE // k, SIZE // k), photometric="rgb",
                      metadata=None)
    return path


def _by_hand(result, k: int) -> np.ndarray:
    """RECT as a mask in the result's pixels, counted by hand: level-0 pixel edges 199.5 and
    799.5 are level-k edges (e + 0.5)/k − 0.5, whose pixel centres lie between them."""
    mask = np.zeros(result.image_shape, dtype=bool)
    r0, c0, r1, c1 = ((e + 0.5) / k - 0.5 for e in RECT)
    mask[math.ceil(r0):math.floor(r1) + 1, math.ceil(c0):math.floor(c1) + 1] = True
    return mask


def _same_rows(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for key, value in w.items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(g[key]), key
            else:
                assert g[key] == value, (key, g[key], value)


def _drag(explorer: AttentionExplorer, y0: float, x0: float, y1: float, x1: float) -> None:
    """A rectangle dragged on the view, as the mouse's press and release give it."""
    view = explorer.canvas.view
    view._rectangle_done(SimpleNamespace(xdata=x0, ydata=y0), SimpleNamespace(xdata=x1, ydata=y1))


@pytest.mark.parametrize(("options", "level", "k"), [
    ({}, 0, 1), ({"level": 1}, 1, 2), ({"mpp": 0.75}, 1, 3)], ids=["level0", "level1", "mpp"])
def test_a_region_drawn_on_a_slide_is_measured_on_the_result_pixels(slide, options, level, k):
    # k: full-resolution pixels per pixel of the result (level 1 resampled ×1.5 for 0.75 µm)
    pytest.importorskip("ipympl")
    ex = AttentionExplorer(str(slide), "demo", **{**FAST, "view": "ipympl"}, **options)
    panel = ex.roi_panel
    # before: the tools were off on a slide and add_roi refused it ("held in memory")
    assert not panel.draw.disabled and not panel.export.disabled
    assert ex.image_panel.plane_shape == (SIZE, SIZE)  # the picture's frame: level 0
    ex.state.draw_mode = "rectangle"
    _drag(ex, *RECT)  # before any run: kept, and measured once there is a result
    assert panel.n_rois == 1 and "run the analysis" in panel.table.value
    result = ex.run(wait=True)
    assert result is not None, ex.status
    # a tiled run analyses whole patches (8 px): 1024 / 3 = 341 px gives 336
    assert result.image_shape == (round(SIZE / k) // 8 * 8,) * 2
    assert result.metadata["slide_downsample"] == k
    glass = np.isnan(result.evidence)
    assert glass.any() and not glass.all()  # the automatic tissue mask left glass out
    mask = _by_hand(result, k)
    want = roi_table(result, mask)
    got = ex.roi_table()
    _same_rows(got, want)
    # the glass under the region is not counted as tested: fewer tokens than it covers
    member = result.token_coverage(mask) >= 0.5
    assert 0 < got[0]["n_tokens"] == int((member & ~glass).sum()) < int(member.sum())
    assert got[0]["area_px"] == 600 * 300 // k**2
    # where it lies in QuPath's frame: level-0 pixels, the slide's corner at 0
    assert (got[0]["x_min"], got[0]["y_min"], got[0]["x_max"], got[0]["y_max"]) == \
        (100.0, 200.0, 400.0, 800.0)
    assert got[0]["full_resolution_per_pixel"] == k and got[0]["slide_level"] == level
    # its edge is drawn on the view where it was dragged: the display grid shows 768 of the
    # picture's 1024 pixels a side (level-0 rows 200..799: display rows 150..599)
    rows, cols = np.nonzero(np.all(ex.rendered == (255, 215, 0), axis=-1))
    width = ex.canvas.line_width()
    assert abs(rows.min() - 150) <= width and abs(rows.max() - 599) <= width
    assert abs(cols.min() - 75) <= width and abs(cols.max() - 299) <= width
    ex.close()


def test_a_coarser_level_opened_by_the_caller_and_a_region_on_glass(slide, tmp_path):
    # the picture is the opened level's (level 1: 512², 2 level-0 pixels each)
    ex = AttentionExplorer(open_slide(slide, level=1), "demo", **FAST)
    assert ex.image_panel.plane_shape == (512, 512)
    half = tuple((e + 0.5) / 2 - 0.5 for e in RECT)
    assert ex.add_roi(rectangle=half) == 1
    assert ex.add_roi(polygon=[(400, 400), (400, 500), (500, 500), (500, 400)]) == 2  # glass
    result = ex.run(wait=True)
    assert result is not None, ex.status
    mask = _by_hand(result, 2)
    labels = mask.astype(np.int32)
    labels[400:501, 400:501] = 2
    got = ex.roi_table()
    _same_rows(got, roi_table(result, labels))
    assert got[1]["n_tokens"] == 0 and got[1]["enrichment_test_note"] == NOT_TESTED
    assert (got[0]["x_min"], got[0]["y_min"], got[0]["x_max"], got[0]["y_max"]) == \
        (100.0, 200.0, 400.0, 800.0)
    np.testing.assert_array_equal(ex.roi_labels, labels)
    # the CSV: the rows, where they lie and the run's provenance
    with open(ex.export_roi_csv(tmp_path / "rois.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["label"] for r in rows] == ["1", "2"] and rows[0]["n_tokens"] == str(
        got[0]["n_tokens"])
    assert rows[0]["x_max"] == "400.0" and rows[0]["full_resolution_per_pixel"] == "2.0"
    assert rows[0]["source_image"] and rows[0]["n_boot"] == "4"
    ex.close()


def test_a_slide_region_needs_shapes_and_an_area(slide):
    from napari_attnreg.notebook.explorer import NO_CONCEPT_ON_DISK, NO_MASK_ON_SLIDE
    from napari_attnreg.notebook.roi_panel import NO_SLIDE_ROIS

    ex = AttentionExplorer(str(slide), "demo", **FAST)
    assert "draw one on the slide" in ex.roi_panel.table.value and NO_SLIDE_ROIS
    with pytest.raises(ValueError, match="shapes on its picture"):
        ex.add_roi(mask=np.ones((SIZE, SIZE), bool))
    with pytest.raises(ValueError) as refused:
        ex.set_roi(np.ones((SIZE, SIZE), bool))
    assert str(refused.value) == NO_MASK_ON_SLIDE
    with pytest.raises(ValueError, match="covers none of the slide"):
        ex.add_roi(rectangle=(SIZE + 10, 0, SIZE + 50, 40))
    with pytest.raises(ValueError, match="three"):
        ex.add_roi(polygon=[(0, 0), (5, 5)])
    assert ex.roi_panel.n_rois == 0
    with pytest.raises(ValueError) as refused:
        ex._concept_source()
    assert str(refused.value) == NO_CONCEPT_ON_DISK
    ex.add_roi(rectangle=RECT)
    ex.clear_rois()
    assert ex.roi_panel.n_rois == 0
    with pytest.raises(ValueError, match="No regions"):
        ex.export_roi_geojson("rois.geojson")
    # an image in memory exports its regions too (their pixels' outlines), once it has some
    ex.set_image(np.random.default_rng(0).random((64, 64)))
    assert ex.buttons["geojson"].layout.display is None
    with pytest.raises(ValueError, match="No regions to export. No ROIs: draw one"):
        ex.export_roi_geojson("rois.geojson")
    ex.close()


def test_a_result_too_large_for_a_label_image_is_measured_all_the_same(slide, monkeypatch,
                                                                       tmp_path):
    # a level-0 run of a whole slide (50,000² px) got "Run at a coarser level" instead of a
    # table: its regions became a label image of the whole result
    from napari_attnreg.core.stats import roi as core_roi
    from napari_attnreg.notebook import roi_panel

    ex = AttentionExplorer(str(slide), "demo", **{**FAST, "level": 2})
    ex.add_roi(rectangle=RECT)
    assert ex.run(wait=True) is not None, ex.status
    want = roi_table(ex.session.shown(), ex.roi_labels)
    monkeypatch.setattr(roi_panel, "MAX_ROI_PIXELS", 100)
    ex.display.update_roi_table()
    _same_rows(ex.roi_table(), want)
    assert ex.roi_panel.table.value.count("<tr>") == 2
    with pytest.raises(ValueError, match="roi_table"):  # a label image is still refused
        _ = ex.roi_labels
    # regions truly too large to rasterize say what to do, and still go to QuPath
    monkeypatch.setattr(core_roi, "MAX_RASTER_PIXELS", 100)
    ex.add_roi(rectangle=(0, 0, 300, 300))
    assert "coarser level or resolution" in ex.roi_panel.table.value
    with pytest.raises(ValueError, match="coarser level"):
        ex.roi_table()
    doc = json.loads(ex.export_roi_geojson(tmp_path / "rois.geojson").read_text())
    assert doc["features"][0]["properties"]["measurements"] == {}
    assert "coarser level" in doc["properties"]["note"]
    ex.close()


def test_the_regions_exported_as_geojson_lie_on_the_slide_in_qupath(slide, tmp_path):
    from napari_attnreg.io.geojson import read_geojson_rois

    ex = AttentionExplorer(open_slide(slide, level=1), "demo", **FAST)
    ex.add_roi(rectangle=tuple((e + 0.5) / 2 - 0.5 for e in RECT))
    assert ex.run(wait=True) is not None, ex.status
    path = ex.export_roi_geojson(tmp_path / "rois")
    assert path.suffix == ".geojson"
    doc = json.loads(path.read_text())
    ring = np.asarray(doc["features"][0]["geometry"]["coordinates"][0])
    assert ring[:, 0].min() == 100 and ring[:, 0].max() == 400  # x: level-0 pixels
    assert ring[:, 1].min() == 200 and ring[:, 1].max() == 800
    props = doc["features"][0]["properties"]
    assert props["classification"]["name"] == "ROI" and props["name"] == "ROI 1"
    assert props["measurements"]["n_tokens"] == ex.roi_table()[0]["n_tokens"]
    # the panel's button writes beside the CSV path
    assert ex.buttons["geojson"].layout.display is None
    ex.roi_panel.csv_path.value = str(tmp_path / "table.csv")
    ex.buttons["geojson"].click()
    assert json.loads((tmp_path / "table.geojson").read_text()) == doc, ex.status
    assert "QuPath" in ex.status
    # read back as QuPath's export: the same region at full resolution
    labels = read_geojson_rois(path, (SIZE, SIZE))
    rows, cols = np.nonzero(labels)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (200, 799, 100, 399)
    # and taken in again as ROIs: the same region on the picture, the same row
    drawn, before = [v.copy() for v in ex.roi_panel.polygons], ex.roi_table()
    ex.clear_rois()
    assert ex.add_rois_from_geojson(path) == [1]
    np.testing.assert_allclose(ex.roi_panel.polygons[0], drawn[0])
    assert ex.roi_table()[0]["area_px"] == before[0]["area_px"]
    ex.close()


def test_a_threshold_move_does_not_rasterize_the_regions_again(slide, monkeypatch):
    # every slider move redraws the table: rasterizing a level-0 result's worth of pixels
    # for each would make the sliders lag on a slide
    from napari_attnreg.notebook import roi_panel

    calls = []
    rasterize = roi_panel.polygon_tokens
    monkeypatch.setattr(roi_panel, "polygon_tokens",
                        lambda *a, **k: calls.append(1) or rasterize(*a, **k))
    ex = AttentionExplorer(str(slide), "demo", **{**FAST, "level": 2})
    ex.add_roi(rectangle=RECT)
    assert ex.run(wait=True) is not None, ex.status
    before, table = len(calls), ex.roi_panel.table.value
    assert before >= 1 and "<tr>" in table
    for p in (0.2, 0.3):
        ex.state.p_th = p  # what the slider does
    assert len(calls) == before
    ex.add_roi(rectangle=(0, 0, 300, 300))  # a new region is rasterized, once
    assert len(calls) == before + 1 and ex.roi_panel.table.value.count("<tr>") == 3
    ex.close()


def test_a_region_lies_where_drawn_on_a_picture_read_from_a_coarser_level(slide):
    from napari_attnreg.notebook.image_panel import OVERVIEW_PER_DISPLAY

    # 256 display pixels a side: the picture is a strided read of level 1, not level 0; the
    # view's frame (and so a region's coordinates) stays level 0's
    ex = AttentionExplorer(str(slide), "demo", max_display=256, **FAST)
    source = ex.image_panel.source
    assert not source.image.level_shown(OVERVIEW_PER_DISPLAY * 256 * 256)
    assert ex.image_panel.plane_shape == (SIZE, SIZE) and ex.image_panel.grid.shape == (256, 256)
    ex.add_roi(rectangle=RECT)
    rows, cols = np.nonzero(np.all(ex.rendered == (255, 215, 0), axis=-1))
    width = ex.canvas.line_width()  # level-0 rows 200..799 are display rows 50..199
    assert abs(rows.min() - 50) <= width and abs(rows.max() - 199) <= width
    assert abs(cols.min() - 25) <= width and abs(cols.max() - 99) <= width
    ex.close()
