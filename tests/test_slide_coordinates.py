"""The place of a patch on a slide run at a coarser level, as the inspectors say it.

napari's cursor, QuPath and our exported outlines all use the slide's full-resolution
(level 0) pixels; the inspector and the notebook's readout used to give the analysed level's
pixels, so a pathologist reading "x=800 y=2560" off a level-2 run looked 4× too close to the
corner.
"""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from napari_attnreg.core.results.display import describe_pixel, pixel_text
from napari_attnreg.core.results.patch_report import patch_report
from napari_attnreg.io.slides import open_slide

SIZE = 1024


def _aperio(w: int, h: int) -> str:
    return (f"Aperio Image Library v10.0.50\n{w}x{h} [0,0 {w}x{h}] (256x256) RAW/RGB"
            "|AppMag = 40|MPP = 0.25")


@pytest.fixture(scope="module")
def level1_run(tmp_path_factory):
    """A stained 1024² SVS (levels 1/1, 1/2) run tiled at level 1, without a mask."""
    from napari_attnreg import regularize

    rng = np.random.default_rng(3)
    img = (rng.random((SIZE, SIZE, 3)) * 90 + np.array([130, 40, 120])).astype(np.uint8)
    path = tmp_path_factory.mktemp("coords") / "slide.svs"
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=_aperio(SIZE, SIZE), photometric="rgb",
                  metadata=None)
        tif.write(img[::16, ::16].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)  # Aperio's second page: the thumbnail
        tif.write(img[::2, ::2].copy(), tile=(256, 256),
                  description=_aperio(SIZE // 2, SIZE // 2), photometric="rgb", metadata=None)
    return regularize(open_slide(path, level=1), "demo", tiled=True, tissue_mask="none",
                      n_boot=4, seed=0, device="cpu")


def test_pixel_text_is_unchanged_for_images_and_level0_for_slides():
    assert pixel_text(40.2, 12.0) == "x=12 y=40"
    # analysed pixel i of a 4× level is centred on level-0 pixel 4i + 1.5
    assert pixel_text(2560, 800, 4.0) == "x=3201 y=10241 (level 0)"


def test_the_inspector_and_readout_give_full_resolution_pixels(level1_run):
    result = level1_run
    assert result.metadata["slide_downsample"] == 2.0
    report = patch_report(result, 300.0, 100.0)
    assert "x=200 y=600 (level 0)" in report.headline
    assert describe_pixel(result, 300.0, 100.0).startswith("x=200 y=600 (level 0) · patch")


def test_every_patch_is_placed_inside_its_own_level0_footprint(level1_run):
    """The level-0 place the inspector names lies inside the patch's own footprint in the
    frame GeoJSON outlines are exported in (token ``i`` covers level-0 ``[f·s·i, f·s·(i+1))``)."""
    result = level1_run
    f = result.metadata["slide_downsample"]
    sy, sx = result.token_scale
    gh, gw = result.grid_shape
    for i, j in ((0, 0), (gh - 1, gw - 1), (gh // 3, 2 * gw // 3)):
        for fy, fx in ((0.1, 0.1), (0.5, 0.5), (0.9, 0.9)):
            row, col = (i + fy) * sy - 0.5, (j + fx) * sx - 0.5
            report = patch_report(result, row, col)
            assert report.token == (i, j)
            where = report.headline.split(" · ")[1]
            x, y = (int(part.split("=")[1]) for part in where.split()[:2])
            assert f * sy * i <= y < f * sy * (i + 1) and f * sx * j <= x < f * sx * (j + 1)
