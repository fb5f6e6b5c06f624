"""A slide's stored tiles are decoded once each by a tiled run, and read the same as before."""

from __future__ import annotations

import numpy as np
import pytest

tifffile = pytest.importorskip("tifffile")
pytest.importorskip("tiffslide")
pytest.importorskip("zarr")

from napari_attnreg.core.models.backbones import load_backbone  # noqa: E402
from napari_attnreg.core.run.config import RunConfig  # noqa: E402
from napari_attnreg.core.run.lazy import ChunkCache, LazyImage  # noqa: E402
from napari_attnreg.core.run.tiled_engine import prepare_tiled  # noqa: E402
from napari_attnreg.io.slides import open_slide  # noqa: E402


@pytest.fixture(scope="module")
def slide(tmp_path_factory):
    """A 1000x1200 pyramidal TIFF in 256² tiles (edges of partial tiles), random RGB."""
    path = tmp_path_factory.mktemp("chunks") / "pyramid.tif"
    rng = np.random.default_rng(3)
    img = rng.integers(0, 255, (1000, 1200, 3), dtype=np.uint8)
    img[:, 600:] = 236  # glass on the right half
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), subifds=1, photometric="rgb", metadata=None)
        tif.write(img[::4, ::4].copy(), tile=(256, 256), subfiletype=1, photometric="rgb",
                  metadata=None)
    return path, img


class CountingArray:
    """A zarr-like array that counts the reads reaching it."""

    def __init__(self, array):
        self.array, self.shape, self.dtype = array, array.shape, array.dtype
        self.chunks = array.chunks
        self.reads = 0

    def __getitem__(self, key):
        self.reads += 1
        return self.array[key]


REGIONS = [(0, 0, 128, 128), (200, 190, 128, 128), (872, 1072, 128, 128), (250, 250, 300, 520),
           (999, 0, 1, 1200), (0, 1199, 1000, 1)]


@pytest.mark.parametrize("capacity", [None, 1])
def test_regions_read_through_the_chunks_equal_direct_reads(slide, capacity):
    path, img = slide
    image = open_slide(path)
    cache = ChunkCache(image, capacity=capacity)
    for y, x, h, w in REGIONS:
        got = cache.read(slice(y, y + h), slice(x, x + w))
        assert got.dtype == np.uint8 and np.array_equal(got, img[y:y + h, x:x + w])
    if capacity == 1:
        assert len(cache._blocks) == 1


def test_each_stored_tile_is_decoded_once_by_a_tiled_run(slide):
    path, img = slide
    image = open_slide(path)
    counting = CountingArray(image.array)
    image = LazyImage(counting, -1, image.path, level=0, overview_array=image.overview_array)
    tiled = prepare_tiled(image, load_backbone("demo"), RunConfig(tiled=True, n_boot=4))
    order = np.flatnonzero(tiled.tissue.tiles)
    assert 0 < order.size < tiled.layout.n_tiles
    th, tw = tiled.layout.tile
    for index in order:
        y, x = tiled.layout.origin(int(index))
        assert np.array_equal(tiled.read_raw(int(index)), img[y:y + th, x:x + tw])
    # the tissue (left half) spans 4 x 3 stored tiles: read once each, not once per model tile
    assert counting.reads <= 4 * 3 < order.size
