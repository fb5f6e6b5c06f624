"""A strided read (a thumbnail) of a large one-level TIFF decodes its tiles several at once,
with the pixels of tifffile's zarr store bit for bit, and only the tiles it takes pixels from."""

from __future__ import annotations

import numpy as np
import pytest

tifffile = pytest.importorskip("tifffile")
zarr = pytest.importorskip("zarr")

from napari_attnreg.core.run import lazy, tiff_tiles  # noqa: E402
from napari_attnreg.core.run.lazy import open_lazy, tiff_store  # noqa: E402
from napari_attnreg.core.run.tiff_tiles import TiffTiles  # noqa: E402

H, W = 300, 270  # edge tiles on both axes


def _pixels(samples: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(4)
    yy, xx = np.mgrid[0:H, 0:W]
    base = (yy * 3 + xx * 5) % 200 + rng.integers(0, 40, (H, W))
    image = np.stack([base, base[::-1], base[:, ::-1]][:samples], -1) if samples > 1 else base
    return image.astype(dtype)


KINDS = {
    "jpeg_rgb": (3, np.uint8, {"compression": "jpeg", "photometric": "rgb"}),
    "jpeg_ycbcr": (3, np.uint8, {"compression": "jpeg", "photometric": "ycbcr",
                                 "subsampling": (2, 2)}),
    "deflate_grey16": (1, np.uint16, {"compression": "zlib"}),
    "lzw_rgb": (3, np.uint8, {"compression": "lzw", "photometric": "rgb"}),
    "raw_grey": (1, np.uint8, {}),
}


@pytest.fixture(params=sorted(KINDS))
def tiff(request, tmp_path):
    samples, dtype, options = KINDS[request.param]
    path = tmp_path / f"{request.param}.tif"
    tifffile.imwrite(path, _pixels(samples, dtype), tile=(64, 48), metadata=None, **options)
    return path


def _store_array(path):
    return lazy.full_resolution_array(zarr.open(tiff_store(path), mode="r"))


SLICES = [(slice(0, H, 7), slice(0, W, 7)), (slice(None, None, 2), slice(None, None, 3)),
          (slice(5, 290, 65), slice(3, 260, 49)), (slice(0, H, 400), slice(0, W, 1)),
          (slice(10, 70), slice(20, 200)), (slice(299, 300, 5), slice(269, 270, 9)),
          (slice(40, 40, 3), slice(0, W, 3))]


@pytest.mark.parametrize("ys, xs", SLICES)
def test_a_strided_read_is_the_stores_bit_for_bit(tiff, ys, xs):
    array = _store_array(tiff)
    tiles = TiffTiles.of(array)
    assert tiles is not None
    np.testing.assert_array_equal(tiles.strided(ys, xs), np.asarray(array[ys, xs]))


def test_a_strided_read_decodes_only_the_tiles_it_takes_pixels_from(tmp_path, monkeypatch):
    path = tmp_path / "g.tif"
    tifffile.imwrite(path, _pixels(1, np.uint8), tile=(64, 48), compression="zlib")
    tiles = TiffTiles.of(_store_array(path))
    decoded = []
    real = tiles.decode

    def counted(data, index, **kwargs):
        decoded.append(index)
        return real(data, index, **kwargs)

    tiles.decode = counted
    tiles.strided(slice(0, H, 200), slice(0, W, 200))  # rows 0, 200; columns 0, 200
    across = -(-W // 48)
    assert sorted(decoded) == sorted({(y // 64) * across + x // 48
                                      for y in (0, 200) for x in (0, 200)})


def test_a_thumbnail_of_a_one_level_tiff_is_read_through_the_tiles(tmp_path, monkeypatch):
    path = tmp_path / "rgb.tif"
    tifffile.imwrite(path, _pixels(3, np.uint8), tile=(64, 48), photometric="rgb",
                     compression="jpeg", metadata=None)
    image = open_lazy(path)
    used = []
    real = TiffTiles.strided

    def spy(self, ys, xs):
        used.append((ys, xs))
        return real(self, ys, xs)

    monkeypatch.setattr(TiffTiles, "strided", spy)
    thumbnail = image.overview(2000)
    assert used and thumbnail.shape[-1] == 3
    np.testing.assert_array_equal(thumbnail, np.asarray(_store_array(path)[used[0]]))
    used.clear()
    image.read(slice(0, 64), slice(0, 48))  # a region of a run: through the store
    assert not used


def test_without_the_files_handle_a_thumbnail_is_read_through_the_store(tmp_path,
                                                                        monkeypatch):
    path = tmp_path / "g.tif"
    tifffile.imwrite(path, _pixels(1, np.uint8), tile=(64, 48))
    image = open_lazy(path)
    monkeypatch.setattr(TiffTiles, "closed", property(lambda self: True))
    monkeypatch.setattr(TiffTiles, "strided", lambda *a: pytest.fail("read a closed file"))
    np.testing.assert_array_equal(image.read(slice(0, H, 3), slice(0, W, 3)),
                                  np.asarray(_store_array(path)[::3, ::3]))


def test_a_tiles_error_is_raised_from_the_strided_read(tmp_path, monkeypatch):
    path = tmp_path / "g.tif"
    tifffile.imwrite(path, _pixels(1, np.uint8), tile=(64, 48), compression="zlib")
    tiles = TiffTiles.of(_store_array(path))
    monkeypatch.setattr(tiff_tiles, "DECODE_WORKERS", 2)

    def broken(data, index, **kwargs):
        raise ValueError("corrupt tile")

    tiles.decode = broken
    with pytest.raises(ValueError, match="corrupt tile"):
        tiles.strided(slice(0, H, 3), slice(0, W, 3))
