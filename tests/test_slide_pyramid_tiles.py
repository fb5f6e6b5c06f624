"""The coarse display levels of a single-level TIFF slide read the file's tiles directly,
decoded on several threads, where zarr's store decoded them one at a time: the pixels are
the store's bit for bit (SVS, plain tiled TIFF and OME-TIFF; JPEG RGB, YCbCr and grey,
uncompressed, deflate, LZW; inner and edge blocks), anything else is read as before, and
the file stays one handle, closed with the slide."""

from __future__ import annotations

import gc
import io
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

from napari_attnreg._napari import slide_pyramid
from napari_attnreg._napari.slide_pyramid import (
    BackgroundFill,
    BlockMeanLevel,
    display_levels,
)
from napari_attnreg.core.run import tiff_tiles
from napari_attnreg.core.run.tiff_tiles import TiffTiles
from napari_attnreg.io.ometiff import image_view
from napari_attnreg.io.slides import open_slide

H, W = 300, 270  # not a whole number of tiles or blocks: edge tiles and edge blocks

#: (name, compression, photometric, samples, tile side, extra TiffWriter.write keywords)
LAYOUTS = [
    ("jpeg-rgb", "jpeg", "rgb", 3, 64, {}),
    ("jpeg-ycbcr", "jpeg", "ycbcr", 3, 64, {"subsampling": (2, 2)}),
    ("jpeg-grey", "jpeg", "minisblack", 1, 48, {}),
    ("none-rgb", None, "rgb", 3, 64, {}),
    ("deflate-grey", "zlib", "minisblack", 1, 64, {}),
    ("lzw-rgb", "lzw", "rgb", 3, 32, {"predictor": True}),
]


def _pixels(samples: int) -> np.ndarray:
    """Tissue-like pixels (smooth shading and noise) that JPEG keeps lossy but varied."""
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:H, 0:W]
    shade = 120 + 60 * np.sin(y / 17.0) * np.cos(x / 11.0)
    img = shade[..., None] + rng.normal(0, 20, (H, W, samples))
    img = np.clip(img, 0, 255).astype(np.uint8)
    return img if samples > 1 else img[..., 0]


def _write(path: Path, kind: str, layout: tuple) -> np.ndarray:
    """A single-level tiled file: an Aperio SVS, a plain TIFF or an OME-TIFF."""
    _, compression, photometric, samples, tile, extra = layout
    img = _pixels(samples)
    said: dict = {"metadata": None}
    if kind == "svs":
        said["description"] = (f"Aperio Image Library v10.0.50\n{W}x{H} [0,0 {W}x{H}] "
                               f"({tile}x{tile}) JPEG/RGB Q=70|AppMag = 40|MPP = 0.25")
    elif kind == "ome":
        said["metadata"] = {"axes": "YXS" if samples > 1 else "YX",
                            "PhysicalSizeX": 0.25, "PhysicalSizeY": 0.25}
    with tifffile.TiffWriter(path, bigtiff=True, ome=kind == "ome") as tif:
        tif.write(img, tile=(tile, tile), compression=compression, photometric=photometric,
                  **extra, **said)
    return img


def _shared_tables_svs(path: Path) -> None:
    """An Aperio SVS as the scanner writes it: JPEG tiles (YCbCr 4:2:0) without their
    quantisation and Huffman tables, which the JPEGTables tag holds once."""
    from PIL import Image

    img, tile = _pixels(3), 64
    padded = np.pad(img, ((0, -H % tile), (0, -W % tile), (0, 0)), mode="edge")
    tables, tiles = None, []
    for y in range(0, padded.shape[0], tile):
        for x in range(0, padded.shape[1], tile):
            buffer = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(padded[y:y + tile, x:x + tile])).save(
                buffer, "JPEG", quality=90)
            data, i, segments = buffer.getvalue(), 2, []
            while True:  # the marker segments up to the scan
                marker, length = struct.unpack(">HH", data[i:i + 4])
                segments.append((marker, data[i:i + 2 + length]))
                i += 2 + length
                if marker == 0xFFDA:
                    break
            shared = b"\xff\xd8" + b"".join(d for m, d in segments if m in (0xFFDB, 0xFFC4)) \
                + b"\xff\xd9"
            assert tables in (None, shared)
            tables = shared
            tiles.append(b"\xff\xd8" + b"".join(d for m, d in segments if m in (0xFFC0, 0xFFDA))
                         + data[i:])
    with tifffile.TiffWriter(path) as tif:
        tif.write(iter(tiles), shape=img.shape, dtype=np.uint8, tile=(tile, tile),
                  photometric="ycbcr", subsampling=(2, 2), compression="jpeg",
                  jpegtables=tables, metadata=None,
                  description=f"Aperio Image Library v12.0.15\n{W}x{H} [0,0 {W}x{H}] "
                              f"({tile}x{tile}) JPEG/RGB Q=90|AppMag = 40|MPP = 0.25")


def _source(path: Path, kind: str):
    return image_view(path) if kind == "ome" else open_slide(str(path)).array


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 128 file pixels a side: several blocks, and edge blocks, from a small file."""
    monkeypatch.setattr(slide_pyramid, "BLOCK_SIDE", 128)


@pytest.mark.parametrize("kind", ["svs", "tiff", "ome"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout[0] for layout in LAYOUTS])
def test_tiles_read_directly_equal_the_stores_pixels(tmp_path, small_blocks, kind, layout):
    path = tmp_path / f"slide.{'ome.tif' if kind == 'ome' else kind if kind == 'svs' else 'tif'}"
    img = _write(path, kind, layout)
    source = _source(path, kind)
    tiles = TiffTiles.of(source)
    assert tiles is not None, f"{kind} {layout[0]} is read through the store"
    whole = tiles.read(0, H, 0, W)
    stored = np.asarray(source[0:H, 0:W])
    assert whole.dtype == stored.dtype and whole.shape == stored.shape == img.shape
    assert np.array_equal(whole, stored)
    if layout[1] != "jpeg":
        assert np.array_equal(whole, img)
    rng = np.random.default_rng(11)
    for _ in range(8):  # regions across tile borders, at the image's edges, one pixel
        y0, x0 = int(rng.integers(0, H)), int(rng.integers(0, W))
        y1, x1 = int(rng.integers(y0 + 1, H + 1)), int(rng.integers(x0 + 1, W + 1))
        assert np.array_equal(tiles.read(y0, y1, x0, x1), np.asarray(source[y0:y1, x0:x1]))
    assert np.array_equal(tiles.read(H - 1, H, W - 1, W), stored[H - 1:, W - 1:])

    # every block of every display level, inner and edge, as computed through the store
    for level in display_levels(source, 40):  # factors 2, 4, 8
        assert level.tiles is not None
        through_store = BlockMeanLevel(source, level.factor)
        through_store.tiles = None
        rows, cols = -(-level.shape[0] // level.block), -(-level.shape[1] // level.block)
        for key in [(by, bx) for by in range(rows) for bx in range(cols)]:
            direct, stored_block = level._compute(*key), through_store._compute(*key)
            assert direct.dtype == stored_block.dtype
            assert np.array_equal(direct, stored_block), (level.factor, key)


def test_tiles_without_their_jpeg_tables_equal_the_stores_pixels(tmp_path, small_blocks):
    path = tmp_path / "aperio.svs"
    _shared_tables_svs(path)
    source = open_slide(str(path)).array
    tiles = TiffTiles.of(source)
    assert tiles is not None and tiles.page.jpegtables is not None
    assert np.array_equal(tiles.read(0, H, 0, W), np.asarray(source[0:H, 0:W]))
    assert np.array_equal(tiles.read(61, 250, 3, 199), np.asarray(source[61:250, 3:199]))
    for level in display_levels(source, 40):
        through_store = BlockMeanLevel(source, level.factor)
        through_store.tiles = None
        assert np.array_equal(level.read(...), through_store.read(...))


def test_empty_tiles_read_as_the_stores_fill_value(tmp_path):
    """A tile the scanner left out (offset and byte count 0) is the store's fill value."""
    path = tmp_path / "holes.tif"
    img = _pixels(3)
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(64, 64), compression="zlib", photometric="rgb", metadata=None)
    with tifffile.TiffFile(path, mode="r+b") as tif:  # tile 1 (row 0, columns 64-127)
        page = tif.pages[0]
        n = len(page.databytecounts)
        for name, values in (("TileOffsets", page.dataoffsets),
                             ("TileByteCounts", page.databytecounts)):
            page.tags[name].overwrite([0 if i == 1 else v for i, v in enumerate(values)])
    source = open_slide(str(path)).array
    tiles = TiffTiles.of(source)
    assert tiles is not None and n > 2
    whole = tiles.read(0, H, 0, W)
    assert np.array_equal(whole, np.asarray(source[0:H, 0:W]))
    assert not whole[:64, 64:128].any() and np.array_equal(whole[64:], img[64:])


def test_other_layouts_are_read_through_their_array(tmp_path):
    import dask.array as da

    img = _pixels(3)
    assert TiffTiles.of(img) is None
    assert TiffTiles.of(da.from_array(img)) is None
    strips = tmp_path / "strips.tif"  # strips, not tiles
    tifffile.imwrite(strips, img, compression="zlib", photometric="rgb", metadata=None)
    assert TiffTiles.of(open_slide(str(strips)).array) is None
    planes = tmp_path / "planes.ome.tif"  # an OME-TIFF of channels: one page each
    tifffile.imwrite(planes, np.moveaxis(img, -1, 0), tile=(64, 64), ome=True,
                     metadata={"axes": "CYX"})
    view = image_view(planes)
    assert view is not None and TiffTiles.of(view) is None
    level = BlockMeanLevel(view, 2)
    assert level.tiles is None and np.array_equal(level[0:3, 0:3], level._compute(0, 0)[:3, :3])


def test_a_blocks_tiles_are_decoded_on_several_threads(tmp_path, small_blocks, monkeypatch):
    """zarr's store decoded the tiles of a block on its one event-loop thread; here they
    are decoded at once (imagecodecs releases the GIL). Each decode is held a moment so
    that decodes running at once overlap, and counted."""
    import imagecodecs

    path = tmp_path / "slide.svs"
    _write(path, "svs", LAYOUTS[0])
    monkeypatch.setattr(tiff_tiles, "DECODE_WORKERS", 4)
    monkeypatch.setattr(tiff_tiles, "_decoders", None)  # a pool of 4 for this test
    decode, lock, now, most = imagecodecs.jpeg_decode, threading.Lock(), [0], [0]

    def counted(*args, **kwargs):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        try:
            time.sleep(0.02)
            return decode(*args, **kwargs)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(imagecodecs, "jpeg_decode", counted)
    level = BlockMeanLevel(open_slide(str(path)).array, 2)  # a block: 128² pixels, 4 tiles
    level.compute_block((0, 0))
    assert level.holds((0, 0))
    assert most[0] >= 2, "the block's tiles were decoded one at a time"
    tiff_tiles._decoders.shutdown()


def test_fills_and_reads_through_the_store_at_once_agree(tmp_path, small_blocks):
    """The tiles are read through the store's file handle under its lock: reads through the
    zarr array and block fills on other threads at the same time get the same pixels."""
    path = tmp_path / "slide.svs"
    _write(path, "svs", LAYOUTS[4])
    source = open_slide(str(path)).array
    expected = np.asarray(source[0:H, 0:W])
    levels = display_levels(source, 40)
    fill = BackgroundFill("slide.svs", workers=3)
    for level in levels:
        level.fill = fill
        keys = [(by, bx) for by in range(-(-level.shape[0] // level.block))
                for bx in range(-(-level.shape[1] // level.block))]
        fill.request(level, keys)
    bad: list[str] = []

    def reader(k: int) -> None:
        for i in range(20):
            y0, x0 = (7 * i + k) % (H - 50), (11 * i + 3 * k) % (W - 50)
            if not np.array_equal(np.asarray(source[y0:y0 + 50, x0:x0 + 50]),
                                  expected[y0:y0 + 50, x0:x0 + 50]):
                bad.append(f"{y0}, {x0}")

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    end = time.monotonic() + 30
    while fill.busy:
        assert time.monotonic() < end, "the fill did not finish"
        time.sleep(0.01)
    assert not bad and fill.news()[2] == []
    for level in levels:
        through_store = BlockMeanLevel(source, level.factor)
        through_store.tiles = None
        assert np.array_equal(level.read(...), through_store.read(...))


def test_a_damaged_tile_is_said_and_the_rest_of_the_level_is_read(tmp_path, small_blocks):
    path = tmp_path / "slide.svs"
    _write(path, "svs", LAYOUTS[0])
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        at, count = page.dataoffsets[0], page.databytecounts[0]
    with open(path, "r+b") as f:  # the first tile's JPEG data overwritten
        f.seek(at)
        f.write(b"\xff" * count)
    level = BlockMeanLevel(open_slide(str(path)).array, 2)
    assert level.tiles is not None
    with pytest.raises(Exception):  # noqa: B017 - the decoder's own error, as the store's
        level.compute_block((0, 0))
    fill = BackgroundFill("slide.svs")
    level.fill = fill
    fill.request(level, [(0, 0), (1, 1)])
    end = time.monotonic() + 20
    while fill.busy:
        assert time.monotonic() < end
        time.sleep(0.01)
    done, asked, errors = fill.news()
    assert (done, asked) == (2, 2) and len(errors) == 1
    assert "rows 0–128, columns 0–128" in errors[0] and level.holds((1, 1))


def test_the_file_is_closed_with_the_slide_not_held_by_its_tiles(tmp_path, small_blocks):
    import psutil

    path = tmp_path / "slide.svs"
    _write(path, "svs", LAYOUTS[0])
    source = open_slide(str(path)).array
    levels = display_levels(source, 40)
    for level in levels:
        level.compute_block((0, 0))
    assert levels[0].tiles is not None

    def open_here() -> int:
        return sum(Path(f.path) == path for f in psutil.Process().open_files())

    assert open_here() == 1  # one handle, the slide's, however many blocks were read
    del source, levels, level
    gc.collect()
    assert open_here() == 0


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int8, np.int16, np.int32, np.uint32,
                                   np.float32, np.bool_])
def test_block_means_of_every_pixel_type_are_exact(dtype, monkeypatch):
    """The block sums of whole numbers are added a row, then a column, at a time (8-bit rows
    in 16 bits): each block is the rounded mean of what it holds, edge blocks included."""
    monkeypatch.setattr(slide_pyramid, "BLOCK_SIDE", 96)
    rng = np.random.default_rng(2)
    shape = (211, 150, 3)
    if np.dtype(dtype).kind == "f":
        img = rng.normal(0, 1000, shape).astype(dtype)
    elif np.dtype(dtype).kind == "b":
        img = rng.random(shape) > 0.4
    else:
        info = np.iinfo(dtype)
        img = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    for f in (2, 3, 4, 16, 128):
        level = BlockMeanLevel(img, f)
        rows, cols = np.arange(0, shape[0], f), np.arange(0, shape[1], f)
        sums = np.add.reduceat(np.add.reduceat(img.astype(np.float64), rows, axis=0), cols,
                               axis=1)
        counts = np.outer(np.diff([*rows, shape[0]]), np.diff([*cols, shape[1]]))
        mean = sums / counts[..., None]
        expected = mean.astype(dtype) if np.dtype(dtype).kind == "f" else \
            np.rint(mean).astype(dtype)
        got = level.read(...)
        assert got.dtype == np.dtype(dtype) and got.shape == expected.shape
        if np.dtype(dtype).kind == "f":  # sums in another order: the last bit may differ
            assert np.allclose(got, expected, rtol=1e-6)
        else:
            assert np.array_equal(got, expected), f


def test_a_closed_file_is_read_through_the_store_which_opens_it_again(tmp_path, small_blocks):
    path = tmp_path / "slide.svs"
    _write(path, "svs", LAYOUTS[0])
    level = BlockMeanLevel(open_slide(str(path)).array, 2)
    first = level._compute(1, 1)
    level.tiles.page.parent.filehandle.close()  # e.g. the slide closed by its owner
    assert level.tiles.closed
    assert np.array_equal(level._compute(1, 1), first)
    assert not level.tiles.closed  # the store opened the same handle: tiles read again
    assert np.array_equal(level._compute(1, 1), first)
