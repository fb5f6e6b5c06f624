"""A user's tissue mask file too large to hold as a boolean image, read a band of rows at a time.

A mask exported at a slide's full resolution is as large as the slide: 50,000² pixels are
2.5 GB in 8 bits, and reading it whole, then comparing it with 0, took twice that before the
run began. Such a file (a TIFF, read through tifffile's zarr store, or a ``.npy`` array,
memory-mapped) is read here in bands of rows and kept as one bit per pixel
(:class:`PackedMask`: 312 MB at 50,000²). Every reader of a tissue mask (the tiles' tissue
shares, the glass tokens, the result's display copy, the null tiles' positions) reads rows,
single pixels or a grid of pixels, which the packed mask serves exactly: the tiles, tokens and
nulls are the same as from the mask read whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

#: Pixels of a mask file above which it is read a band at a time and packed (8192²: 64 MB
#: as a boolean image; its file read whole, at most twice that).
PACKED_MASK_PIXELS = 1 << 26

#: Pixels of the file read at a time (a band of rows): 16 M values, 16–64 MB.
BAND_PIXELS = 1 << 24


class PackedMask:
    """A boolean image stored as one bit per pixel, indexed like a NumPy array of bool.

    Supports what the tissue mask's readers ask: ``shape``, ``mask[a:b]`` (rows, or rows and
    columns as slices), ``mask[y, x]`` (one pixel), ``mask[np.ix_(rows, cols)]`` (a grid)
    and ``np.asarray(mask)`` (the whole image unpacked: for small masks only).
    """

    ndim = 2
    dtype = np.dtype(bool)

    def __init__(self, bits: np.ndarray, width: int) -> None:
        self.bits = bits
        self.shape = (int(bits.shape[0]), int(width))

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self) -> int:
        return int(self.bits.nbytes)

    def rows(self, start: int, stop: int) -> np.ndarray:
        """``(stop - start, W)`` bool: rows ``start:stop`` unpacked."""
        return np.unpackbits(self.bits[start:stop], axis=1, count=self.shape[1]).view(bool)

    def __getitem__(self, key: Any) -> Any:
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) == 1:
            key = (key[0], slice(None))
        if len(key) != 2:
            raise IndexError(f"a mask has 2 axes, got an index of {len(key)}")
        ys, xs = key
        if isinstance(ys, slice) and ys.step in (None, 1):  # a band of rows
            start, stop, _ = ys.indices(self.shape[0])
            return self.rows(start, max(start, stop))[:, xs]
        if _scalar(ys):
            y = int(ys) + (self.shape[0] if int(ys) < 0 else 0)
            if _scalar(xs):  # one pixel, from its byte
                x = int(xs) + (self.shape[1] if int(xs) < 0 else 0)
                return bool((self.bits[y, x >> 3] >> (7 - (x & 7))) & 1)
            return self.rows(y, y + 1)[0][xs]
        rows = np.arange(self.shape[0])[ys]  # strided or listed rows; np.ix_'s (n, 1)
        if isinstance(xs, np.ndarray) and rows.ndim == 2 and rows.shape[1] == 1 \
                and xs.ndim == 2 and xs.shape[0] == 1:  # a grid: its columns, band by band
            out = np.empty((rows.shape[0], xs.shape[1]), dtype=bool)
            step = max(1, BAND_PIXELS // self.shape[1])
            for i in range(0, rows.shape[0], step):
                picked = self.bits[rows[i:i + step, 0]]
                out[i:i + step] = np.unpackbits(picked, axis=1,
                                                count=self.shape[1]).view(bool)[:, xs[0]]
            return out
        if rows.ndim == 1:  # strided or listed rows: those rows alone
            unpacked = np.unpackbits(self.bits[rows], axis=1, count=self.shape[1]).view(bool)
            return unpacked[:, xs]
        return np.asarray(self)[ys, xs]  # other fancy indexing: no reader of a mask asks it

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self.rows(0, self.shape[0])
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def __len__(self) -> int:
        return self.shape[0]


def _scalar(index: Any) -> bool:
    return not isinstance(index, slice) and np.ndim(index) == 0


def bool_rows(mask: Any) -> Any:
    """``mask`` as what the tissue mask's readers index: a :class:`PackedMask` as it is (never
    unpacked whole), anything else as a NumPy array of bool."""
    return mask if isinstance(mask, PackedMask) else np.asarray(mask, dtype=bool)


def _zarr_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("zarr") is not None


def open_mask_file(path: Path) -> tuple[Any, tuple[int, ...]] | None:
    """The pixels of a TIFF or ``.npy`` mask file, indexable without reading it whole, and
    its shape; None when the file is small (:data:`PACKED_MASK_PIXELS`) or its format is read
    whole anyway (other images, or a TIFF without the zarr extra)."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    elif suffix in (".tif", ".tiff"):
        if not _zarr_installed():  # without the extra that brings zarr: read whole, as before
            return None
        import zarr

        from napari_attnreg.core.run.lazy import full_resolution_array, tiff_store

        array = full_resolution_array(zarr.open(tiff_store(path), mode="r"))
    else:
        return None
    shape = tuple(int(n) for n in array.shape)
    plane = [n for n in shape if n != 1]
    if len(plane) < 2 or plane[0] * plane[1] <= PACKED_MASK_PIXELS:
        return None
    return array, shape


def read_packed(array: Any, shape: tuple[int, ...]) -> tuple[PackedMask, bool] | None:
    """A large mask file's pixels (:func:`open_mask_file`) as a :class:`PackedMask`, merged
    and thresholded as :func:`~napari_attnreg.core.run.tissue.read_mask` does a mask read
    whole, and whether it was a probability map; None when it is not a 2D mask (or RGB(A)),
    for the caller's error."""
    lead = tuple(0 if n == 1 else slice(None) for n in shape)
    squeezed = tuple(n for n in shape if n != 1)
    channels = len(squeezed) == 3 and squeezed[-1] in (3, 4)
    if not (len(squeezed) == 2 or channels):
        return None
    h, w = squeezed[:2]
    band = max(1, BAND_PIXELS // w)
    # the file's rows are its first non-singleton axis
    row_axis = next(i for i, n in enumerate(shape) if n != 1)

    def read(start: int, stop: int) -> np.ndarray:
        index = list(lead)
        index[row_axis] = slice(start, stop)
        return np.asarray(array[tuple(index)])

    def plane_of(block: np.ndarray, alpha: bool) -> np.ndarray:
        if not channels:
            return block
        return block[..., 3] if alpha else block[..., :3].max(axis=-1)

    dtype = np.dtype(array.dtype)
    alpha = False
    if channels and squeezed[-1] == 4:  # painted in the alpha alone: its colour black throughout
        alpha = not any(read(s, min(h, s + band))[..., :3].any() for s in range(0, h, band))
    probability = False
    if dtype.kind == "f":  # a probability map: finite values in [0, 1], some between
        lo, hi, between = np.inf, -np.inf, False
        for s in range(0, h, band):
            values = plane_of(read(s, min(h, s + band)), alpha)
            finite = values[np.isfinite(values)]
            if finite.size:
                lo, hi = min(lo, float(finite.min())), max(hi, float(finite.max()))
                between = between or bool(np.any((finite > 0.0) & (finite < 1.0)))
        probability = bool(np.isfinite(lo) and lo >= 0.0 and hi <= 1.0 and between)
    bits = np.empty((h, -(-w // 8)), dtype=np.uint8)
    for s in range(0, h, band):
        values = plane_of(read(s, min(h, s + band)), alpha)
        bits[s:s + values.shape[0]] = np.packbits(values >= 0.5 if probability else values > 0,
                                                  axis=1)
    return PackedMask(bits, w), probability
