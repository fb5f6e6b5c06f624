"""The automatic tissue mask on slides as scanners and labs make them: dark fields scanned to
RGB JPEG, pen ink, black edges, labels and padding, weak stain beside strong, bubbles and dust.

Thumbnails are built at thumbnail size (the mask never sees more); one slide goes through a
tiled run end to end.
"""

from __future__ import annotations

import imageio.v3 as iio
import numpy as np
import pytest
from skimage import color, data, draw, transform

from napari_attnreg.core.run.tiling import make_layout
from napari_attnreg.core.run.tissue import (
    AUTO_BRIGHT_BACKGROUND,
    AUTO_COLOUR,
    AUTO_DARK_BACKGROUND,
    auto_tissue,
    tiles_in_tissue,
    tissue_for,
)

SHAPE = (192, 288)  # a thumbnail: 1/8 of a 1536 x 2304 level


def _jpeg(img: np.ndarray, quality: int = 80) -> np.ndarray:
    """Through JPEG as a scanner stores it (Pillow: 4:2:0 chroma)."""
    return iio.imread(iio.imwrite("<bytes>", img, extension=".jpg", quality=quality),
                      extension=".jpg")


def _u8(img: np.ndarray) -> np.ndarray:
    return np.asarray(img).clip(0, 255).astype(np.uint8)


def _glass(rng: np.random.Generator, shape=SHAPE) -> np.ndarray:
    return np.array([236.0, 236.0, 238.0]) + rng.normal(0, 2.0, (*shape, 3))


def _he(rng: np.random.Generator, shape=SHAPE, h: float = 0.05, e: float = 0.09) -> np.ndarray:
    """H&E colours from stain amounts (skimage's stain vectors), with a grain."""
    grain = 1 + 0.3 * rng.standard_normal((*shape, 1))
    hed = np.concatenate([h * grain, e * grain[::-1], np.zeros((*shape, 1))], axis=-1)
    return color.hed2rgb(hed.clip(0, None)) * 255


def _ellipse(shape, cy, cx, ry, rx) -> np.ndarray:
    mask = np.zeros(shape, bool)
    mask[draw.ellipse(cy, cx, ry, rx, shape=shape)] = True
    return mask


def _ring(shape, cy, cx, r, width) -> np.ndarray:
    yy, xx = np.ogrid[:shape[0], :shape[1]]
    return np.abs(np.hypot(yy - cy, xx - cx) - r) < width / 2


def _stroke(shape, points, width) -> np.ndarray:
    """A marker's line through ``points``, ``width`` pixels wide."""
    mask = np.zeros(shape, bool)
    for (y0, x0), (y1, x1) in zip(points[:-1], points[1:], strict=False):
        mask[draw.line(y0, x0, y1, x1)] = True
    return _dilate(mask, width // 2)


def _dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    from scipy.ndimage import binary_dilation

    return binary_dilation(mask, iterations=radius)


def _inside(mask: np.ndarray, by: int = 3) -> np.ndarray:
    """``mask`` without its rim (the pixels its edge blends into)."""
    from scipy.ndimage import binary_erosion

    return binary_erosion(mask, iterations=by)


def _near(mask: np.ndarray, by: int = 3) -> np.ndarray:
    return _dilate(mask, by)


# -- dark fields scanned to RGB ----------------------------------------------------------------

@pytest.mark.parametrize("tissue_colour", [(160, 160, 160), (20, 150, 70), (40, 60, 170)],
                         ids=["grey", "green", "blue"])
def test_an_rgb_darkfield_scan_is_thresholded_on_brightness_not_its_colour_noise(tissue_colour):
    """Colour noise near black has a high HSV saturation ((max - min) / max of small
    numbers): the black field was tissue and grey tissue was not."""
    rng = np.random.default_rng(0)
    img = 10 + rng.normal(0, 3.0, (*SHAPE, 3))
    tissue = _ellipse(SHAPE, 96, 100, 60, 70) | _ellipse(SHAPE, 90, 220, 40, 45)
    img[tissue] = np.asarray(tissue_colour) * (1 + 0.15 * rng.standard_normal((tissue.sum(), 1)))
    mask, source = auto_tissue(_jpeg(_u8(img)))
    assert source == AUTO_DARK_BACKGROUND
    assert mask[_inside(tissue)].mean() > 0.99
    assert mask[~_near(tissue)].mean() < 0.01


# -- pen ink -----------------------------------------------------------------------------------

INKS = {"blue": (45, 75, 165), "green": (40, 140, 85), "black": (30, 30, 35),
        "red": (200, 35, 45)}


def _inked_he(rng) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """H&E on glass, with the marks a pathologist draws on the glass around it."""
    img = _glass(rng)
    tissue = _ellipse(SHAPE, 100, 110, 55, 70)
    img[tissue] = _he(rng)[tissue]
    marks = {"blue": _ring(SHAPE, 100, 110, 82, 6) & ~_near(tissue, 4),
             "green": _stroke(SHAPE, [(10, 10), (40, 40), (30, 22)], 6),
             "black": _stroke(SHAPE, [(170, 200), (150, 220), (175, 240), (150, 260)], 6),
             "red": _ring(SHAPE, 45, 240, 22, 6)}
    for name, mark in marks.items():
        img[mark] = INKS[name]
    return _jpeg(_u8(img)), tissue, marks


@pytest.mark.parametrize("ink", list(INKS))
def test_pen_ink_on_the_glass_is_not_tissue(ink):
    image, tissue, marks = _inked_he(np.random.default_rng(1))
    mask, source = auto_tissue(image)
    assert source == AUTO_COLOUR
    assert mask[marks[ink]].mean() < 0.01
    assert mask[_inside(tissue)].mean() > 0.99


def test_tiles_of_pen_marks_alone_are_not_run():
    image, tissue, marks = _inked_he(np.random.default_rng(1))
    layout = make_layout((SHAPE[0] * 8, SHAPE[1] * 8), tile=(128, 128), patch=(8, 8),
                         overlap=32)
    truth = tiles_in_tissue(tissue, layout)
    run = tissue_for("auto", image, layout).tiles
    assert (run & ~truth).sum() == 0  # no tile of ink alone
    assert (truth & ~run).sum() == 0  # no tissue tile missed


def test_blood_in_the_tissue_is_not_red_ink():
    """A haemorrhage is as red and as pure as red marker; it lies in tissue, not on glass."""
    rng = np.random.default_rng(10)
    img = _glass(rng)
    tissue = _ellipse(SHAPE, 96, 144, 70, 100)
    img[tissue] = _he(rng)[tissue]
    blood = _ellipse(SHAPE, 90, 130, 25, 40)
    img[blood] = np.array([215.0, 55.0, 70.0]) + rng.normal(0, 6, (blood.sum(), 3))
    mask, _ = auto_tissue(_jpeg(_u8(img)))
    assert mask[_inside(tissue)].mean() > 0.99


def _ihc(shape=SHAPE) -> np.ndarray:
    """skimage's IHC sample (hematoxylin blue, DAB brown) at a thumbnail's scale."""
    sample = data.immunohistochemistry()[128:384, 64:448]  # glands and stroma
    return transform.resize(sample, shape, anti_aliasing=True, preserve_range=True)


def test_hematoxylin_blue_is_kept_where_blue_ink_is_removed():
    """IHC counterstain is as blue in hue as blue marker; only the marker is removed."""
    rng = np.random.default_rng(2)
    img = _glass(rng)
    tissue = _ellipse(SHAPE, 96, 130, 66, 76)
    stain = _ihc()
    img[tissue] = stain[tissue]
    ink = _ring(SHAPE, 96, 130, 88, 7)  # a circle on the glass around the tissue
    clean = _jpeg(_u8(img))
    img[ink] = INKS["blue"]
    mask, _ = auto_tissue(_jpeg(_u8(img)))
    assert mask[ink].mean() < 0.01
    hsv = color.rgb2hsv(stain / 255.0)
    hue, chroma = hsv[..., 0] * 360, hsv[..., 1] * hsv[..., 2]
    blue = _inside(tissue) & (hue > 200) & (hue < 260) & (chroma > 0.15)
    brown = _inside(tissue) & (hue < 45) & (chroma > 0.15)
    assert blue.sum() > 100 and brown.sum() > 1000
    assert mask[blue].mean() > 0.95 and mask[brown].mean() > 0.99
    # the ink took no tissue with it (the pale stroma lies near the threshold, which the
    # ink's pixels, set to glass, move a little)
    without_ink, _ = auto_tissue(clean)
    assert abs(mask[_inside(tissue)].mean() - without_ink[_inside(tissue)].mean()) < 0.02


def test_a_stain_of_an_ink_colour_is_kept():
    """Most of the colour in an ink hue is the stain (a special stain), not marks."""
    rng = np.random.default_rng(3)
    img = _glass(rng)
    tissue = _ellipse(SHAPE, 96, 140, 70, 110)
    collagen = np.array([50.0, 90.0, 170.0]) * (1 + 0.1 * rng.standard_normal((*SHAPE, 1)))
    img[tissue] = collagen[tissue]
    mask, _ = auto_tissue(_jpeg(_u8(img)))
    assert mask[_inside(tissue)].mean() > 0.99


def test_a_thumbnail_of_one_stain_throughout_is_all_tissue():
    """A crop inside the tissue, one flat colour: no glass to set it against."""
    pink = np.zeros((*SHAPE, 3), np.uint8) + np.array([200, 120, 170], np.uint8)
    mask, _ = auto_tissue(pink)
    assert mask.all()


# -- black regions and padding -----------------------------------------------------------------

def test_slide_edges_labels_and_black_padding_are_not_tissue():
    """Black with a colour cast (a slide's edge, an opaque label in transmitted light) has a
    high saturation; the padding is exact 0."""
    rng = np.random.default_rng(4)
    img = _glass(rng)
    tissue = _ellipse(SHAPE, 100, 120, 55, 80)
    img[tissue] = _he(rng)[tissue]
    edge = np.zeros(SHAPE, bool)
    edge[:12] = True
    img[edge] = np.array([12, 16, 30]) + rng.normal(0, 5, (edge.sum(), 3))  # bluish black
    label = np.zeros(SHAPE, bool)
    label[12:, 230:] = True
    img[label] = np.array([34, 24, 14]) + rng.normal(0, 5, (label.sum(), 3))  # brownish
    pad = np.zeros(SHAPE, bool)
    pad[-10:, :] = True
    pad[:, -9:] = True
    img[pad] = 0
    image = _jpeg(_u8(img))
    mask, source = auto_tissue(image)
    assert source == AUTO_COLOUR
    assert mask[edge | label | pad].mean() < 0.01
    assert mask[_inside(tissue)].mean() > 0.99


@pytest.mark.parametrize("padding", [0, 255], ids=["black", "white"])
def test_a_grey_brightfield_slide_with_padding_and_a_label_keeps_its_polarity(padding):
    """Black padding and a dark label made the black class the background: the glass was
    run as tissue."""
    rng = np.random.default_rng(5)
    img = 236 + rng.normal(0, 2.0, SHAPE)
    tissue = _ellipse(SHAPE, 100, 110, 60, 80)
    img[tissue] = 140 + rng.normal(0, 10.0, tissue.sum())
    label = np.zeros(SHAPE, bool)
    label[:, 220:] = True
    img[label] = 20 + rng.normal(0, 4.0, label.sum())
    pad = np.zeros(SHAPE, bool)
    pad[-24:, :] = True
    pad[:, -30:] = True
    img[pad] = padding
    mask, source = auto_tissue(_u8(img))
    assert source == AUTO_BRIGHT_BACKGROUND
    assert mask[_inside(tissue)].mean() > 0.99
    assert mask[~_near(tissue)].mean() < 0.01


# -- weak stain, bubbles, dust -----------------------------------------------------------------

def test_weakly_stained_tissue_beside_strong_stain_is_kept():
    """Otsu's threshold between glass and strong stain lay above the weak stain."""
    rng = np.random.default_rng(6)
    img = _glass(rng)
    strong = _ellipse(SHAPE, 96, 80, 70, 60)
    weak = _ellipse(SHAPE, 96, 190, 60, 70) & ~strong
    img[strong] = _he(rng, h=0.12, e=0.12)[strong]
    img[weak] = _he(rng, h=0.012, e=0.015)[weak]
    mask, _ = auto_tissue(_jpeg(_u8(img)))
    assert mask[_inside(strong)].mean() > 0.99
    assert mask[_inside(weak)].mean() > 0.95
    assert mask[~_near(strong | weak)].mean() < 0.01


def test_bubbles_and_dust_on_the_glass_are_not_tissue():
    rng = np.random.default_rng(7)
    img = _glass(rng)
    tissue = _ellipse(SHAPE, 100, 100, 55, 70)
    img[tissue] = _he(rng)[tissue]
    marks = np.zeros(SHAPE, bool)
    for cy, cx, r in [(40, 230, 25), (150, 240, 15), (100, 100, 30)]:
        marks |= _ring(SHAPE, cy, cx, r, 2)
    for _ in range(30):
        marks[draw.disk((rng.integers(0, SHAPE[0]), rng.integers(0, SHAPE[1])),
                        rng.integers(1, 3), shape=SHAPE)] = True
    img[marks] = 0.2 * img[marks] + 0.8 * np.array([60.0, 55.0, 50.0])
    mask, _ = auto_tissue(_jpeg(_u8(img)))
    assert mask[marks & ~_near(tissue)].mean() < 0.01
    assert mask[_inside(tissue)].mean() > 0.99


# -- a tiled run -------------------------------------------------------------------------------

def test_a_tiled_run_of_an_rgb_darkfield_jpeg_slide_runs_its_tissue_tiles(tmp_path):
    """End to end: an Aperio-style SVS in JPEG (YCbCr 4:2:0) of grey tissue on a black field;
    before, its colour noise was the tissue and no tile held 10 % of it."""
    tifffile = pytest.importorskip("tifffile")
    pytest.importorskip("tiffslide")
    from napari_attnreg import regularize
    from napari_attnreg.io.slides import open_slide

    size = 1024
    rng = np.random.default_rng(8)
    img = 10 + rng.normal(0, 3.0, (size, size, 3))
    tissue = _ellipse((size, size), 400, 380, 260, 300)
    img[tissue] = rng.uniform(120, 200, (tissue.sum(), 1))
    img = _u8(img)
    path = tmp_path / "darkfield_rgb.svs"

    def aperio(n: int) -> str:
        return (f"Aperio Image Library v10.0.50\n{n}x{n} [0,0 {n}x{n}] (256x256) JPEG/RGB "
                f"Q=80|AppMag = 40|MPP = 0.25")

    with tifffile.TiffWriter(path) as tif:
        for k in (1, 2, 4):
            level = transform.downscale_local_mean(img.astype(float), (k, k, 1))
            tif.write(_u8(level), tile=(256, 256), description=aperio(size // k),
                      photometric="rgb", compression="jpeg", compressionargs={"level": 80},
                      metadata=None)
    result = regularize(path, "demo", tiled=True, level=1, n_boot=4, seed=0, device="cpu")
    md = result.metadata
    assert md["tissue_mask"] == AUTO_DARK_BACKGROUND
    analysed = open_slide(path, level=1).analysed_shape
    layout = make_layout(analysed, tile=(128, 128), patch=(8, 8), overlap=32)
    assert md["n_tissue_tiles"] == int(tiles_in_tissue(tissue, layout).sum())
    assert 0 < md["n_tissue_tiles"] < md["n_tiles_total"]
