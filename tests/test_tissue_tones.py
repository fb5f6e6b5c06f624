"""The automatic tissue mask judged by tone: a grey thumbnail of one tone (blank glass, an
empty field, or a field inside the tissue with no glass), and grey tissue on a colour slide
that is darker than its glass (unstained or grey tissue, a mosaic of grey fields).
"""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from napari_attnreg.core.run.tiling import make_layout
from napari_attnreg.core.run.tissue import (
    AUTO_ONE_TONE_BLACK,
    AUTO_ONE_TONE_FLAT,
    AUTO_ONE_TONE_GLASS,
    AUTO_ONE_TONE_TISSUE,
    auto_tissue,
    tiles_in_tissue,
    tissue_for,
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


# -- grey tissue on a colour slide -----------------------------------------------------------

SHAPE = (192, 288)  # a thumbnail: 1/8 of a 1536 x 2304 level


def _glass(rng: np.random.Generator, shape=SHAPE) -> np.ndarray:
    return np.array([236.0, 236.0, 238.0]) + rng.normal(0, 2.0, (*shape, 3))


def _he(rng: np.random.Generator, shape=SHAPE) -> np.ndarray:
    """H&E colours from stain amounts (skimage's stain vectors), with a grain."""
    from skimage import color

    grain = 1 + 0.3 * rng.standard_normal((*shape, 1))
    hed = np.concatenate([0.05 * grain, 0.09 * grain[::-1], np.zeros((*shape, 1))], axis=-1)
    return color.hed2rgb(hed.clip(0, None)) * 255


def _grey_photo(name: str, shape=SHAPE, darkest: float = 60, brightest: float = 200) -> np.ndarray:
    """A real grey photo of scikit-image (gravel, grass, bricks) at a thumbnail's scale, stored
    as the slide validation stores its fields: 60 (darkest) to 200 (brightest) of 255, grey
    RGB."""
    from skimage import data, transform

    photo = transform.resize(getattr(data, name)().astype(float), shape, anti_aliasing=True)
    photo = darkest + (photo - photo.min()) / (photo.max() - photo.min()) * (brightest - darkest)
    return np.repeat(photo[..., None], 3, axis=-1)


def _ellipse(shape, cy, cx, ry, rx) -> np.ndarray:
    from skimage import draw

    mask = np.zeros(shape, bool)
    mask[draw.ellipse(cy, cx, ry, rx, shape=shape)] = True
    return mask


def _jpeg(img: np.ndarray) -> np.ndarray:
    import imageio.v3 as iio

    img = np.asarray(img).clip(0, 255).astype(np.uint8)
    return iio.imread(iio.imwrite("<bytes>", img, extension=".jpg", quality=80),
                      extension=".jpg")


def _inside(mask: np.ndarray, by: int = 3) -> np.ndarray:
    from scipy.ndimage import binary_erosion

    return binary_erosion(mask, iterations=by)


def _near(mask: np.ndarray, by: int = 3) -> np.ndarray:
    from scipy.ndimage import binary_dilation

    return binary_dilation(mask, iterations=by)


def _mosaic(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stained tissue and, beside it on the glass, two grey pieces of real photos (gravel,
    bricks) and a piece of pale unstained tissue (20 % darker than the glass): the thumbnail,
    the tissue and the grey tissue."""
    img = _glass(rng)
    stained = _ellipse(SHAPE, 60, 70, 45, 55)
    gravel = _ellipse(SHAPE, 140, 80, 40, 60)
    bricks = _ellipse(SHAPE, 60, 210, 45, 60)
    pale = _ellipse(SHAPE, 150, 225, 30, 45)
    img[stained] = _he(rng)[stained]
    img[gravel] = _grey_photo("gravel")[gravel]
    img[bricks] = _grey_photo("brick")[bricks]
    img[pale] = 190 + rng.normal(0, 6.0, (pale.sum(), 1)) + rng.normal(0, 1.0, (pale.sum(), 3))
    grey = gravel | bricks | pale
    return _jpeg(img), stained | grey, grey


def test_grey_tissue_darker_than_the_glass_of_a_colour_slide_is_tissue():
    """Grey was glass on a colour slide, however dark: the slide validation's photo mosaics
    (35 % and 70 % glass) kept 34 and 23 of 106 and 64 tissue tiles."""
    from napari_attnreg.core.run.tissue import AUTO_COLOUR_GREY

    image, tissue, grey = _mosaic(np.random.default_rng(0))
    mask, source = auto_tissue(image)
    assert source == AUTO_COLOUR_GREY
    assert mask[_inside(grey)].mean() > 0.99
    assert mask[_inside(tissue)].mean() > 0.99
    assert mask[~_near(tissue)].mean() < 0.01


def test_the_tiles_of_grey_tissue_on_a_colour_slide_are_run():
    image, tissue, _ = _mosaic(np.random.default_rng(1))
    layout = make_layout((SHAPE[0] * 8, SHAPE[1] * 8), tile=(128, 128), patch=(8, 8),
                         overlap=32)
    run = tissue_for("auto", image, layout).tiles
    truth = tiles_in_tissue(tissue, layout)
    assert (truth & ~run).sum() == 0  # no tissue tile left out
    assert (run & ~tiles_in_tissue(_near(tissue, 2), layout)).sum() == 0  # no glass tile run


def test_a_colour_slide_with_more_grey_tissue_than_glass_is_not_taken_for_a_dark_field():
    """Most grey pixels were dark (grey tissue outweighing the glass), so the slide was taken
    for a dark-field scan: the glass was its brighter class and run as tissue, the darker
    grey tissue left out (3 of 6 photo mosaics at 35 % glass: 4 to 6 glass tiles run, 29 to
    30 tissue tiles left out)."""
    from napari_attnreg.core.run.tissue import AUTO_COLOUR_GREY

    rng = np.random.default_rng(3)
    img = _glass(rng)
    grass = _ellipse(SHAPE, 96, 85, 90, 80)
    bricks = _ellipse(SHAPE, 96, 215, 90, 65) & ~grass
    stained = _ellipse(SHAPE, 40, 150, 20, 25) & ~grass & ~bricks
    img[grass] = _grey_photo("grass", darkest=40, brightest=170)[grass]  # mostly below half
    img[bricks] = _grey_photo("brick")[bricks]
    img[stained] = _he(rng)[stained]
    tissue = grass | bricks | stained
    assert tissue.mean() > 0.6
    layout = make_layout((SHAPE[0] * 8, SHAPE[1] * 8), tile=(128, 128), patch=(8, 8),
                         overlap=32)
    found = tissue_for("auto", _jpeg(img), layout)
    assert found.source == AUTO_COLOUR_GREY
    assert (tiles_in_tissue(tissue, layout) & ~found.tiles).sum() == 0
    assert (found.tiles & ~tiles_in_tissue(_near(tissue, 2), layout)).sum() == 0


def test_a_scan_with_dim_glass_is_judged_on_its_stain():
    """Glass below GLASS_LEVEL (a dim scan, 72 % of white) is not known for glass by its
    brightness: the chroma alone finds the tissue, and the glass is not all tissue."""
    from napari_attnreg.core.run.tissue import AUTO_COLOUR

    rng = np.random.default_rng(4)
    img = _glass(rng)
    tissue = _ellipse(SHAPE, 96, 140, 60, 90)
    img[tissue] = _he(rng)[tissue]
    mask, source = auto_tissue(_jpeg(img * (184.0 / 236.0)))
    assert source == AUTO_COLOUR
    assert mask[_inside(tissue)].mean() > 0.99
    assert mask[~_near(tissue)].mean() < 0.01


def test_lines_and_black_edges_darker_than_the_glass_are_not_tissue():
    """Glass is grey and bright, and what is darker is tissue, but not the coverslip's edges
    (dark lines a few pixels wide), a scratch, nor the black edge of the slide and the rim
    where it blends into the glass."""
    rng = np.random.default_rng(2)
    img = _glass(rng)
    tissue = _ellipse(SHAPE, 100, 150, 50, 70)
    img[tissue] = _he(rng)[tissue]
    lines = np.zeros(SHAPE, bool)
    lines[30:33, :] = True  # the coverslip's edge
    lines[:, 20:22] = True  # another, thinner
    lines[150:152, 200:280] = True  # a scratch
    img[lines] = 120.0
    edge = np.zeros(SHAPE, bool)
    edge[-12:] = True
    img[edge] = np.array([14.0, 14.0, 20.0]) + rng.normal(0, 4.0, (edge.sum(), 3))
    mask, _ = auto_tissue(_jpeg(img))
    assert mask[_inside(tissue)].mean() > 0.99
    assert mask[_near(lines, 2) & ~_near(tissue, 4)].mean() < 0.01
    assert mask[_near(edge, 6)].mean() < 0.01
    assert mask[~_near(tissue, 4)].mean() < 0.005
