"""A tissue mask covers the whole image; an image read on demand is tiled cropped to patches.

A slide level read tile by tile is analysed cropped to whole patches (its last rows and
columns, fewer than a patch, are left out), but the automatic mask's thumbnail and a user's
mask span the whole level. Mapped onto the cropped extent they were stretched: tiles along the
far edges were judged by tissue that lies further out (a tile of 6 % tissue run as one of
11 %), and a slide analysed at a coarse resolution (``--mpp 100``: 10x13 pixels, 8x8
analysed) failed with "The tissue mask (212x295) does not have the image's proportions
(8x8); give a mask of the whole image", about the automatic mask the user never gave (the
whole image, 10x13, is rounded from 9.5x13.2: its proportions are known to a pixel).
``covers`` names the whole image's extent, in the layout's pixels.
"""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg.core.run.tiling import make_layout
from napari_attnreg.core.run.tissue import tiles_in_tissue, tissue_for


def test_a_mask_of_the_whole_image_is_placed_on_the_cropped_tiles_unstretched():
    # a level of 263 columns, analysed as 256 (whole 8-pixel patches); tissue in its last 15
    layout = make_layout((256, 256), tile=(128, 128), patch=(8, 8), overlap=32)
    mask = np.zeros((263, 263), bool)
    mask[:, 248:] = True
    tiles = tiles_in_tissue(mask, layout, covers=(263, 263)).reshape(3, 3)
    # the last column of tiles (128..256) holds analysed columns 248..255: 8 of 128, 6 %
    assert not tiles.any()
    mask[:, 236:] = True  # 20 of 128 columns: 16 %
    assert tiles_in_tissue(mask, layout, covers=(263, 263)).reshape(3, 3)[:, 2].all()


def test_the_automatic_mask_of_a_tiny_coarse_image_is_no_proportions_error():
    # --mpp 100 on a 1900x2650 slide: 10x13 analysed pixels, cropped to one 8x8 patch; the
    # thumbnail is of the whole level (212x295)
    layout = make_layout((8, 8), tile=(128, 128), patch=(8, 8), overlap=32)
    thumb = np.full((212, 295), True)
    # 10x13 is 0.769 high per wide, the level 0.719: rounding to whole pixels, not another image
    assert tiles_in_tissue(thumb, layout, covers=(10, 13)).tolist() == [True]
    found = tissue_for(np.ones((212, 295), np.uint8), None, layout, covers=(10, 13))
    assert found is not None and found.tiles.tolist() == [True]
    with pytest.raises(ValueError, match="proportions"):  # a mask of another image still is
        tiles_in_tissue(np.ones((295, 212), bool), make_layout(
            (96, 128), tile=(128, 128), patch=(8, 8), overlap=32), covers=(100, 133))


def test_a_tiled_run_of_an_image_read_on_demand_places_the_mask_unstretched():
    # the run's own path: a 263-pixel image read on demand is tiled as its 256-pixel crop
    from napari_attnreg.core.models.backbones import load_backbone
    from napari_attnreg.core.run.config import RunConfig
    from napari_attnreg.core.run.lazy import LazyImage
    from napari_attnreg.core.run.tiled_engine import prepare_tiled

    rng = np.random.default_rng(0)
    image = LazyImage(rng.integers(0, 255, (263, 263), dtype=np.uint8), None, "field.tif")
    backbone = load_backbone("demo")
    mask = np.zeros((263, 263), np.uint8)
    mask[:, 236:] = 1  # 20 of the last tile's 128 analysed columns (16 %)
    tiled = prepare_tiled(image, backbone, RunConfig(tiled=True, n_boot=4, tissue_mask=mask))
    n_rows, n_cols = (len(s) for s in tiled.layout.starts)
    assert tiled.layout.shape == (256, 256)
    assert tiled.tissue.tiles.reshape(n_rows, n_cols)[:, -1].all()
    mask[:, :248] = 0  # 8 of 128 (6 %): stretched onto the crop it read as 11 %
    with pytest.raises(ValueError, match="No tile is at least"):
        prepare_tiled(image, backbone, RunConfig(tiled=True, n_boot=4, tissue_mask=mask))
