"""A tissue mask drawn in QuPath and exported as GeoJSON, given to a slide run.

Before, ``--tissue-mask outline.geojson`` (and ``regularize(path, tissue_mask=...)``) failed
with "not a readable mask image (OSError: Could not find a backend ...); check that the file
is complete", which sent the analyst looking for damage in a good file. QuPath writes the
polygons in the slide's full-resolution (level 0) pixels whatever level is shown, so a run at
a coarser level or resolution must divide them by the level's downsample: the tiles run are
those under the outline, the same tiles a mask image of the outline selects.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

from napari_attnreg.core.results.result import AttentionResult  # noqa: E402
from napari_attnreg.core.run.tissue import read_mask  # noqa: E402

H, W = 1000, 1400  # level 0, not a multiple of the stored 192-pixel tiles
# the outline, in level-0 pixels: a rectangle in the right part, with a square hole
OUTLINE = [[760, 430], [1380, 430], [1380, 980], [760, 980], [760, 430]]
HOLE = [[1000, 600], [1150, 600], [1150, 750], [1000, 750], [1000, 600]]


def _description(w: int, h: int) -> str:
    return (f"Aperio Image Library v11.2.1\n{w}x{h} [0,0 {w}x{h}] (192x192) RAW/RGB"
            "|AppMag = 20|MPP = 0.5")


@pytest.fixture(scope="module")
def slide(tmp_path_factory) -> Path:
    """Stained tissue over the whole slide (the automatic mask would keep every tile), levels
    at 1/2 and 1/4."""
    rng = np.random.default_rng(3)
    img = (rng.random((H, W, 3)) * 70 + [150, 60, 140]).astype(np.uint8)
    path = tmp_path_factory.mktemp("qupath") / "case 7.svs"
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(192, 192), description=_description(W, H), photometric="rgb",
                  metadata=None)
        # an Aperio file's second image is its thumbnail (tifffile reads it so)
        tif.write(img[::16, ::16].copy(), description="Aperio Image Library v11.2.1\nthumb",
                  photometric="rgb", metadata=None)
        for k in (2, 4):
            sub = img[::k, ::k].copy()
            tif.write(sub, tile=(192, 192), description=_description(*sub.shape[1::-1]),
                      photometric="rgb", metadata=None)
    return path


def _geojson(path: Path, rings: list) -> Path:
    feature = {"type": "Feature", "properties": {"objectType": "annotation",
                                                 "classification": {"name": "Tissue"}},
               "geometry": {"type": "Polygon", "coordinates": rings}}
    path.write_text(json.dumps({"type": "FeatureCollection", "features": [feature]}))
    return path


def _png_of_outline(path: Path) -> Path:
    """The same outline as a mask image of the whole slide at level 0."""
    from PIL import Image

    mask = np.zeros((H, W), np.uint8)
    (x0, y0), (x1, y1) = OUTLINE[0], OUTLINE[2]
    mask[y0:y1, x0:x1] = 255
    (hx0, hy0), (hx1, hy1) = HOLE[0], HOLE[2]
    mask[hy0:hy1, hx0:hx1] = 0
    Image.fromarray(mask).save(path)
    return path


def _run_cli(slide: Path, out: Path, *options: str) -> AttentionResult:
    from napari_attnreg.cli import main

    code = main(["run", str(slide), "--tiled", "--out", str(out), "--n-boot", "4",
                 "--device", "cpu", "--quiet", *options])
    assert code == 0, (out / "summary.csv").read_text()
    return AttentionResult.load(next(out.glob("*.attnreg.npz")))


def test_a_qupath_outline_selects_the_tiles_under_it_at_a_coarser_level(slide, tmp_path):
    outline = _geojson(tmp_path / "outline.geojson", [OUTLINE, HOLE])
    png = _png_of_outline(tmp_path / "outline.png")
    by_geojson = _run_cli(slide, tmp_path / "a", "--level", "1", "--tissue-mask", str(outline))
    by_png = _run_cli(slide, tmp_path / "b", "--level", "1", "--tissue-mask", str(png))
    tiles = np.asarray(by_geojson.null_summary["tissue_tiles"], bool)
    assert 0 < tiles.sum() < tiles.size
    # the same tiles as the outline drawn as a mask image of the whole slide
    np.testing.assert_array_equal(tiles, np.asarray(by_png.null_summary["tissue_tiles"], bool))
    md = by_geojson.metadata
    assert "outline.geojson" in md["tissue_mask"] and md["slide_level"] == 1
    # every tile run overlaps the outline, in level-0 pixels
    th, tw = md["tile_shape"]
    f = md["slide_downsample"]
    ys, xs = md["tile_origins_y"], md["tile_origins_x"]
    for k in np.flatnonzero(tiles):
        y, x = ys[k // len(xs)] * f, xs[k % len(xs)] * f
        assert y + th * f > OUTLINE[0][1] and x + tw * f > OUTLINE[0][0]


def test_regularize_places_a_geojson_mask_at_a_resolution(slide, tmp_path):
    from napari_attnreg import regularize
    from napari_attnreg.io.slides import open_slide

    outline = _geojson(tmp_path / "outline.geojson", [OUTLINE])
    by_path = regularize(str(slide), tiled=True, mpp=2.0, n_boot=4, device="cpu",
                         tissue_mask=str(outline))
    opened = regularize(open_slide(slide, mpp=2.0), tiled=True, n_boot=4, device="cpu",
                        tissue_mask=str(outline))
    everything = regularize(open_slide(slide, mpp=2.0), tiled=True, n_boot=4, device="cpu",
                            tissue_mask="auto")
    tiles = np.asarray(by_path.null_summary["tissue_tiles"], bool)
    np.testing.assert_array_equal(tiles, np.asarray(opened.null_summary["tissue_tiles"], bool))
    # the automatic mask keeps the whole (stained) slide; the outline only its right part
    assert np.asarray(everything.null_summary["tissue_tiles"], bool).all()
    assert 0 < tiles.sum() < tiles.size
    assert not tiles[0]  # the top-left tile lies outside the outline


def test_holes_are_not_tissue_and_the_mask_covers_the_whole_image(tmp_path):
    from napari_attnreg.io.geojson import geojson_tissue_mask

    outline = _geojson(tmp_path / "o.geojson", [OUTLINE, HOLE])
    mask = np.asarray(geojson_tissue_mask(outline, (H // 4, W // 4), 4.0))
    assert mask.shape == (H // 4, W // 4)
    assert mask[500 // 4, 800 // 4] and mask[950 // 4, 1370 // 4]
    assert not mask[675 // 4, 1075 // 4]  # in the hole
    assert not mask[100 // 4, 100 // 4]  # outside


def test_an_empty_or_misplaced_outline_is_a_clear_failed_row_and_the_batch_goes_on(
        slide, tmp_path):
    from napari_attnreg.cli import main
    from napari_attnreg.io.geojson import geojson_tissue_mask

    empty = tmp_path / "empty.geojson"
    empty.write_text(json.dumps({"type": "FeatureCollection", "features": []}))
    with pytest.raises(ValueError, match="no polygon"):
        geojson_tissue_mask(empty, (H, W))
    # coordinates far off the slide (another slide's annotations, or µm): named with the frame
    far = _geojson(tmp_path / "far.geojson", [[[9000, 9000], [9500, 9000], [9500, 9500],
                                               [9000, 9000]]])
    with pytest.raises(ValueError, match="1400x1000 full-resolution pixels"):
        geojson_tissue_mask(far, (H // 2, W // 2), 2.0)
    out = tmp_path / "out"
    code = main(["run", str(slide), "--tiled", "--level", "2", "--tissue-mask", str(far),
                 "--out", str(out), "--n-boot", "4", "--device", "cpu", "--quiet"])
    summary = (out / "summary.csv").read_text(encoding="utf-8")
    assert code == 1 and "lie outside the image" in summary


def test_the_core_names_a_geojson_mask_instead_of_calling_it_damaged(tmp_path):
    outline = _geojson(tmp_path / "o.geojson", [OUTLINE])
    with pytest.raises(ValueError, match="GeoJSON file") as err:
        read_mask(outline)
    assert "complete" not in str(err.value)


@pytest.mark.parametrize("geometry", [
    {"type": "Polygon", "coordinates": [100, 200]},  # flat
    {"type": "Polygon"},  # no coordinates
    {"type": "Polygon", "coordinates": [[[[0, 0], [9, 0], [9, 9], [0, 0]]]]},  # too deep
    {"type": "Blob", "coordinates": [[0, 0]]},  # no GeoJSON type
])
def test_a_malformed_outline_is_a_failed_row_naming_the_file_not_a_traceback(
        slide, tmp_path, capsys, geometry):
    """The reader let shapely's own error through: the command line printed 58 lines of
    "TypeError: 'int' object is not iterable" and stopped the batch."""
    from napari_attnreg.cli import main

    bad = tmp_path / "bad outline.geojson"
    bad.write_text(json.dumps({"type": "Feature", "properties": {}, "geometry": geometry}))
    out = tmp_path / "out"
    code = main(["run", str(slide), "--tiled", "--level", "2", "--tissue-mask", str(bad),
                 "--out", str(out), "--n-boot", "4", "--device", "cpu", "--quiet"])
    summary = (out / "summary.csv").read_text(encoding="utf-8")
    assert code == 1 and "bad outline.geojson: feature 1 holds a malformed GeoJSON" in summary
    assert "Traceback" not in capsys.readouterr().err


def test_a_file_of_points_is_refused_as_no_outline_not_as_rois(tmp_path):
    from napari_attnreg.io.geojson import geojson_tissue_mask

    points = tmp_path / "cells.geojson"
    points.write_text(json.dumps({"type": "Feature", "properties": {},
                                  "geometry": {"type": "Point", "coordinates": [5, 5]}}))
    with pytest.raises(ValueError, match="cells.geojson holds no polygon") as err:
        geojson_tissue_mask(points, (H, W))
    assert "ROI" not in str(err.value)


def test_an_outline_in_a_coarser_levels_pixels_is_warned_of(slide, tmp_path, capsys):
    """Drawn on level 2 and exported in its pixels, the outline lands in the top-left
    sixteenth of the slide: the run tested a few tiles and said nothing of why."""
    from napari_attnreg.cli import main

    coarse = _geojson(tmp_path / "level2.geojson", [[[x / 4, y / 4] for x, y in OUTLINE]])
    code = main(["run", str(slide), "--tiled", "--tissue-mask", str(coarse), "--out",
                 str(tmp_path / "out"), "--n-boot", "4", "--device", "cpu", "--quiet"])
    err = capsys.readouterr().err
    assert code == 0
    assert "attnreg: warning: tissue_mask: every polygon of level2.geojson lies in the " \
           "top-left quarter" in err and "downsample" in err
    # the right outline, in full-resolution pixels, at a coarser level: no warning
    right = _geojson(tmp_path / "right.geojson", [OUTLINE])
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("error")
        from napari_attnreg.io.geojson import geojson_tissue_mask

        geojson_tissue_mask(right, (H // 4, W // 4), 4.0)
