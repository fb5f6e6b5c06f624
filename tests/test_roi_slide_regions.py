"""A slide's regions in the notebook explorer: each drawn region gets a row, also one too
small for the pixels of the level the result analysed (it used to vanish from the table)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

from napari_attnreg.core.stats.roi import NO_PIXELS  # noqa: E402
from napari_attnreg.notebook import AttentionExplorer  # noqa: E402

SIZE = 512
FAST = {"n_boot": 4, "device": "cpu", "view": "image", "tiled": True, "seed": 0}


def _aperio(n: int) -> str:
    return (f"Aperio Image Library v10.0.50\n{n}x{n} [0,0 {n}x{n}] (256x256) RAW/RGB"
            "|AppMag = 40|MPP = 0.25")


@pytest.fixture(scope="module")
def slide(tmp_path_factory):
    """An Aperio-style SVS of 512², levels 1/2 and 1/4, tissue all over."""
    rng = np.random.default_rng(0)
    img = (rng.random((SIZE, SIZE, 3)) * 90 + np.array([130, 40, 120])).astype(np.uint8)
    path = tmp_path_factory.mktemp("slides") / "slide.svs"
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=_aperio(SIZE), photometric="rgb",
                  metadata=None)
        tif.write(img[::16, ::16].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)
        for k in (2, 4):
            tif.write(img[::k, ::k].copy(), tile=(256, 256), description=_aperio(SIZE // k),
                      photometric="rgb", metadata=None)
    return path


def test_a_region_smaller_than_a_result_pixel_keeps_its_row(slide, tmp_path):
    ex = AttentionExplorer(str(slide), "demo", **{**FAST, "level": 2})
    ex.add_roi(rectangle=(99.5, 99.5, 299.5, 299.5))
    # level-0 rows/cols 41.6..42.4 are 10.025..10.225 at level 2: no pixel centre inside
    ex.add_roi(rectangle=(41.6, 41.6, 42.4, 42.4))
    assert ex.run(wait=True) is not None, ex.status
    rows = ex.roi_table()
    assert [r["label"] for r in rows] == [1, 2]
    assert rows[0]["n_tokens"] > 0
    small = rows[1]
    assert small["area_px"] == 0 and small["n_tokens"] == 0
    assert small["enrichment_test_note"] == NO_PIXELS and math.isnan(small["mean_attention"])
    assert ex.roi_panel.table.value.count("<tr>") == 3  # header and both regions
    assert "covers no pixel" in ex.roi_panel.table.value
    # its bounds still go to the CSV and QuPath, in full-resolution pixels
    assert (small["x_min"], small["y_max"]) == pytest.approx((42.1, 42.9))
    doc = json.loads(ex.export_roi_geojson(tmp_path / "rois.geojson").read_text())
    assert len(doc["features"]) == 2
    ex.close()
