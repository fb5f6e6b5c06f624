"""What the explorer shows and what its runs read: an array, an image file, or a slide.

Two kinds with one interface (the image panel draws them, :class:`~.plane_runs.PlaneRuns`
runs them):

- :class:`MemorySource`: an array, or an image file read into memory (a TIFF, a PNG, a
  DICOM series, ...). Its planes are shown, and hold regions of interest, as they are.
- :class:`DiskSource`: a slide (SVS, NDPI, pyramidal TIFF, OME-TIFF pyramid), a single image
  too large to hold that a tiled run reads on demand, or an image opened by the caller
  (:class:`~napari_attnreg.core.run.lazy.LazyImage`). It is never read whole to be shown:
  the picture is a strided read, of a small slide's level itself, else of a coarser level.

A run of a file opens it again as ``attnreg run`` does (:func:`napari_attnreg.api.open_path`)
with the run's options (tiled, slide level, resolution), so its result records what the
command line's records. That happens in the run's worker thread (:meth:`MemorySource.prepare`,
:meth:`DiskSource.prepare`): reading a slide level for an untiled run takes seconds, and the
kernel must stay free meanwhile.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.api import OPEN_OPTIONS, open_path
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.api import lazy_for_run
from napari_attnreg.core.run.engine import RunConfig
from napari_attnreg.core.run.lazy import MAX_UNTILED_PIXELS, LazyImage
from napari_attnreg.core.run.planes import PlaneIndex, PlaneStack
from napari_attnreg.core.run.service import Job, plane_fingerprint
from napari_attnreg.io.readers import TIFF_SUFFIXES

#: Why a slide level or resolution is refused for an array (the command line's advice).
NOT_A_SLIDE = ("Slide level / Slide resolution (level= / mpp=) choose which pixels of a slide "
               "are read; this image is an array held in memory, with one resolution, so they "
               "do not apply. Empty those boxes under Advanced options, or analyse it coarser "
               "with the downsample option (Downsample ×, tile_scale=, in a tiled run).")


def plane_stack(image: Any, channel_axis: int | None, rgb: bool | None) -> PlaneStack:
    """The image as a :class:`PlaneStack`: leading axes are planes (one slider each).

    As documented for the explorer, a trailing axis of length 3 or 4 is taken as colour
    unless ``rgb=False`` or a ``channel_axis`` says otherwise.
    """
    shape = np.shape(image)
    if rgb is None and channel_axis is None:
        rgb = len(shape) >= 3 and shape[-1] in (3, 4)
    return PlaneStack.from_array(image, channel_axis=channel_axis, rgb=rgb or None, stack=True)


def file_identity(path: str | Path, *more: Any) -> str:
    """Path, size and modification time of a file (and ``more``, e.g. the level read): what
    says that a file changed during a run without reading its pixels."""
    path = Path(path)
    try:
        stat = path.stat()
        stamp: tuple | None = (stat.st_size, stat.st_mtime_ns)
    except OSError:  # gone: unlike any stamp taken before
        stamp = None
    return repr((str(path.resolve()), stamp, *more))


def run_options(job: Job) -> dict[str, Any]:
    """The options of ``job`` that decide how a file is opened (``api.OPEN_OPTIONS``)."""
    return {name: getattr(job.config, name) for name in OPEN_OPTIONS}


def _with_image(job: Job, image: PlaneStack | LazyImage, provenance: dict[str, Any],
                **changes: Any) -> Job:
    """``job`` reading ``image``, recording what its file says (the caller's extra wins)."""
    config = replace(job.config, **changes, extra={**provenance, **job.config.extra})
    planes = [()] if isinstance(image, LazyImage) else job.planes
    return replace(job, stack=image, planes=planes, config=config)


@dataclass(frozen=True)
class MemorySource:
    """An array, or an image file read into memory.

    Attributes
    ----------
    stack : PlaneStack
        The pixels shown (never copied from the caller's array).
    path : Path, optional
        The file they were read from; a run reads it again as the command line does.
    channel_axis : int, optional
        The caller's channel axis, for reading the file again the same way.
    """

    stack: PlaneStack
    path: Path | None = None
    channel_axis: int | None = None
    #: Full-resolution pixels per pixel shown (a slide's picture level; 1 here).
    downsample: float = 1.0
    #: The file's letter for each axis of ``stack.data`` (``"TZYX"``); empty when it names
    #: none (an array, a PNG).
    axes: str = ""
    #: What the file says that decides how it is shown (``ImageInfo.run_extra()``: a
    #: DICOM's stored window), so the picture is the one the run analyses.
    extra: dict[str, Any] = field(default_factory=dict)

    def axis_label(self, axis: int) -> tuple[str, str]:
        """A stack axis's slider label and what it is: the file's letter (``"Z"``, ``"depth"``)
        where it names one, else ``"axis 0"`` (an array's, or pages of unknown meaning)."""
        letter = self.axes[axis] if len(self.axes) == np.ndim(self.stack.data) else ""
        name = AXIS_NAMES.get(letter)
        return (letter, f"{name} ({letter})") if name else (f"axis {axis}", f"axis {axis}")

    @property
    def plane_shape(self) -> tuple[int, int]:
        return self.stack.plane_shape

    @property
    def stack_shape(self) -> tuple[int, ...]:
        return self.stack.stack_shape

    @property
    def run_image(self) -> PlaneStack:
        """What a job reads before :meth:`prepare` (an array's: what it reads)."""
        return self.stack

    @property
    def name(self) -> str:
        """The image in exported tables and messages."""
        data = self.stack.data
        return str(self.path) if self.path else f"array {tuple(data.shape)} {data.dtype}"

    def display_pixels(self, plane: PlaneIndex, max_pixels: int) -> tuple[np.ndarray, int | None]:
        """The plane to draw (the display grid subsamples it) and its channel axis."""
        return self.stack.read(plane)

    def figure_pixels(self, result: AttentionResult,
                      plane: PlaneIndex) -> tuple[np.ndarray, int | None] | None:
        """The pixels ``result`` was computed from (its figure's image)."""
        return self.stack.read(plane)

    def fingerprint(self, plane: PlaneIndex) -> str:
        # an array may be edited in place during a run (the stack never copies it); a file's
        # pixels here are the explorer's own copy, and the run reads the file itself
        if self.path is not None:
            return file_identity(self.path)
        return plane_fingerprint(self.stack.read(plane)[0])

    def check_config(self, config: RunConfig) -> None:
        """Refuse a slide level or resolution for an array, whose pixels are given (a file's
        are refused by its reader, with the same advice, when the run opens it).

        Raises
        ------
        ValueError
            ``level`` or ``mpp`` set for an array: the run would have ignored them and the
            result recorded them, unlike the command line and ``regularize``, which refuse.
        """
        if self.path is None and (config.level is not None or config.mpp is not None):
            raise ValueError(NOT_A_SLIDE)

    def prepare(self, job: Job) -> Job:
        """``job`` as the run reads it: an array as it is; a file opened again with the run's
        options, as ``attnreg run`` opens it (a tiled run of a TIFF reads it on demand)."""
        if self.path is None:  # level and mpp are refused for an array (check_config)
            return job
        image, provenance = open_path(self.path, {**run_options(job),
                                                  "channel_axis": self.channel_axis})
        return _with_image(job, image, provenance)


@dataclass(frozen=True)
class DiskSource:
    """An image whose pixels stay on disk: shown from its overview, read by each run.

    Attributes
    ----------
    image : LazyImage
        The picture's image: level 0 of a file given by its path, or the image the caller
        opened (which is then what every run reads, at the level it was opened at).
    path : Path, optional
        The file a run opens again at the run's level or resolution; None for an opened
        image.
    slide : bool
        A slide: an untiled run with no level asked reads the finest level the pixel budget
        holds, as napari's dock does.
    pyramid : bool
        The file has levels (a slide or an OME-TIFF pyramid): a run records the level read.
    """

    image: LazyImage
    path: Path | None = None
    slide: bool = False
    pyramid: bool = False

    stack = None  # no pixels in memory: regions of interest need an image in memory
    stack_shape = ()  # one 2D image

    def axis_label(self, axis: int) -> tuple[str, str]:
        """No stack axes (one 2D image); as :meth:`MemorySource.axis_label`."""
        return f"axis {axis}", f"axis {axis}"

    @property
    def plane_shape(self) -> tuple[int, int]:
        return self.image.analysed_shape

    @property
    def downsample(self) -> float:
        """Full-resolution (level 0) pixels per pixel of :attr:`plane_shape`."""
        image = self.image
        return float(image.downsample) * float(image.scale) if image.level is not None else 1.0

    @property
    def run_image(self) -> LazyImage:
        return self.image

    def check_config(self, config: RunConfig) -> None:
        """Nothing before the run: :meth:`prepare` checks a level against the slide."""

    @property
    def name(self) -> str:
        return str(self.path or self.image.path or "an opened image")

    def display_pixels(self, plane: PlaneIndex, max_pixels: int) -> tuple[np.ndarray, int | None]:
        """A strided read of about ``max_pixels``: of the level itself where it shows more
        than the coarser level (a small slide), else of the coarser level
        (:meth:`~napari_attnreg.core.run.lazy.LazyImage.picture`)."""
        return _channels_last(self.image.picture(max_pixels))

    def figure_pixels(self, result: AttentionResult,
                      plane: PlaneIndex) -> tuple[np.ndarray, int | None] | None:
        """The pixels at the resolution ``result`` analysed, read again from the file; None
        above the untiled pixel budget (a figure could not hold them)."""
        h, w = result.image_shape
        if h * w > MAX_UNTILED_PIXELS:
            return None
        if self.path is None:
            return _channels_last(self.image.read_whole())
        md = result.metadata
        spatial = md.get("spatial") or {}
        # read again as napari's figure does: by level, or by resolution where resampled
        again = ({"mpp": float(spatial["scale"][0])}
                 if md.get("slide_resample", 1.0) != 1.0 and spatial.get("scale")
                 else {"level": md.get("slide_level")})
        image, _ = open_path(self.path, {"tiled": True, **again})
        if isinstance(image, LazyImage):
            return _channels_last(image.read_whole())
        return image.read(())

    def fingerprint(self, plane: PlaneIndex) -> str:
        # the file's identity: reading a slide to hash its pixels is what must never happen
        where = self.path or self.image.path
        if where:
            return file_identity(where, self.image.level, self.image.scale)
        return repr(("opened image", id(self.image.array), self.image.shape))

    def prepare(self, job: Job) -> Job:
        """``job`` as the run reads it, as napari's dock reads a slide.

        Tiled: the file opened at the Advanced panel's level or resolution (level 0 by
        default), read tile by tile, with the tissue mask the engine chooses for it (auto for
        a slide, none for an OME pyramid). Untiled: that level, or the finest level the pixel
        budget holds, read whole. An image the caller opened keeps its own level: ``level`` /
        ``mpp`` beside it are refused with the words ``regularize`` uses.

        Raises
        ------
        ValueError
            A level or resolution the slide does not have, an untiled run over the pixel
            budget (naming Tiled), or level/mpp beside an opened image.
        """
        config = job.config
        if self.path is None:
            image, config = lazy_for_run(self.image, config)
            return replace(job, stack=image, planes=[()], config=config)
        level = config.level
        if level is None and config.mpp is None and not config.tiled and self.slide:
            level = untiled_level(self.path)
        # a level is opened lazily even for an untiled run, so the run records which
        # (slide_level, slide_downsample) as a tiled one does; then read whole below
        lazily = bool(config.tiled) or self.pyramid
        image, provenance = open_path(self.path, {**run_options(job), "tiled": lazily,
                                                  "level": level})
        job = _with_image(job, image, provenance, level=level)
        if config.tiled or not isinstance(image, LazyImage):
            return job
        pixels, config = lazy_for_run(image, job.config)  # the pixel budget, then read whole
        return replace(job, stack=pixels, planes=[()], config=config)


def _channels_last(pixels: np.ndarray) -> tuple[np.ndarray, int | None]:
    """A lazily read image (``(H, W)`` or ``(H, W, C)``) with its channel axis."""
    return pixels, (None if pixels.ndim == 2 or pixels.shape[-1] in (3, 4) else -1)


def untiled_level(path: str | Path) -> int:
    """The finest level of a slide an untiled run holds in memory (napari's dock reads the
    same level, its ``run_level``); the coarsest when none fits, which the run then refuses,
    naming Tiled."""
    from napari_attnreg.io.slides import open_slide

    level = 0
    while True:
        h, w = open_slide(path, level=level).analysed_shape
        if h * w <= MAX_UNTILED_PIXELS:
            return level
        try:
            open_slide(path, level=level + 1)
        except ValueError:  # no coarser level
            return level
        level += 1


def open_source(image: Any, *, channel_axis: int | None,
                rgb: bool | None) -> MemorySource | DiskSource:
    """What the explorer was given, as a source.

    Parameters
    ----------
    image : array-like, str, Path or LazyImage
        An array; the path of any file ``attnreg run`` reads; or an opened image
        (:func:`~napari_attnreg.io.slides.open_slide`, :func:`~napari_attnreg.core.run.
        lazy.open_lazy`).
    channel_axis, rgb
        The layout of an array (``channel_axis`` also overrides a file's own).

    Raises
    ------
    ValueError
        A missing or unreadable file, a layout option that does not apply, or the core's
        words for an unusable array.
    """
    if isinstance(image, LazyImage):
        if channel_axis is not None or rgb is not None:
            raise ValueError("channel_axis= and rgb= do not apply to an opened image: it keeps "
                             "the layout it was opened with.")
        return DiskSource(image)
    if isinstance(image, (str, os.PathLike)):
        if rgb is not None:
            raise ValueError("rgb= is for arrays: a file's own layout says which axis holds "
                             "colour (give channel_axis= to override it).")
        return open_file(Path(image), channel_axis)
    return MemorySource(plane_stack(image, channel_axis, rgb))


def open_file(path: Path, channel_axis: int | None = None) -> MemorySource | DiskSource:
    """A file as the explorer holds it: a slide (a large tiled TIFF without a scanner's
    metadata is a slide of one level, as in every front end), an OME pyramid, or a single
    image above the pixel budget that can be read on demand stays on disk; anything else is
    read into memory by the command line's reader, with the layout the file states."""
    from napari_attnreg.io.readers import header_plane_shape, read_lazy, read_source
    from napari_attnreg.io.slides import is_large_tiled_image, is_pyramid, is_slide, open_slide

    if not path.exists():
        raise ValueError(f"No such image file: {path}; give an existing file, an array or an "
                         "opened slide (open_slide).")
    slide = is_slide(path)
    if slide or is_pyramid(path):
        if channel_axis is not None:
            raise ValueError(f"{path} is a slide pyramid, read with its own colours; "
                             "channel_axis= does not apply to it.")
        return DiskSource(open_slide(path), path, slide=slide, pyramid=True)
    if channel_axis is None and is_large_tiled_image(path):
        # a slide of one level to every front end (its runs take a slide's tissue mask and
        # record level 0): shown as one too, with the pixel size its resolution tags give
        return DiskSource(open_slide(path), path, slide=True, pyramid=True)
    shape = header_plane_shape(path)
    if channel_axis is None and shape is not None and shape[0] * shape[1] > MAX_UNTILED_PIXELS:
        lazy = read_lazy(path)  # too large to hold: shown from a strided read, run tiled
        if lazy is not None:
            return DiskSource(lazy, path)
    stack, info = read_source(path, channel_axis)
    axes = file_axes(path)
    if not axes and info.plane_names and np.ndim(stack.data) == len(info.plane_names) + 2:
        axes = "".join(info.plane_names).upper() + "YX"  # a DICOM volume's slices: "z"
    return MemorySource(stack, path, channel_axis, axes=axes, extra=info.run_extra())


#: What a TIFF's axis letters mean (tifffile's names: ImageJ hyperstacks, OME-TIFF, LSM); the
#: letters of pages of unknown meaning (``Q``, ``I``) are left out, so those read "axis 0",
#: and so is ``S`` before the plane (tifffile's guess at planar samples of a plain TIFF,
#: which the reader's layout rules do not take as colours either).
AXIS_NAMES = {"T": "time", "Z": "depth", "C": "channel", "E": "wavelength",
              "A": "angle", "P": "phase", "R": "tile", "H": "lifetime", "L": "exposure",
              "V": "event", "M": "mosaic"}


def file_axes(path: Path) -> str:
    """The axis letters of a TIFF's first series, as its pixels are read (``"TZCYX"``);
    ``""`` for another file, or one whose header cannot be read here (reading it said why)."""
    if path.suffix.lower() not in TIFF_SUFFIXES:
        return ""
    import tifffile

    try:
        with tifffile.TiffFile(path) as tif:
            return str(tif.series[0].axes).upper() if tif.series else ""
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return ""
