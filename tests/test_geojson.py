"""GeoJSON exchange (QuPath): significant regions out, polygon annotations in as ROIs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from napari_attnreg import regularize
from napari_attnreg.io.geojson import (
    polygons_to_labels,
    read_geojson_polygons,
    read_geojson_rois,
    significant_features,
    write_geojson,
)


@pytest.fixture
def result_with_regions(tiny_backbone, blob_image, monkeypatch):
    result = regularize(blob_image, tiny_backbone, n_boot=4, device="cpu")
    mask = np.zeros(result.grid_shape, bool)
    mask[1, 1] = True  # a lone patch
    mask[4:7, 5:8] = True  # a ring of patches around a hole
    mask[5, 6] = False
    monkeypatch.setattr(type(result), "significant", lambda self, *a, **k: mask.copy())
    return result, mask


def test_polygons_cover_exactly_the_significant_patches(result_with_regions, tmp_path):
    result, mask = result_with_regions
    path = write_geojson(tmp_path / "regions", result)
    assert path.name == "regions.geojson"
    collection = json.loads(path.read_text(encoding="utf-8"))
    assert [f["geometry"]["type"] for f in collection["features"]] == ["Polygon", "Polygon"]
    ring = next(f for f in collection["features"] if len(f["geometry"]["coordinates"]) == 2)
    assert ring["properties"]["measurements"]["patches"] == 8  # the hole is not counted
    assert ring["properties"]["classification"]["name"] == "significant"
    assert "Significant =" in collection["properties"]["meaning"]
    # rasterised at pixel centres, the polygons are the significant patches, pixel for pixel
    covered = read_geojson_rois(path, result.image_shape) > 0
    np.testing.assert_array_equal(covered, result.to_pixels(mask.astype(float)) > 0.5)


def test_no_significant_patch_gives_an_empty_collection(tiny_backbone, blob_image,
                                                        monkeypatch):
    result = regularize(blob_image, tiny_backbone, n_boot=4, device="cpu")
    monkeypatch.setattr(type(result), "significant",
                        lambda self, *a, **k: np.zeros(self.grid_shape, bool))
    assert significant_features(result)["features"] == []


def test_qupath_annotations_round_trip_as_roi_labels(tmp_path):
    qupath = {"type": "FeatureCollection", "features": [
        {"type": "Feature", "properties": {"objectType": "annotation"},
         "geometry": {"type": "Polygon", "coordinates": [[[2, 3], [10, 3], [10, 9], [2, 9],
                                                          [2, 3]]]}},
        {"type": "Feature", "properties": {}, "geometry": {"type": "Point", "coordinates": [1, 1]}},
        {"type": "Feature", "properties": {},
         "geometry": {"type": "Polygon", "coordinates": [[[12, 0], [16, 0], [16, 4], [12, 4],
                                                          [12, 0]]]}},
    ]}
    path = tmp_path / "qupath.geojson"
    path.write_text(json.dumps(qupath), encoding="utf-8")
    assert len(read_geojson_polygons(path)) == 2  # the point is no ROI
    labels = read_geojson_rois(path, (12, 20))
    expected = np.zeros((12, 20), np.int32)
    expected[3:9, 2:10] = 1  # rows are y, columns x
    expected[0:4, 12:16] = 2
    np.testing.assert_array_equal(labels, expected)
    assert polygons_to_labels([], (2, 2)).sum() == 0


def test_a_file_without_polygons_says_so(tmp_path):
    path = tmp_path / "points.geojson"
    path.write_text(json.dumps({"type": "Point", "coordinates": [0, 0]}), encoding="utf-8")
    with pytest.raises(ValueError, match="points.geojson holds no polygon"):
        read_geojson_rois(path, (4, 4))


def test_cli_geojson_writes_one_file_beside_each_result(tmp_path):
    import tifffile

    from napari_attnreg.cli import main

    rng = np.random.default_rng(0)
    tifffile.imwrite(tmp_path / "s.tif", (rng.random((64, 64)) * 1000).astype(np.uint16))
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "s.tif"), "--out", str(out), "--model", "demo",
                 "--n-boot", "4", "--device", "cpu", "--quiet", "--geojson"]) == 0
    (npz,) = out.glob("*.attnreg.npz")
    geo = npz.with_name(npz.name.replace(".attnreg.npz", ".geojson"))
    collection = json.loads(geo.read_text(encoding="utf-8"))
    assert collection["type"] == "FeatureCollection"
    assert collection["properties"]["image_shape"] == [64, 64]


def test_a_slide_read_coarser_is_written_in_its_full_resolution_pixels(result_with_regions):
    # QuPath places annotations in level-0 pixels: a result of level 2 (downsample 4) read
    # at 1.5x its resolution (mpp) is 6 level-0 pixels per analysed pixel
    result, _mask = result_with_regions
    plain = significant_features(result)
    result.metadata["slide_downsample"] = 6.0
    slide = significant_features(result)
    assert slide["properties"]["full_resolution_per_pixel"] == 6.0
    for a, b in zip(plain["features"], slide["features"]):
        outer_a = np.asarray(a["geometry"]["coordinates"][0])
        outer_b = np.asarray(b["geometry"]["coordinates"][0])
        np.testing.assert_allclose(outer_b, 6.0 * outer_a)
        assert b["properties"]["measurements"]["area_px"] == pytest.approx(
            36.0 * a["properties"]["measurements"]["area_px"])
