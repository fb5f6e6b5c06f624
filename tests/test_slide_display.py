"""The picture a tiled run of a slide is drawn over: the level analysed when it is small enough,
not the slide's coarser level (which the statistics keep using)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

from napari_attnreg.core.models.backbones import load_backbone  # noqa: E402
from napari_attnreg.core.run import lazy  # noqa: E402
from napari_attnreg.core.run.config import RunConfig  # noqa: E402
from napari_attnreg.core.run.lazy import LazyImage, scaled  # noqa: E402
from napari_attnreg.core.run.tiled_engine import (  # noqa: E402
    DISPLAY_PIXELS,
    THUMBNAIL_PIXELS,
    prepare_tiled,
)
from napari_attnreg.core.run.tissue import tissue_for  # noqa: E402
from napari_attnreg.io.slides import open_slide  # noqa: E402

SIDE = 1004  # not a whole number of the demo model's 8-pixel patches: 125 and 4 pixels


def _pixels(size: int) -> np.ndarray:
    """Stained tissue with small dark nuclei (a blur on a level 4 times coarser), glass."""
    rng = np.random.default_rng(3)
    img = np.full((size, size, 3), 236, np.uint8)
    t = int(size * 0.6)
    img[:t, :t] = (rng.random((t, t, 3)) * 50 + np.array([190, 140, 180])).astype(np.uint8)
    for y, x in rng.integers(4, t - 4, (800, 2)):
        img[y - 2:y + 2, x - 2:x + 2] = (60, 30, 110)
    return img


def _aperio(w: int, h: int) -> str:
    return (f"Aperio Image Library v10.0.50\n{w}x{h} [0,0 {w}x{h}] (256x256) RAW/RGB"
            "|AppMag = 40|MPP = 0.25")


@pytest.fixture(scope="module")
def slide(tmp_path_factory) -> Path:
    """An SVS of 1004² at 0.25 µm with one level 4 times coarser (251²)."""
    path = tmp_path_factory.mktemp("display") / "small.svs"
    img = _pixels(SIDE)
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=_aperio(SIDE, SIDE), photometric="rgb",
                  metadata=None)
        # an SVS's second image is its thumbnail, not a level
        tif.write(img[::16, ::16].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)
        small = img[::4, ::4].copy()
        tif.write(small, tile=(256, 256), description=_aperio(*small.shape[1::-1]),
                  photometric="rgb", metadata=None)
    return path


def _hwc(chw) -> np.ndarray:
    return chw.permute(1, 2, 0).numpy()


def _tiled(image: LazyImage):
    return prepare_tiled(image, load_backbone("demo"), RunConfig(tiled=True, device="cpu"))


def test_a_small_slides_display_is_the_level_analysed_not_its_coarser_level(slide):
    image = open_slide(slide)  # level 0, 1004²; its level 1 (251²) is the statistics' sample
    assert image.level == 0 and image.overview_array.shape[:2] == (251, 251)
    tiled = _tiled(image)
    h, w = tiled.image_shape
    assert (h, w) == (1000, 1000)  # whole patches: the last 4 pixels are left out
    level = image.read(slice(0, h), slice(0, w))
    # the pixels the model saw, scaled as the tiles are (uint8: 0..255), over the extent run
    np.testing.assert_array_equal(tiled.display, _hwc(scaled(level, 0.0, 255.0)))
    # the statistics keep their sample: the coarser level, as before
    np.testing.assert_array_equal(tiled.source.numpy(), scaled(image.overview(), 0, 255).numpy())
    np.testing.assert_array_equal(
        tiled.tissue.tiles, tissue_for("auto", image.overview(THUMBNAIL_PIXELS), tiled.layout,
                                       covers=image.analysed_shape).tiles)


def test_a_slide_read_at_a_resolution_is_shown_from_the_level_it_resamples(slide):
    image = open_slide(slide, mpp=0.5)  # level 0 resampled to 502²
    assert image.scale == 2 and image.analysed_shape == (502, 502)
    tiled = _tiled(image)
    assert tiled.image_shape == (496, 496)  # 62 patches: level 0's first 992 pixels
    level = image.read(slice(0, 992), slice(0, 992))
    np.testing.assert_array_equal(tiled.display, _hwc(scaled(level, 0.0, 255.0)))


def test_the_display_is_read_only_when_asked(slide, monkeypatch):
    image = open_slide(slide)
    asked: list[int] = []
    picture = LazyImage.picture

    def counted(self, max_pixels, extent=None):
        asked.append(max_pixels)
        return picture(self, max_pixels, extent)

    monkeypatch.setattr(LazyImage, "picture", counted)
    tiled = _tiled(image)
    assert asked == []  # a run that draws no figure never reads it
    first = tiled.display
    assert tiled.display is first and asked == [DISPLAY_PIXELS]  # read once, kept


def test_a_small_slides_statistics_are_those_of_the_old_display(slide, monkeypatch):
    """The display is no part of the statistics: a run drawn over the level gives the very
    p-values, attention and maps of a run drawn over the coarser level (the old display)."""
    from napari_attnreg import regularize

    options = {"tiled": True, "n_boot": 6, "seed": 0, "device": "cpu"}
    new = regularize(open_slide(slide), "demo", **options)
    monkeypatch.setattr(LazyImage, "level_shown", lambda self, max_pixels: False)
    old_image = open_slide(slide)
    assert _tiled(old_image).display.shape == (251, 251, 3)  # the coarser level, as before
    old = regularize(old_image, "demo", **options)
    np.testing.assert_array_equal(new.p, old.p)
    np.testing.assert_array_equal(new.attention, old.attention)
    assert sorted(new.maps) == sorted(old.maps)
    for name in new.maps:
        np.testing.assert_array_equal(new.maps[name], old.maps[name])
    np.testing.assert_array_equal(new.null_summary["tissue_mask"],
                                  old.null_summary["tissue_mask"])


def _image(level: tuple[int, int], coarse: tuple[int, int]) -> LazyImage:
    return LazyImage(np.zeros((*level, 3), np.uint8), -1, level=0,
                     overview_array=np.ones((*coarse, 3), np.uint8))


def test_the_coarser_level_is_shown_when_it_is_as_fine_or_the_level_too_large(monkeypatch):
    # a strided read of the level no finer than the coarser level: the coarser level
    assert _image((1000, 1000), (500, 500)).picture(500 * 500).min() == 1
    # finer: the level, strided to the budget
    shown = _image((1000, 1000), (250, 250)).picture(500 * 500)
    assert shown.shape == (500, 500, 3) and shown.max() == 0
    # a level above the sample's budget is never read whole to be shown
    monkeypatch.setattr(lazy, "SAMPLE_PIXELS", 999 * 999)
    assert _image((1000, 1000), (250, 250)).picture(500 * 500).min() == 1


def test_the_notebook_shows_a_small_slide_from_the_level(slide):
    pytest.importorskip("ipywidgets")
    from napari_attnreg.notebook.sources import DiskSource

    image = open_slide(slide)
    pixels, axis = DiskSource(image, slide=True, pyramid=True).display_pixels((), 600 * 600)
    assert axis is None  # RGB
    np.testing.assert_array_equal(pixels, image.read(slice(0, SIDE, 2), slice(0, SIDE, 2)))
