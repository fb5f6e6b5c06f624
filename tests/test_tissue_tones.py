"""The automatic tissue mask judged by tone: a grey thumbnail of one tone (blank glass, an
empty field, or a field inside the tissue with no glass).
"""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from napari_attnreg.core.run.tissue import (
    AUTO_ONE_TONE_BLACK,
    AUTO_ONE_TONE_FLAT,
    AUTO_ONE_TONE_GLASS,
    AUTO_ONE_TONE_TISSUE,
    auto_tissue,
)

# -- one tone --------------------------------------------------------------------------------


def _fluorescence_8bit(size: int = 512) -> np.ndarray:
    """The demo article's fluorescence field (nuclei on a dim field, 12 bits) stored in 8 bits
    as the slide validation stores its grey tissue: a field inside the tissue, no glass, no
    black (its dim field at 60 of 255, nuclei brighter)."""
    from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image

    field = make_cell_image([0, 27, 5], size=size, scale=TRAINING_SCALE,
                            hard_negatives=True).image
    return np.clip(np.rint(60 + (field - 95.0) / 2505.0 * 140), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("rgb", [False, True], ids=["grey", "grey-as-rgb"])
def test_a_grey_field_inside_the_tissue_is_all_tissue(rgb):
    """Its two Otsu classes (the dim field, the nuclei) differ by less than GLASS_CHROMA: it
    was taken for one tone of glass and held no tissue, and the run was refused."""
    grey = _fluorescence_8bit()[::2, ::2]  # a thumbnail
    thumb = np.repeat(grey[..., None], 3, axis=-1) if rgb else grey
    mask, source = auto_tissue(thumb)
    assert source == AUTO_ONE_TONE_TISSUE
    assert mask.all()


def _camera_offset(rng: np.random.Generator) -> np.ndarray:
    """An empty field of a 16-bit camera: its offset (100) and noise, nothing else; its top
    value sets the white of the bits used (127), so its one tone is mid-grey."""
    return (100 + rng.normal(0, 5.0, (256, 256))).astype(np.uint16)


def _shaded_glass(rng: np.random.Generator) -> np.ndarray:
    """Blank glass whose scan darkens towards the corners (by up to 10 % of white)."""
    yy, xx = np.mgrid[:256, :256] / 256.0
    shade = 236.0 - 25.0 * 2.0 * ((yy - 0.5) ** 2 + (xx - 0.5) ** 2)
    return (shade + rng.normal(0, 2.0, (256, 256))).clip(0, 255).astype(np.uint8)


@pytest.mark.parametrize("make, source", [
    (lambda rng: (236 + rng.normal(0, 2.0, (256, 256))).astype(np.uint8), AUTO_ONE_TONE_GLASS),
    (_shaded_glass, AUTO_ONE_TONE_GLASS),
    (lambda rng: (10 + rng.normal(0, 3.0, (256, 256))).clip(0).astype(np.uint8),
     AUTO_ONE_TONE_BLACK),
    (lambda rng: ((10 + rng.normal(0, 3.0, (256, 256))).clip(0) * 16).astype(np.uint16),
     AUTO_ONE_TONE_FLAT),  # 12 bits in 16: the noise's top sets white at 511, its tone 0.3
    (_camera_offset, AUTO_ONE_TONE_FLAT),
], ids=["glass", "shaded-glass", "black", "black-12of16", "camera-offset-16"])
def test_a_blank_slide_or_an_empty_field_of_one_tone_holds_no_tissue(make, source):
    mask, said = auto_tissue(make(np.random.default_rng(0)))
    assert said == source
    assert not mask.any()


def _svs(path, img: np.ndarray) -> None:
    """An Aperio SVS of ``img``: level 0 and a level at 1/4."""
    def aperio(n: int) -> str:
        return (f"Aperio Image Library v10.0.50\n{n}x{n} [0,0 {n}x{n}] (256x256) RAW/RGB"
                f"|AppMag = 20|MPP = 0.5")

    n = img.shape[0]
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=aperio(n), photometric="rgb", metadata=None)
        tif.write(img[::4, ::4].copy(), tile=(128, 128), description=aperio(n // 4),
                  photometric="rgb", metadata=None)


def test_a_tiled_run_of_a_grey_slide_without_glass_runs_every_tile(tmp_path):
    """The run's own path (the slide read on demand, its thumbnail, the default mask): the
    slide validation's 0 %-glass demo slides were refused ('No tile is at least 10 %
    tissue')."""
    from napari_attnreg.core.models.backbones import load_backbone
    from napari_attnreg.core.run.config import RunConfig
    from napari_attnreg.core.run.tiled_engine import prepare_tiled
    from napari_attnreg.io.slides import open_slide

    path = tmp_path / "grey.svs"
    _svs(path, np.repeat(_fluorescence_8bit()[..., None], 3, axis=-1))
    tiled = prepare_tiled(open_slide(path, level=0), load_backbone("demo"),
                          RunConfig(tiled=True, n_boot=4))
    assert tiled.tissue.source == AUTO_ONE_TONE_TISSUE
    assert tiled.tissue.tiles.all()

