"""Whole-slide images opened without reading them: Aperio SVS, Hamamatsu NDPI, Philips TIFF,
Leica SCN, Ventana BIF and other pyramidal TIFFs (what tiffslide reads).

A slide is a pyramid: the scanner's full resolution (level 0) and coarser copies of it. A run
reads one level, chosen by number (``level``) or by physical resolution (``mpp``, micrometres
per pixel: the coarsest level at least that fine, resampled to it tile by tile), as a
:class:`~napari_attnreg.core.run.lazy.LazyImage` that a tiled run reads tile by tile. The
slide's pixel size reaches the result as any file's does (:class:`ImageInfo`), and the
coarsest level small enough serves as the thumbnail a tissue mask is computed from.
Needs ``tiffslide`` (the ``slides`` extra), imported only when a slide is opened. A slide
whose tiles are compressed in a way this environment cannot decode (JPEG 2000 without the
codec in ``imagecodecs``) is refused when it is opened, saying what to install.

Example
-------
>>> image = open_slide("biopsy.svs", mpp=1.0)                   # doctest: +SKIP
>>> image.level, image.mpp, image.analysed_shape                 # doctest: +SKIP
(2, 1.0, (11250, 8000))
"""

from __future__ import annotations

import contextlib
import math
import numbers
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.core.files import UnreadableFileError, decoding
from napari_attnreg.core.run.lazy import SAMPLE_PIXELS, LazyImage

#: File endings that are always slides.
SLIDE_SUFFIXES = (".svs", ".ndpi")
#: Endings of files that are slides when their content says so (a scanner's metadata, or
#: several levels without OME metadata): Philips and Ventana write ``.tif(f)`` too, and
#: Bio-Rad's gel images share ``.scn`` with Leica's slides.
SLIDE_CONTENT_SUFFIXES = (".tif", ".tiff", ".scn", ".bif")
#: A requested resolution within this fraction of a level's is read at that level unresampled.
MPP_TOLERANCE = 0.02
#: µm per pixel of the resolution tags programs write when they know no pixel size: a
#: pyramid stating one of these (within :data:`DEFAULT_MPP_TOLERANCE`) says nothing about its
#: pixels, and recorded as µm it would put a section metres wide (scale bars and napari's µm
#: placement a thousand times off, ``--mpp`` choosing levels by it). A size between them is
#: kept: a radiograph or a gross photograph saved as a pyramid really is 100–200 µm per pixel.
PROGRAM_DEFAULT_MPP = {
    25400 / 72: "the classic screen resolution, macOS's and Photoshop's",  # 72 dpi
    25400 / 96: "Windows' screen resolution",  # 96 dpi
    25400 / 300: "image editors' and document scanners' print resolution",  # 300 dpi
    1000.0: "libvips', 1 pixel per mm",
    10000.0: "1 pixel per cm",
    25400.0: "1 pixel per inch",
}
#: Relative difference within which a stated pixel size is a program's default (the tags are
#: fractions: 72 dpi is 352.7777… µm, written to a few digits by some programs).
DEFAULT_MPP_TOLERANCE = 0.002
#: µm per full-resolution pixel above which a stated pixel size is no image's (10 mm: a
#: photograph of a whole specimen is a fraction of that), whatever wrote it.
MAX_SLIDE_MPP = 10000.0
#: Scanners' TIFF compressions by the names users know them by, for messages (tifffile's
#: name of the code otherwise).
CODEC_NAMES = {7: "JPEG", 33003: "JPEG 2000 (Aperio, YCbCr)", 33004: "JPEG 2000",
               33005: "JPEG 2000 (Aperio, RGB)", 34712: "JPEG 2000", 34934: "JPEG XR",
               22610: "JPEG XR (Hamamatsu)", 50002: "JPEG XL", 52546: "JPEG XL",
               50001: "WebP", 34927: "WebP"}


def _tiffslide() -> Any:
    try:
        import tiffslide
    except ImportError as err:
        raise ValueError("Reading slides (SVS, NDPI, pyramidal TIFF) needs tiffslide: pip "
                         "install 'napari-attnreg[slides]'.") from err
    return tiffslide


def is_slide(path: str | Path) -> bool:
    """An SVS/NDPI file, or a TIFF (``.tif``, ``.tiff``, ``.scn``, ``.bif``) that is a slide:
    a scanner's (Aperio, Hamamatsu, Philips, Leica, Ventana) by its metadata, or a pyramid
    of several levels without OME metadata (OME pyramids are read by the OME reader)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.is_file():
        return False
    if suffix in SLIDE_SUFFIXES:
        return True
    if suffix not in SLIDE_CONTENT_SUFFIXES:
        return False
    import tifffile

    try:
        with tifffile.TiffFile(path, _multifile=False) as tif:
            # the formats tiffslide parses, as it detects them (by the first page)
            if tif.is_svs or tif.is_ndpi or tif.is_philips or tif.is_scn or tif.is_bif:
                return True
            return (not tif.is_ome and bool(tif.series)
                    and len(tif.series[0].levels) > 1)
    except Exception:  # noqa: BLE001 - any decoder error: not a slide (the reader reports it)
        return False


def is_pyramid(path: str | Path) -> bool:
    """A TIFF holding several resolutions of one image: a slide, or an OME-TIFF pyramid
    (which napari opens through the OME reader; a run at a chosen level reads it as a
    slide)."""
    path = Path(path)
    if not path.is_file() or path.suffix.lower() not in (".tif", ".tiff", *SLIDE_SUFFIXES):
        return False
    import tifffile

    try:
        with tifffile.TiffFile(path, _multifile=False) as tif:
            return bool(tif.series) and len(tif.series[0].levels) > 1
    except Exception:  # noqa: BLE001 - any decoder error: not a pyramid (the reader reports it)
        return False


def tiled_image_shape(path: str | Path) -> tuple[int, int] | None:
    """``(H, W)`` of a TIFF that holds one tiled 2D image (grey or colour) of one resolution
    and no slide or OME metadata (tifffile's, QuPath's or libvips' export of a slide with
    ``tile=``), else None. Such a file is no slide (:func:`is_slide`): a run reads it as an
    image; a large one (:func:`is_large_tiled_image`) is read as a slide of one level, and
    so is any such file a run reads at a level or resolution (:func:`open_slide` reads any
    tiled TIFF)."""
    path = Path(path)
    if not path.is_file() or path.suffix.lower() not in (".tif", ".tiff"):
        return None
    import tifffile

    try:
        with tifffile.TiffFile(path, _multifile=False) as tif:
            if tif.is_ome or not tif.series or is_slide(path):
                return None
            series = tif.series[0]
            page, axes = series.pages[0] if series.pages else None, series.axes.upper()
            if len(series.levels) != 1 or len(series.pages) != 1 or page is None \
                    or not page.is_tiled or axes not in ("YX", "YXS"):
                return None
            return int(series.shape[0]), int(series.shape[1])
    except Exception:  # noqa: BLE001 - any decoder error: not such an image (the reader says)
        return None


def is_large_tiled_image(path: str | Path) -> bool:
    """A tiled TIFF of one image without slide or OME metadata (:func:`tiled_image_shape`)
    above the untiled pixel budget (``MAX_UNTILED_PIXELS``): a slide of one level to every
    front end. The command line, ``regularize(path)``, a batch and napari's reader and dock
    all read it on demand as a slide (:func:`open_slide`: a tiled run takes a slide's
    automatic tissue mask), where the command line used to read it as a plain image (no
    mask: the same file gave other results there than in napari). A smaller one is an
    image like any other."""
    shape = tiled_image_shape(path)
    if shape is None:
        return False
    from napari_attnreg.core.run import lazy  # read when asked: tests shrink the budget

    return shape[0] * shape[1] > lazy.MAX_UNTILED_PIXELS


@dataclass(frozen=True)
class SlideLevels:
    """The pyramid of a slide: level sizes, downsamples and the level-0 pixel size."""

    dimensions: tuple[tuple[int, int], ...]  # (H, W) of each level
    downsamples: tuple[float, ...]
    mpp: float | None  # µm per level-0 pixel, when the slide says
    vendor: str
    #: A pixel size the file states that is no measured one (a program's default resolution
    #: tags, or above :data:`MAX_SLIDE_MPP`), left out of ``mpp``; messages name it.
    ignored_mpp: float | None = None
    #: What the file held and why it was ignored (:func:`stated_mpp`), for messages.
    ignored_note: str | None = None

    def level_mpp(self, level: int) -> float | None:
        """µm per pixel of ``level``, or None when the slide does not say."""
        return None if self.mpp is None else self.mpp * self.downsamples[level]

    def choose(self, level: int | None, mpp: float | None) -> tuple[int, float]:
        """``(level, scale)``: the level to read and its stored pixels per analysed pixel.

        Raises
        ------
        ValueError
            Both or an impossible one given; ``mpp`` for a slide with no pixel size.
        """
        if level is not None and mpp is not None:
            raise ValueError("Give a slide level or a resolution (mpp), not both.")
        if mpp is None:
            level = 0 if level is None else int(level)
            if not 0 <= level < len(self.dimensions):
                raise ValueError(f"The slide has levels 0–{len(self.dimensions) - 1} "
                                 f"({self.describe()}); level {level} does not exist.")
            return level, 1.0
        if self.mpp is None:
            stated = "" if self.ignored_note is None else f" ({self.ignored_note})"
            raise ValueError(f"The slide does not state its pixel size (mpp){stated}, so a "
                             "resolution cannot be chosen; choose a level instead ('Slide "
                             "level' in napari, level= in Python, --level on the command "
                             "line).")
        if mpp < self.mpp * (1 - MPP_TOLERANCE):
            raise ValueError(f"mpp={mpp:g} µm is finer than the slide's full resolution "
                             f"({self.mpp:g} µm per pixel); use mpp ≥ {self.mpp:g}.")
        # the coarsest level at least as fine as asked: resampling only ever shrinks
        fine = [k for k, d in enumerate(self.downsamples)
                if self.mpp * d <= mpp * (1 + MPP_TOLERANCE)]
        level = fine[-1]
        scale = mpp / (self.mpp * self.downsamples[level])
        return level, 1.0 if abs(scale - 1) <= MPP_TOLERANCE else scale

    def describe(self) -> str:
        """``"0: 2048x2048 (0.25 µm), 1: 1024x1024 (0.5 µm)"``."""
        parts = []
        for k, (h, w) in enumerate(self.dimensions):
            size = self.level_mpp(k)
            parts.append(f"{k}: {w}x{h}" + (f" ({size:.3g} µm)" if size else ""))
        return ", ".join(parts)


def slide_levels(slide: Any) -> SlideLevels:
    """The :class:`SlideLevels` of an open ``tiffslide.TiffSlide``."""
    props = slide.properties
    sizes = [_positive(props.get(f"tiffslide.mpp-{a}")) for a in "xy"]
    known = [s for s in sizes if s is not None]
    mpp = float(sum(known) / len(known)) if known else None
    vendor = str(props.get("tiffslide.vendor") or "generic")
    tif = slide.ts_tifffile
    if tif.is_bif:  # tiffslide parses a Ventana slide as a generic TIFF
        vendor = "ventana"
        mpp = mpp if mpp is not None else _ventana_mpp(tif)
    # 72 dpi and the like: no µm to record (a generic TIFF's size is its resolution tags)
    says = "its TIFF tags say" if vendor == "generic" else f"its {vendor} metadata says"
    kept, note = stated_mpp(mpp, says)
    return SlideLevels(dimensions=tuple((int(h), int(w)) for w, h in slide.level_dimensions),
                       downsamples=tuple(float(d) for d in slide.level_downsamples),
                       mpp=kept, vendor=vendor, ignored_mpp=None if note is None else mpp,
                       ignored_note=note)


def stated_mpp(mpp: float | None, says: str) -> tuple[float | None, str | None]:
    """A pyramid's stated µm per full-resolution pixel, kept or ignored.

    Parameters
    ----------
    mpp : float or None
        As the file states it.
    says : str
        Where it was stated, for the note: ``"its TIFF tags say"``.

    Returns
    -------
    (float or None, str or None)
        ``(mpp, None)`` when kept; ``(None, note)`` when it is one of the programs' defaults
        (:data:`PROGRAM_DEFAULT_MPP`) or above :data:`MAX_SLIDE_MPP`, the note saying what
        the file held and why it is no pixel size.
    """
    if mpp is None:
        return None, None
    held = f"{says} {mpp:.5g} µm per pixel, {25400 / mpp:.4g} dpi"
    for default, why in PROGRAM_DEFAULT_MPP.items():
        if abs(mpp / default - 1) <= DEFAULT_MPP_TOLERANCE:
            return None, f"{held}: a program's default ({why}), not a measured size"
    if mpp > MAX_SLIDE_MPP:
        return None, f"{held}: over {MAX_SLIDE_MPP / 1000:g} mm per pixel, no image's"
    return mpp, None


def _ventana_mpp(tif: Any) -> float | None:
    """µm per level-0 pixel of a Ventana BIF: ``ScanRes`` of the ``iScan`` element in the
    first image's XMP (tag 700), where the scanner states it (OpenSlide reads it there; the
    resolution tags tiffslide reads are often absent)."""
    from xml.etree import ElementTree

    xmp = tif.pages.first.tags.valueof(700)
    if isinstance(xmp, bytes):
        xmp = xmp.decode("utf-8", "replace")
    if not isinstance(xmp, str):
        return None
    try:
        root = ElementTree.fromstring(xmp.strip().rstrip("\x00"))
    except ElementTree.ParseError:
        return None
    iscan = root if root.tag == "iScan" else root.find(".//iScan")
    return None if iscan is None else _positive(iscan.get("ScanRes"))


def _positive(value: Any) -> float | None:
    try:
        size = float(value)
    except (TypeError, ValueError):
        return None
    return size if math.isfinite(size) and size > 0 else None


def open_slide(path: str | Path, *, level: int | None = None,
               mpp: float | None = None, full_mpp: float | None = None) -> LazyImage:
    """A slide level (or resolution) as a :class:`LazyImage` whose pixels stay on disk.

    Parameters
    ----------
    path : str or Path
        An SVS, NDPI or pyramidal TIFF.
    level : int, optional
        Pyramid level to read (0 = full resolution, the default).
    mpp : float, optional
        Micrometres per pixel to analyse at instead: the coarsest level at least this fine,
        resampled to it as tiles are read.
    full_mpp : float, optional
        Micrometres per full-resolution pixel, where the slide's own tags do not say (an
        OME-TIFF pyramid states it in its OME-XML).

    Raises
    ------
    ValueError
        Not a readable slide (the message names it), tiffslide missing, or an impossible
        level or resolution (the message lists the slide's levels).
    """
    check_choice(level, mpp)
    tiffslide = _tiffslide()
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"No such slide file: {path}")
    with decoding(path, "slide"), _tiffslide_notes_silenced(), _cut_short(path) as cut:
        slide = tiffslide.TiffSlide(path)
        _close_when_unread(slide)
        try:
            pyramid = slide_levels(slide)
            group = slide.zarr_group
        except NotImplementedError:  # tiffslide's levels are colour or grey images
            message = _layout_message(path, slide)
            slide.close()
            raise UnreadableFileError(message) from None
        except BaseException:
            slide.close()
            raise
    try:
        return _slide_level(path, slide, pyramid, group, level=level, mpp=mpp,
                            full_mpp=full_mpp, cut=cut)
    except BaseException:  # refused (a level it lacks, a codec missing): nothing reads it
        slide.close()
        raise


def _close_when_unread(slide: Any) -> None:
    """Close ``slide``'s file once nothing reads through it any more.

    The image, its level and overview arrays (a napari layer keeps only the arrays) and the
    zarr stores tiffslide makes for each thread all hold the slide's ``TiffFile``: when the
    last of them is gone its file is closed here, not left open to the garbage collector
    (which warned "unclosed file" for every slide opened).
    """
    import weakref

    tif = slide.ts_tifffile
    weakref.finalize(tif, tif.filehandle.close)  # holds the file handle, not the TiffFile


def _slide_level(path: Path, slide: Any, pyramid: SlideLevels, group: Any, *,
                 level: int | None, mpp: float | None, full_mpp: float | None,
                 cut: list[str]) -> LazyImage:
    """The level or resolution :func:`open_slide` was asked for, of the opened ``slide``."""
    if pyramid.mpp is None and full_mpp is not None:
        pyramid = replace(pyramid, mpp=_positive(full_mpp))
    try:
        chosen, scale = pyramid.choose(level, mpp)
    except ValueError as err:
        if cut:  # the level asked for was in the part of the file that is lost
            raise ValueError(f"{err} {cut[0]}") from None
        raise
    if cut:
        warnings.warn(cut[0], UserWarning, stacklevel=3)  # open_slide's caller
    coarse = overview_index(pyramid, chosen)
    _check_codecs(path, slide, [chosen] if coarse is None else [chosen, coarse])
    with decoding(path, "slide"):
        array = _level_array(slide, group, chosen)
        overview = None if coarse is None else _level_array(slide, group, coarse)
    level_mpp = pyramid.level_mpp(chosen)
    if len(array.shape) not in (2, 3):
        raise ValueError(f"{path}: slide levels of shape {array.shape} are not supported "
                         "(expected height x width [x colours]).")
    image = LazyImage(array, -1 if len(array.shape) == 3 else None, str(path), scale=scale,
                      mpp=None if level_mpp is None else level_mpp * scale, level=chosen,
                      overview_array=overview, downsample=pyramid.downsamples[chosen])
    object.__setattr__(image, "_slide", slide)  # the zarr store reads through its open file
    return image


def _layout_message(path: Path, slide: Any) -> str:
    """Why a pyramid tiffslide parsed but cannot read is refused, and what to do: its
    levels are several planes (channels stored as separate images), not a colour or grey
    image, and without OME metadata nothing says what the planes are."""
    series = slide.ts_tifffile.series[0]
    planes = series.shape[series.axes.index(next(a for a in series.axes if a not in "YX"))]
    return (f"{path} is a pyramid of {planes} planes per level (TIFF axes {series.axes!r}, "
            "e.g. fluorescence channels stored as separate images) without OME metadata, "
            "which is not read as a slide (slides are colour or grey). Save it as an OME-TIFF "
            "pyramid (QuPath, bfconvert, or tifffile with ome=True: its channels are then "
            "read level by level with --level/--mpp), or its full resolution as a plain "
            "multichannel TIFF (run with --channel-axis).")


def check_choice(level: Any, mpp: Any) -> None:
    """Refuse a level that is no whole number and an mpp that is no positive number."""
    if level is not None and (isinstance(level, bool) or not isinstance(level, numbers.Real)
                              or not float(level).is_integer()):
        raise ValueError(f"level must be a whole number (0 = full resolution), got {level!r}.")
    if mpp is not None and (isinstance(mpp, bool) or not isinstance(mpp, numbers.Real)
                            or _positive(mpp) is None):
        raise ValueError(f"mpp must be a positive number of micrometres per pixel, got "
                         f"{mpp!r}.")


def overview_index(pyramid: SlideLevels, chosen: int) -> int | None:
    """The finest level coarser than ``chosen`` that has at most ``SAMPLE_PIXELS`` pixels."""
    for k in range(chosen + 1, len(pyramid.dimensions)):
        h, w = pyramid.dimensions[k]
        if h * w <= SAMPLE_PIXELS:
            return k
    return None


@contextlib.contextmanager
def _cut_short(path: str | Path) -> Iterator[list[str]]:
    """Collect, instead of tifffile's raw log line ("<tifffile.TiffPages @8> invalid page
    offset 511274"), a sentence saying the file is cut short: a copy that stopped early
    keeps its first pages, and its later levels are lost."""
    import logging

    found: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "invalid page offset" in record.getMessage() and not found:
                found.append(f"{Path(path).name} is cut short ({Path(path).stat().st_size} "
                             "bytes; its list of pages points past its end): the pages after "
                             "the break are lost, and with them any level there. Copy the "
                             "file again from the scanner or the archive.")

    logger = logging.getLogger("tifffile")
    handler, propagate = Catch(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # not printed raw as well
    try:
        yield found
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


@contextlib.contextmanager
def _tiffslide_notes_silenced() -> Iterator[None]:
    """Without tiffslide's warning, on every NDPI or BIF opened, that it parses their metadata
    only in part: the levels and the pixel size, all a run takes, it reads (a BIF's pixel
    size is read here), and the warning only alarmed users."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*(hamamatsu|ventana)-format metadata",
                                category=UserWarning)
        yield


def _level_array(slide: Any, group: Any, level: int) -> Any:
    """Level ``level`` as an array read on demand: the zarr array of the level, or, for a
    slide tiffslide composes from several stored images (a Leica SCN), :class:`ComposedLevel`."""
    if slide.properties.get("tiffslide.series-composition"):
        return ComposedLevel(slide, level)
    return group[str(level)]


class ComposedLevel:
    """A level of a slide whose scanned regions are stored as separate images (a Leica SCN),
    placed on the whole slide as tiffslide composes them (OpenSlide's frame: outside the
    regions, zeros), read on demand and indexed as the zarr array of a plain slide's level.

    Only region by region through ``TiffSlide.read_region``, whose location is in level-0
    pixels: a level's pixel ``x`` is asked for at a level-0 ``x'`` that tiffslide maps back to
    ``x`` exactly (its downsamples need not be whole numbers).
    """

    def __init__(self, slide: Any, level: int) -> None:
        w, h = slide.level_dimensions[level]
        index = next(iter(slide.properties["tiffslide.series-composition"]["located_series"]))
        stored = slide.ts_tifffile.series[index].levels[level]
        self._slide, self._level = slide, level
        self._downsample = float(slide.level_downsamples[level])
        self.shape = (int(h), int(w), int(stored.shape[-1]))
        self.dtype = np.dtype(stored.dtype)
        # the stored tiles: ChunkCache reads the level in blocks of this size
        page = stored.keyframe
        self.chunks = (int(page.tilelength or 256), int(page.tilewidth or 256), self.shape[2])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:  # napari's layer data protocol asks for it
        return math.prod(self.shape)

    def _level0(self, x: int) -> int:
        """The level-0 coordinate tiffslide maps to this level's ``x``."""
        base = math.ceil(x * self._downsample)
        while int(base / self._downsample) < x:
            base += 1
        while base > 0 and int((base - 1) / self._downsample) >= x:
            base -= 1
        return base

    def __getitem__(self, key: Any) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis for k in key):
            at = next(i for i, k in enumerate(key) if k is Ellipsis)
            key = (*key[:at], *(slice(None),) * (self.ndim - len(key) + 1), *key[at + 1:])
        key = (*key, *(slice(None),) * (self.ndim - len(key)))
        if len(key) != self.ndim:
            raise IndexError(f"too many indices for an array of shape {self.shape}")
        picks, drop = [], []
        for axis, (k, n) in enumerate(zip(key, self.shape, strict=True)):
            if isinstance(k, numbers.Integral):
                k = range(n)[k]  # IndexError when out of range, as numpy
                picks.append(range(k, k + 1))
                drop.append(axis)
            elif isinstance(k, slice):
                picks.append(range(n)[k])
            else:
                raise IndexError(f"a composed slide level takes whole numbers and slices, "
                                 f"not {k!r}")
        if any(r.step < 0 for r in picks):
            raise IndexError("a composed slide level is read with positive steps only")
        (ys, xs, cs) = picks
        if not (len(ys) and len(xs) and len(cs)):
            out = np.zeros((len(ys), len(xs), len(cs)), self.dtype)
        else:
            y0, x0 = ys.start, xs.start
            height, width = ys[-1] - y0 + 1, xs[-1] - x0 + 1
            block = self._slide.read_region((self._level0(x0), self._level0(y0)), self._level,
                                            (width, height), as_array=True, padding=False)
            out = np.asarray(block)[::ys.step, ::xs.step][..., cs.start:cs.stop:cs.step]
        return out.reshape([n for a, n in enumerate(out.shape) if a not in drop])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self[:, :, :]
        return whole if dtype is None else whole.astype(dtype)


#: Decoders that decoded a stored tile in this process: slides compressed the same way are not
#: tried again (a JPEG 2000 tile takes tens of milliseconds, for each level napari opens).
_WORKING_DECODERS: set[Any] = set()


def _check_codecs(path: Path, slide: Any, levels: Sequence[int]) -> None:
    """Refuse, saying what to install, a slide whose tiles at ``levels`` this environment
    cannot decode: found when it is opened, not as a decoder's error from deep inside the
    first tile a run or napari reads (there it read as a damaged file)."""
    props = slide.properties
    composition = props.get("tiffslide.series-composition")
    series = (list(composition["located_series"]) if composition
              else [props.get("tiffslide.series-index", 0)])
    tif = slide.ts_tifffile
    for index in series:
        for k in levels:
            page = tif.series[index].levels[k].keyframe
            problem = _undecodable(page)
            if problem:
                raise ValueError(_codec_message(path, int(page.compression), problem))


def _undecodable(page: Any) -> str | None:
    """Why ``page``'s tiles cannot be decoded here, or None: tifffile has no decoder for its
    compression, or imagecodecs was built without that codec (its stand-in raises
    ImportError when called, so one stored tile is decoded to find out)."""
    from tifffile import TIFF

    if page.compression == 1:
        return None
    if page.compression not in TIFF.DECOMPRESSORS:
        return "tifffile has no decoder for it"
    decoder = TIFF.DECOMPRESSORS[page.compression]
    if decoder in _WORKING_DECODERS:
        return None
    counts = page.databytecounts
    index = next((i for i, n in enumerate(counts) if n), None)
    if index is None:  # nothing stored: nothing to decode
        return None
    handle = page.parent.filehandle
    try:
        with handle.lock:
            handle.seek(page.dataoffsets[index])
            data = handle.read(counts[index])
        page.decode(data, index, jpegtables=page.jpegtables, jpegheader=page.jpegheader)
    except ImportError as err:
        return str(err) or type(err).__name__
    except Exception:  # noqa: BLE001 - damaged bytes: reading the tiles reports them
        return None
    _WORKING_DECODERS.add(decoder)
    return None


def _codec_message(path: Path, code: int, problem: str) -> str:
    from tifffile import COMPRESSION

    try:
        name = CODEC_NAMES.get(code) or COMPRESSION(code).name
    except ValueError:
        name = "a scheme tifffile does not know"
    return (f"{path}: its tiles are compressed with {name} (TIFF compression {code}), which "
            f"this Python environment cannot decode ({problem}). Install the codec: pip "
            "install --upgrade imagecodecs tifffile (the imagecodecs wheels on PyPI include "
            "JPEG 2000, JPEG XR and JPEG XL); or convert the slide to a pyramidal TIFF with "
            "JPEG tiles, e.g. vips tiffsave SLIDE out.tif --tile --pyramid --compression jpeg.")
