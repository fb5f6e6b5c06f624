"""Whole-slide images (Aperio SVS, Hamamatsu NDPI, pyramidal TIFF) opened without reading them.

A slide is a pyramid: the scanner's full resolution (level 0) and coarser copies of it. A run
reads one level, chosen by number (``level``) or by physical resolution (``mpp``, micrometres
per pixel: the coarsest level at least that fine, resampled to it tile by tile), as a
:class:`~napari_attnreg.core.run.lazy.LazyImage` that a tiled run reads tile by tile. The
slide's pixel size reaches the result as any file's does (:class:`ImageInfo`), and the
coarsest level small enough serves as the thumbnail a tissue mask is computed from.
Needs ``tiffslide`` (the ``slides`` extra), imported only when a slide is opened.

Example
-------
>>> image = open_slide("biopsy.svs", mpp=1.0)                   # doctest: +SKIP
>>> image.level, image.mpp, image.analysed_shape                 # doctest: +SKIP
(2, 1.0, (11250, 8000))
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from napari_attnreg.core.files import decoding
from napari_attnreg.core.run.lazy import SAMPLE_PIXELS, LazyImage

#: File endings that are always slides; a ``.tif``/``.tiff`` is one when it is pyramidal.
SLIDE_SUFFIXES = (".svs", ".ndpi")
#: A requested resolution within this fraction of a level's is read at that level unresampled.
MPP_TOLERANCE = 0.02


def _tiffslide() -> Any:
    try:
        import tiffslide
    except ImportError as err:
        raise ValueError("Reading slides (SVS, NDPI, pyramidal TIFF) needs tiffslide: pip "
                         "install 'napari-attnreg[slides]'.") from err
    return tiffslide


def is_slide(path: str | Path) -> bool:
    """An SVS/NDPI file, or a TIFF that is a slide pyramid (SVS, NDPI, or several levels
    without OME metadata: OME pyramids are read by the OME reader)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.is_file():
        return False
    if suffix in SLIDE_SUFFIXES:
        return True
    if suffix not in (".tif", ".tiff"):
        return False
    import tifffile

    try:
        with tifffile.TiffFile(path, _multifile=False) as tif:
            if tif.is_svs or tif.is_ndpi:
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


@dataclass(frozen=True)
class SlideLevels:
    """The pyramid of a slide: level sizes, downsamples and the level-0 pixel size."""

    dimensions: tuple[tuple[int, int], ...]  # (H, W) of each level
    downsamples: tuple[float, ...]
    mpp: float | None  # µm per level-0 pixel, when the slide says
    vendor: str

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
            raise ValueError("The slide does not state its pixel size (mpp), so a resolution "
                             "cannot be chosen; choose a level instead ('Slide level' in "
                             "napari, level= in Python, --level on the command line).")
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
    return SlideLevels(dimensions=tuple((int(h), int(w)) for w, h in slide.level_dimensions),
                       downsamples=tuple(float(d) for d in slide.level_downsamples),
                       mpp=float(sum(known) / len(known)) if known else None,
                       vendor=str(props.get("tiffslide.vendor") or "generic"))


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
    _check_choice(level, mpp)
    tiffslide = _tiffslide()
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"No such slide file: {path}")
    with decoding(path, "slide"):
        slide = tiffslide.TiffSlide(path)
        pyramid = slide_levels(slide)
        group = slide.zarr_group
    if pyramid.mpp is None and full_mpp is not None:
        pyramid = replace(pyramid, mpp=_positive(full_mpp))
    chosen, scale = pyramid.choose(level, mpp)
    with decoding(path, "slide"):
        array = group[str(chosen)]
        overview = _overview_level(group, pyramid, chosen)
    level_mpp = pyramid.level_mpp(chosen)
    if len(array.shape) not in (2, 3):
        raise ValueError(f"{path}: slide levels of shape {array.shape} are not supported "
                         "(expected height x width [x colours]).")
    image = LazyImage(array, -1 if len(array.shape) == 3 else None, str(path), scale=scale,
                      mpp=None if level_mpp is None else level_mpp * scale, level=chosen,
                      overview_array=overview, downsample=pyramid.downsamples[chosen])
    object.__setattr__(image, "_slide", slide)  # the zarr store reads through its open file
    return image


def _check_choice(level: Any, mpp: Any) -> None:
    """Refuse a level that is no whole number and an mpp that is no positive number."""
    if level is not None and (isinstance(level, bool) or not isinstance(level, numbers.Real)
                              or not float(level).is_integer()):
        raise ValueError(f"level must be a whole number (0 = full resolution), got {level!r}.")
    if mpp is not None and (isinstance(mpp, bool) or not isinstance(mpp, numbers.Real)
                            or _positive(mpp) is None):
        raise ValueError(f"mpp must be a positive number of micrometres per pixel, got "
                         f"{mpp!r}.")


def _overview_level(group: Any, pyramid: SlideLevels, chosen: int) -> Any:
    """The finest level coarser than ``chosen`` that has at most ``SAMPLE_PIXELS`` pixels."""
    for k in range(chosen + 1, len(pyramid.dimensions)):
        h, w = pyramid.dimensions[k]
        if h * w <= SAMPLE_PIXELS:
            return group[str(k)]
    return None
