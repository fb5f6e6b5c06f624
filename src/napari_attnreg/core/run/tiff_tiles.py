"""Regions and thumbnails of a tiled TIFF page, its tiles decoded several at once.

A TIFF read through tifffile's zarr store (a plain tiled TIFF, a slide level of one page)
decodes its tiles one at a time. Reading a large one-level image's thumbnail (a run's
tissue mask and intensity range, the notebook's picture, napari's overview) decoded every
tile that way: 5.4 s for a 20000² JPEG TIFF. :class:`TiffTiles` reads the compressed tiles
through the store's own file handle and decodes them on :data:`DECODE_WORKERS` threads
with the store's own decoder, so the pixels are the store's, bit for bit.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

#: Threads decoding a file's tiles at once, shared by every reader.
DECODE_WORKERS = max(1, min(8, os.cpu_count() or 1))
#: Tiles decoded per band of a strided read (its decoded pixels: 256 × 512² pixels at most).
BAND_TILES = 256

_decoders: ThreadPoolExecutor | None = None
_decoders_lock = threading.Lock()


class TiffTiles:
    """Regions of one tiled TIFF page read by decoding its tiles directly, several at once.

    A slide's level read through its zarr store (tiffslide's, tifffile's) decodes every
    tile on zarr's one event-loop thread: the fill's worker threads waited on each other
    (about 70 ms a 2048² JPEG block, one block at a time). Here a region's tiles are read
    from the file through the store's own file handle under the store's lock (no file
    opened again, closed with the store) and decoded by :data:`DECODE_WORKERS` threads
    (imagecodecs releases the GIL) with the same tifffile decoder, arguments and fill value
    as the store: the pixels are the store's, bit for bit. Use :meth:`of` to get one.
    """

    def __init__(self, page: Any, lock: Any, fill: Any, squeeze: bool) -> None:
        self.page, self.lock, self.squeeze = page, lock, squeeze
        _, _, self.height, self.width, self.samples = (int(n) for n in page.shaped)
        self.dtype = np.dtype(page.dtype)
        self.fill = fill
        self.decode = page.decode  # tifffile's decoder of the page's segments
        self.args = {"jpegtables": page.jpegtables, "jpegheader": page.jpegheader,
                     "_fullsize": True}

    @classmethod
    def of(cls, source: Any) -> TiffTiles | None:
        """The tiles under ``source`` when it is the zarr array, over tifffile's store
        (tiffslide's slide levels, an OME-TIFF's image view with channels last), of one
        tiled TIFF page of contiguous samples; None for anything else (read as before: a
        DICOM WSI, a dask array, strips, planes, a composed level)."""
        try:
            return cls._of(source)
        except Exception:  # noqa: BLE001 - any layout not understood here is read as before
            return None

    @classmethod
    def _of(cls, source: Any) -> TiffTiles | None:
        from tifffile import TiffPage
        from tifffile.zarr import ZarrTiffStore

        array = source
        kept = getattr(source, "kept", None)  # an OME-TIFF's view (io.ometiff.image_view):
        if kept is not None:  # read here only as the file holds it, (Y, X[, S])
            if source.channel is not None or list(kept) != list(range(len(source.array.shape))):
                return None
            array = source.array
        store, path = array.store, str(array.path)
        if not isinstance(store, ZarrTiffStore):  # tiffslide mounts a store per series
            prefix, _, path = path.partition("/")
            store = store._stores[prefix]
        if not isinstance(store, ZarrTiffStore) or store._chunkmode or \
                store._transform is not None:
            return None
        if not store._multiscales and path:
            return None
        series = store._data[int(path) if store._multiscales else 0]
        if len(series.pages) != 1:
            return None
        page = series.pages[0]
        if not isinstance(page, TiffPage) or not page.is_tiled or page.tiledepth != 1 or \
                page.shaped[:2] != (1, 1) or page.planarconfig != 1:
            return None
        _, _, h, w, samples = page.shaped
        if tuple(source.shape) != ((h, w, samples) if samples > 1 else (h, w)) or \
                tuple(array.shape) != tuple(source.shape) or \
                np.dtype(page.dtype) != np.dtype(source.dtype):
            return None
        fill = array.fill_value
        return cls(page, store._filecache.lock, 0 if fill is None else fill,
                   squeeze=samples == 1)

    @property
    def closed(self) -> bool:
        """Whether the file is closed (then read through the store, which opens it)."""
        return bool(self.page.parent.filehandle.closed)

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Rows ``y0:y1``, columns ``x0:x1`` of the page (``(h, w)`` or ``(h, w, S)``)."""
        return self.strided(slice(y0, y1), slice(x0, x1))

    def strided(self, ys: slice, xs: slice) -> np.ndarray:
        """Pixels ``[ys, xs]`` of the page (``(h, w)`` or ``(h, w, S)``), any steps: a
        thumbnail of the whole page decodes each tile it takes a pixel from once, a band of
        tile rows at a time (:data:`BAND_TILES` tiles), several tiles at once."""
        th, tw = int(self.page.tilelength), int(self.page.tilewidth)
        rows = np.arange(*ys.indices(self.height))
        cols = np.arange(*xs.indices(self.width))
        out = np.full((rows.size, cols.size, self.samples), self.fill, self.dtype)
        if rows.size and cols.size:
            across = -(-self.width // tw)
            tile_cols = np.unique(cols // tw)
            tile_rows = np.unique(rows // th)
            per_band = max(1, BAND_TILES // tile_cols.size)
            for first in range(0, tile_rows.size, per_band):
                band = tile_rows[first:first + per_band]
                self._paste([int(ty) * across + int(tx) for ty in band for tx in tile_cols],
                            rows, cols, out)
        return out[..., 0] if self.squeeze else out

    def _paste(self, index: list[int], rows: np.ndarray, cols: np.ndarray,
               out: np.ndarray) -> None:
        """Decode the tiles ``index`` and put their pixels among ``rows × cols`` into ``out``."""
        th, tw = int(self.page.tilelength), int(self.page.tilewidth)
        offsets, counts = self.page.dataoffsets, self.page.databytecounts
        # the compressed tiles read first, in file order, one read at a time under the
        # store's lock (its reads seek the same handle); empty tiles come as None: fill value
        segments = list(self.page.parent.filehandle.read_segments(
            [offsets[i] for i in index], [counts[i] for i in index], index,
            lock=self.lock, sort=True))

        def paste(segment: tuple[bytes | None, int]) -> None:
            data, i = segment
            if data is None:
                return
            tile, (_, _, ty, tx, _), _ = self.decode(data, i, **self.args)
            # the wanted rows and columns inside this tile (sorted: a slice of each)
            r0, r1 = np.searchsorted(rows, [ty, ty + th])
            c0, c1 = np.searchsorted(cols, [tx, tx + tw])
            if r0 < r1 and c0 < c1:
                out[r0:r1, c0:c1] = tile[0][_run(rows[r0:r1] - ty)][:, _run(cols[c0:c1] - tx)]

        if len(segments) > 1 and DECODE_WORKERS > 1:
            for _ in decoder_pool().map(paste, segments):  # raises a tile's error here
                pass
        else:
            for segment in segments:
                paste(segment)


def decoder_pool() -> ThreadPoolExecutor:
    """The threads decoding tiles, shared by all levels and fills (their number bounded
    whatever the blocks asked at once)."""
    global _decoders
    with _decoders_lock:
        if _decoders is None:
            _decoders = ThreadPoolExecutor(max_workers=DECODE_WORKERS,
                                           thread_name_prefix="attnreg tile decoding")
        return _decoders


def _run(positions: np.ndarray) -> slice | np.ndarray:
    """Ascending positions as a slice when they are a run of steps of one (a region's
    pixels: a view, not a copy), else as they are."""
    first, last = int(positions[0]), int(positions[-1])
    step = (last - first) // (positions.size - 1) if positions.size > 1 else 1
    if step >= 1 and np.array_equal(positions, np.arange(first, last + 1, step)):
        return slice(first, last + 1, step)
    return positions
