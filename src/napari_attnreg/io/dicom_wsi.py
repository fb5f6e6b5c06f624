"""DICOM whole-slide images (VL Whole Slide Microscopy, Modality SM) opened as slides.

A DICOM WSI stores a slide as one multi-frame instance per pyramid level (usually a folder of
a slide's instances, with LABEL, OVERVIEW and THUMBNAIL images beside the VOLUME levels). Each
frame is a tile of the level's ``TotalPixelMatrixRows`` x ``TotalPixelMatrixColumns``, in row
order (``TILED_FULL``) or placed frame by frame (``TILED_SPARSE``). Read as a volume, a level
would be a stack of hundreds of tiles; here it is a slide level, as
:func:`~napari_attnreg.io.slides.open_slide` opens an SVS: a
:class:`~napari_attnreg.core.run.lazy.LazyImage` whose array decodes only the frames a region
needs (a small cache keeps the last ones), chosen by ``level`` or ``mpp`` with the same rules.

Read: the VOLUME instances of one slide (one series), native or encapsulated frames in any
transfer syntax pydicom decodes here (JPEG baseline through Pillow, JPEG 2000 where Pillow
has OpenJPEG), the first focal plane and optical path. Not read: a level split over several
files (concatenations), frames placed off the tile grid. Needs pydicom 3.

Example
-------
>>> image = open_dicom_slide("slide_folder/", level=1)          # doctest: +SKIP
>>> image.level, image.mpp, image.analysed_shape                 # doctest: +SKIP
(1, 0.5, (20000, 15000))
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.core.files import decoding
from napari_attnreg.core.run.lazy import LazyImage
from napari_attnreg.io.dicom import WSI_SOP_CLASS, dicom_files, is_dicom_file
from napari_attnreg.io.slides import SlideLevels, check_choice, overview_index, stated_mpp

#: Image types (third value of ImageType) that are no pyramid level of the slide.
NOT_LEVELS = ("LABEL", "OVERVIEW", "THUMBNAIL")
#: Decoded frames a level keeps (bytes); the least recently used are dropped first.
CACHE_BYTES = 64 << 20
_ITEM_TAG, _SEQUENCE_END = 0xFFFEE000, 0xFFFEE0DD


def _pydicom() -> Any:
    try:
        import pydicom
        from pydicom.pixels import get_decoder  # noqa: F401  pydicom 3
    except ImportError as err:
        raise ValueError("Reading DICOM whole-slide images needs pydicom 3: pip install "
                         "'pydicom>=3'.") from err
    return pydicom


def is_wsi_file(path: str | Path) -> bool:
    """A DICOM file of the VL Whole Slide Microscopy class, from its file meta only."""
    p = Path(path)
    if not is_dicom_file(p):
        return False
    try:
        from pydicom.filereader import read_file_meta_info

        meta = read_file_meta_info(p)
    except Exception:  # noqa: BLE001  no pydicom, or no readable file meta: not one we know
        return False
    return str(meta.get("MediaStorageSOPClassUID", "")) == WSI_SOP_CLASS


def is_dicom_wsi(path: str | Path, files: Sequence[str | Path] | None = None,
                 max_checked: int = 64) -> bool:
    """A DICOM WSI file, or a folder (or the DICOM ``files`` of one) holding one.

    Only the file meta of at most ``max_checked`` files is read, so a large CT folder is
    declined quickly.
    """
    if files:
        return any(is_wsi_file(f) for f in list(files)[:max_checked])
    p = Path(path)
    if p.is_file():
        return is_wsi_file(p)
    if not p.is_dir() or p.suffix.lower() == ".zarr":
        return False
    for checked, entry in enumerate(sorted(p.iterdir())):
        if checked >= max_checked:
            return False
        if is_wsi_file(entry):
            return True
    return False


@dataclass(frozen=True)
class _Pixels:
    """How one instance's frames are stored and decoded."""

    rows: int  # tile size
    columns: int
    samples: int
    bits: int  # allocated
    bits_stored: int
    photometric: str
    planar: int
    transfer_syntax: str
    #: per frame: the (file offset, byte count) of its fragment values, or of its native bytes
    frames: tuple[tuple[tuple[int, int], ...], ...]

    @property
    def encapsulated(self) -> bool:
        from pydicom.uid import UID

        return UID(self.transfer_syntax).is_encapsulated


class DicomLevel:
    """One pyramid level of a DICOM WSI as an array: ``(H, W, 3)`` (or ``(H, W)``), decoded
    frame by frame as regions are indexed, the last frames decoded kept (up to
    :data:`CACHE_BYTES`). ``chunks`` is the tile size, so
    :class:`~napari_attnreg.core.run.lazy.ChunkCache` reads it tile by tile. Safe to share
    between threads; a pickled copy opens the file again."""

    def __init__(self, path: Path, height: int, width: int, pixels: _Pixels,
                 grid: dict[tuple[int, int], int]) -> None:
        self.path, self.pixels, self.grid = path, pixels, grid
        rgb = pixels.samples > 1
        self.shape: tuple[int, ...] = (height, width, 3) if rgb else (height, width)
        self.dtype = np.dtype(np.uint8 if pixels.bits <= 8 else np.uint16)
        self.chunks: tuple[int, ...] = (pixels.rows, pixels.columns, *self.shape[2:])
        frame_bytes = pixels.rows * pixels.columns * (3 if rgb else 1) * self.dtype.itemsize
        self.capacity = max(16, CACHE_BYTES // frame_bytes)
        #: missing tiles of a sparse level are empty glass: white in colour, black in grey
        self.fill = np.iinfo(self.dtype).max if rgb else 0
        self._open()

    def _open(self) -> None:
        self._lock = threading.Lock()
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._fh: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_cache", "_fh")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self[:, :]
        return whole if dtype is None else whole.astype(dtype)

    def __getitem__(self, key: Any) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis for k in key):
            at = key.index(Ellipsis)
            key = key[:at] + (slice(None),) * (self.ndim - len(key) + 1) + key[at + 1:]
        key = key + (slice(None),) * (self.ndim - len(key))
        if len(key) != self.ndim:
            raise IndexError(f"too many indices for a level of shape {self.shape}")
        rows, cols = (np.arange(self.shape[a])[key[a]] for a in range(2))
        out = self._region(np.atleast_1d(rows), np.atleast_1d(cols))
        if self.ndim == 3:
            out = out[:, :, key[2]]
        return _squeeze(out, np.ndim(rows) == 0, np.ndim(cols) == 0)

    def _region(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Pixels at every (row, column) pair of ``rows`` x ``cols``, frame by frame."""
        th, tw = self.pixels.rows, self.pixels.columns
        out = np.full((len(rows), len(cols), *self.shape[2:]), self.fill, self.dtype)
        for ty in np.unique(rows // th):
            ri = np.nonzero(rows // th == ty)[0]
            for tx in np.unique(cols // tw):
                ci = np.nonzero(cols // tw == tx)[0]
                index = self.grid.get((int(ty), int(tx)))
                if index is None:
                    continue
                tile = self._frame(index)
                ys, xs = _indexer(rows[ri] - ty * th), _indexer(cols[ci] - tx * tw)
                if isinstance(ys, slice) and isinstance(xs, slice):  # a block: no copying
                    out[ri[0]:ri[-1] + 1, ci[0]:ci[-1] + 1] = tile[ys, xs]
                else:
                    out[np.ix_(ri, ci)] = tile[np.ix_(rows[ri] - ty * th, cols[ci] - tx * tw)]
        return out

    def _frame(self, index: int) -> np.ndarray:
        with self._lock:
            if index in self._cache:
                self._cache.move_to_end(index)
                return self._cache[index]
            with decoding(self.path, "DICOM whole-slide image"):
                data = self._bytes(index)
        with decoding(self.path, "DICOM whole-slide image"):
            tile = self._decode(data)
        with self._lock:
            self._cache[index] = tile
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return tile

    def _bytes(self, index: int) -> bytes:
        if self._fh is None:
            self._fh = open(self.path, "rb")  # kept open: frames are read one by one
        parts = []
        for offset, length in self.pixels.frames[index]:
            self._fh.seek(offset)
            parts.append(self._fh.read(length))
            if len(parts[-1]) != length:
                raise ValueError(f"frame {index} ends past the end of the file (truncated)")
        return b"".join(parts)

    def _decode(self, data: bytes) -> np.ndarray:
        from pydicom import encaps
        from pydicom.pixels import get_decoder

        p = self.pixels
        tile, _ = get_decoder(p.transfer_syntax).as_array(
            encaps.encapsulate([data]) if p.encapsulated else data,
            rows=p.rows, columns=p.columns, samples_per_pixel=p.samples,
            bits_allocated=p.bits, bits_stored=p.bits_stored, pixel_representation=0,
            photometric_interpretation=p.photometric, number_of_frames=1,
            planar_configuration=p.planar, pixel_keyword="PixelData")
        tile = np.asarray(tile).astype(self.dtype, copy=False)
        if tile.ndim == 3 and self.ndim == 2:
            tile = tile[..., 0]
        return tile[..., :3] if tile.ndim == 3 else tile

    def close(self) -> None:
        """Close the file (it opens again at the next read)."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __del__(self) -> None:
        fh = self.__dict__.get("_fh")
        if fh is not None:
            fh.close()


def _indexer(positions: np.ndarray) -> slice | np.ndarray:
    """A run of consecutive positions as a slice (a block copy), else the positions."""
    if len(positions) and positions[-1] - positions[0] == len(positions) - 1 and \
            (len(positions) < 2 or bool(np.all(np.diff(positions) == 1))):
        return slice(int(positions[0]), int(positions[-1]) + 1)
    return positions


def _squeeze(out: np.ndarray, row: bool, col: bool) -> np.ndarray:
    """Drop the axes an integer index took (numpy's indexing rule)."""
    if row and col:
        return out[0, 0]
    if row:
        return out[0]
    if col:
        return out[:, 0]
    return out


@dataclass(frozen=True)
class DicomPyramid:
    """A DICOM WSI's levels (finest first) and their :class:`SlideLevels`."""

    levels: tuple[DicomLevel, ...]
    pyramid: SlideLevels
    files: tuple[Path, ...]


def wsi_pyramid(path: str | Path, files: Sequence[str | Path] | None = None) -> DicomPyramid:
    """The slide pyramid of a DICOM WSI file or folder, from the headers (no pixels read).

    Parameters
    ----------
    path : str or Path
        A folder of one slide's instances, or one of them (a level, a label): the slide is
        then the instances of its series in its folder.
    files : sequence of path, optional
        The slide's DICOM files when the caller has found them (a batch's folder scan).

    Raises
    ------
    ValueError
        No VOLUME instance (only a label, an overview or a thumbnail), several slides in the
        folder, a level split over several files, frames off the tile grid, a damaged or
        truncated file: the message names the file and what to do.
    """
    pydicom = _pydicom()
    path = Path(path)
    one = not files and path.is_file()
    if files:
        found = [Path(f) for f in files]
    else:  # a file: the slide it is part of, its other instances beside it (as OpenSlide)
        found = dicom_files(path.parent if one else path)
        found = [path, *(f for f in found if one and f.resolve() != path.resolve())] \
            if one else found
    headers = []
    for f in found:
        if not is_wsi_file(f):
            continue
        with decoding(f, "DICOM whole-slide image"), open(f, "rb") as fh:
            ds = pydicom.dcmread(fh, stop_before_pixels=True)
            pixel_tell = fh.tell()  # pydicom stops at the pixel data element's tag
        headers.append((f, ds, pixel_tell))
    if not headers:
        raise ValueError(f"{path} holds no DICOM whole-slide image (VL Whole Slide Microscopy "
                         "Image Storage).")
    if one:  # the instances of the file's own slide
        series = str(headers[0][1].get("SeriesInstanceUID", ""))
        headers = [h for h in headers if str(h[1].get("SeriesInstanceUID", "")) == series]
    volumes = [(f, ds, t) for f, ds, t in headers if _image_type(ds) not in NOT_LEVELS]
    if not volumes:
        kinds = sorted({_image_type(ds) for _, ds, _ in headers})
        raise ValueError(f"{path} holds only the {'/'.join(kinds)} image of a DICOM slide, no "
                         "pyramid level (ImageType VOLUME); open the slide's folder instead.")
    series = {str(ds.get("SeriesInstanceUID", "")) for _, ds, _ in volumes}
    if len(series) > 1:
        raise ValueError(f"{path} holds {len(series)} DICOM slides (series); put each slide's "
                         "files in a folder of their own, or run the folder as a batch.")
    concatenated = [f.name for f, ds, _ in volumes if "ConcatenationUID" in ds]
    if concatenated:
        raise ValueError(f"{path}: {', '.join(concatenated)} hold a slide level split over "
                         "several files (a DICOM concatenation), which is not read here; "
                         "convert the slide to one file per level (or to a pyramidal TIFF).")
    by_size: dict[tuple[int, int], tuple[Path, Any, int]] = {}
    for f, ds, tell in sorted(volumes, key=lambda v: int(v[1].get("InstanceNumber") or 0)):
        size = (_required(ds, "TotalPixelMatrixRows", f), _required(ds, "TotalPixelMatrixColumns", f))
        by_size.setdefault(size, (f, ds, tell))  # more focal planes/paths: the first is read
    order = sorted(by_size, key=lambda s: -s[0] * s[1])
    levels = tuple(_level(*by_size[size], size) for size in order)
    (h0, w0), first = order[0], by_size[order[0]]
    spacing = _spacing(first[1])
    stated = None if spacing is None else 1000.0 * spacing  # mm -> µm
    # a converter's default (72 dpi as 0.3528 mm and the like) is no pixel size, as in a TIFF
    mpp, note = stated_mpp(stated, "its DICOM PixelSpacing says")
    pyramid = SlideLevels(
        dimensions=tuple(order),
        downsamples=tuple((h0 / h + w0 / w) / 2 for h, w in order),
        mpp=mpp, vendor=str(first[1].get("Manufacturer", "") or "dicom"),
        ignored_mpp=None if note is None else stated, ignored_note=note)
    return DicomPyramid(levels, pyramid, tuple(f for f, _, _ in volumes))


def open_dicom_slide(path: str | Path, *, level: int | None = None, mpp: float | None = None,
                     files: Sequence[str | Path] | None = None) -> LazyImage:
    """A DICOM WSI level (or resolution) as a :class:`LazyImage` whose pixels stay on disk.

    As :func:`~napari_attnreg.io.slides.open_slide` (same ``level``/``mpp`` rules and
    messages), for a DICOM WSI file or a folder of a slide's instances.

    Raises
    ------
    ValueError
        Not a readable DICOM WSI (see :func:`wsi_pyramid`), or an impossible level or
        resolution (the message lists the slide's levels).
    """
    check_choice(level, mpp)
    slide = wsi_pyramid(path, files)
    chosen, scale = slide.pyramid.choose(level, mpp)
    array = slide.levels[chosen]
    level_mpp = slide.pyramid.level_mpp(chosen)
    # the finest coarser level small enough for a thumbnail (a tissue mask), as for SVS
    coarse = overview_index(slide.pyramid, chosen)
    overview = None if coarse is None else slide.levels[coarse]
    return LazyImage(array, -1 if array.ndim == 3 else None, str(path), scale=scale,
                     mpp=None if level_mpp is None else level_mpp * scale, level=chosen,
                     overview_array=overview, downsample=slide.pyramid.downsamples[chosen])


def _image_type(ds: Any) -> str:
    value = ds.get("ImageType")
    values = [value] if isinstance(value, str) else list(value or [])
    return str(values[2]).upper() if len(values) > 2 else "VOLUME"


def _required(ds: Any, key: str, path: Path) -> int:
    try:
        value = int(ds.get(key) or 0)
    except (TypeError, ValueError):
        value = 0
    if value <= 0:
        raise ValueError(f"{path}: the DICOM whole-slide image has no usable {key}; the file "
                         "is damaged or is no slide level.")
    return value


def _spacing(ds: Any) -> float | None:
    """mm per pixel (the mean of rows and columns) from the shared pixel measures."""
    try:
        measures = ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]
        row, col = (float(v) for v in measures.PixelSpacing)
    except Exception:  # noqa: BLE001  not stated (or damaged): the slide states no pixel size
        return None
    return (row + col) / 2 if row > 0 and col > 0 else None


def _level(path: Path, ds: Any, tell: int, size: tuple[int, int]) -> DicomLevel:
    """One VOLUME instance as a :class:`DicomLevel`: its frames located in the file."""
    rows, cols = _required(ds, "Rows", path), _required(ds, "Columns", path)
    n = _required(ds, "NumberOfFrames", path) if "NumberOfFrames" in ds else 1
    samples = int(ds.get("SamplesPerPixel") or 1)
    bits = int(ds.get("BitsAllocated") or 8)
    if samples not in (1, 3) or bits not in (8, 16):
        raise ValueError(f"{path}: DICOM slides of {samples} samples of {bits} bits per pixel "
                         "are not read here (1 or 3 samples of 8 or 16 bits are).")
    syntax = str(ds.file_meta.get("TransferSyntaxUID", ""))
    with decoding(path, "DICOM whole-slide image"):
        frames = _locate_frames(path, ds, tell, n, rows * cols * samples * bits // 8)
    pixels = _Pixels(rows, cols, samples, bits, int(ds.get("BitsStored") or bits),
                     str(ds.get("PhotometricInterpretation", "")),
                     int(ds.get("PlanarConfiguration") or 0), syntax, frames)
    return DicomLevel(path, *size, pixels, _grid(path, ds, n, size, rows, cols))


def _grid(path: Path, ds: Any, n: int, size: tuple[int, int], rows: int, cols: int,
          ) -> dict[tuple[int, int], int]:
    """(tile row, tile column) -> frame index: row order for TILED_FULL, the frames'
    positions for TILED_SPARSE (the first frame at a place: further focal planes and optical
    paths follow the first)."""
    across, down = -(-size[1] // cols), -(-size[0] // rows)
    organisation = str(ds.get("DimensionOrganizationType", "")).upper()
    per_frame = ds.get("PerFrameFunctionalGroupsSequence")
    if organisation != "TILED_SPARSE" and (organisation == "TILED_FULL" or not per_frame):
        if n < across * down:
            raise ValueError(f"{path}: the slide level has {n} frames, fewer than the "
                             f"{across}x{down} tiles of its {size[1]}x{size[0]} pixels; the "
                             "file is damaged.")
        return {(k // across, k % across): k for k in range(across * down)}
    if not per_frame or len(per_frame) < n:
        raise ValueError(f"{path}: a TILED_SPARSE slide level without a position for each "
                         "frame (PerFrameFunctionalGroupsSequence); the file is damaged.")
    grid: dict[tuple[int, int], int] = {}
    for k in range(n):
        try:
            place = per_frame[k].PlanePositionSlideSequence[0]
            r = int(place.RowPositionInTotalImagePixelMatrix) - 1  # 1-based
            c = int(place.ColumnPositionInTotalImagePixelMatrix) - 1
        except (AttributeError, IndexError, TypeError, ValueError):
            raise ValueError(f"{path}: frame {k + 1} of the TILED_SPARSE slide level has no "
                             "position in the total pixel matrix; the file is damaged.") from None
        if r % rows or c % cols:
            raise ValueError(f"{path}: frame {k + 1} lies at row {r + 1}, column {c + 1}, off "
                             f"the {rows}x{cols} tile grid; such slides are not read here.")
        grid.setdefault((r // rows, c // cols), k)
    return grid


def _locate_frames(path: Path, ds: Any, tell: int, n: int, frame_bytes: int,
                   ) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Where each frame's bytes lie in the file, from the pixel data element at ``tell``:
    native frames one after another, encapsulated ones by the extended or basic offset
    table, or one fragment per frame. Only item headers are read."""
    import struct

    from pydicom import encaps
    from pydicom.uid import UID

    syntax = UID(str(ds.file_meta.get("TransferSyntaxUID", "")))
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(tell)
        head = fh.read(8)
        if len(head) < 8 or struct.unpack("<HH", head[:4]) != (0x7FE0, 0x0010):
            raise ValueError("no pixel data after the header (the file is truncated)")
        explicit = not syntax.is_implicit_VR and head[4:6].isalpha()
        if explicit:
            length = struct.unpack("<L", fh.read(4))[0] if head[4:6] in (b"OB", b"OW") \
                else struct.unpack("<H", head[6:8])[0]
        else:
            length = struct.unpack("<L", head[4:8])[0]
        start = fh.tell()
        if not syntax.is_encapsulated:
            if start + n * frame_bytes > size:
                raise ValueError(f"the pixel data of {n} frames needs {n * frame_bytes} bytes "
                                 f"from byte {start}; the file ends at byte {size} (truncated)")
            return tuple(((start + k * frame_bytes, frame_bytes),) for k in range(n))
        if length != 0xFFFFFFFF:
            raise ValueError("encapsulated pixel data of a defined length")
        basic = encaps.parse_basic_offsets(fh)
        first = fh.tell()
        count, offsets = encaps.parse_fragments(fh)
        fragments = []
        for at in offsets:
            fh.seek(at + 4)
            fragments.append((at, at + 8, struct.unpack("<L", fh.read(4))[0]))
    if not fragments or fragments[-1][1] + fragments[-1][2] > size or count < n:
        raise ValueError(f"the encapsulated pixel data holds {count} complete fragments for "
                         f"{n} frames; the file is truncated or damaged")
    extended = ds.get("ExtendedOffsetTable")
    if extended:
        basic = [int(v) for v in np.frombuffer(extended, "<u8")]
    if basic and len(basic) >= n:
        starts = [first + int(b) for b in basic[:n]]
        bounds = [*starts[1:], fragments[-1][1] + fragments[-1][2]]
        return tuple(tuple((v, ln) for at, v, ln in fragments if s <= at < e)
                     for s, e in zip(starts, bounds))
    if count == n:
        return tuple(((v, ln),) for _, v, ln in fragments)
    raise ValueError(f"{count} fragments for {n} frames and no offset table to tell which "
                     "fragments make each frame")
