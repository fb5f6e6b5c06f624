"""Image files as the run reads them: a :class:`PlaneStack` in memory, or a lazy image on disk.

One layout rule for every file: where a file states its axes (a TIFF's ImageJ/OME/tifffile
axes, an animated GIF's frames, a DICOM's frames and samples) they decide which axes are
planes and which are channels; otherwise the shape does, by the
:class:`~napari_attnreg.core.run.planes.PlaneStack` rules that :func:`regularize` follows
too. DICOM files are read by :func:`~napari_attnreg.io.dicom.read_dicom`, as napari reads
them (rescaled values, slices and frames in position order); a folder of DICOM slices is
one series, read once. Whatever a decoder raises on damaged bytes becomes one ValueError
that names the file.

:func:`read_source` also returns what the file says beyond its pixel values
(:class:`ImageInfo`): the physical pixel size (DICOM ``PixelSpacing``, OME
``PhysicalSizeX/Y``) and the kind of image (DICOM ``Modality``; an OME file is microscopy),
which a run records and its figure and off-domain check read.

Example
-------
>>> stack = read_stack("embryo.tif")                               # doctest: +SKIP
>>> stack.n_planes, stack.plane_shape                               # doctest: +SKIP
(12, (512, 512))
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from napari_attnreg.core.files import UnreadableFileError, decoding
from napari_attnreg.core.stats.diagnostics import kind_of_modality
from napari_attnreg.io.dicom import DICOM_SUFFIXES, is_dicom_file

if TYPE_CHECKING:
        from napari_attnreg.core.run.lazy import LazyImage
from napari_attnreg.core.run.planes import PlaneStack

TIFF_SUFFIXES = (".tif", ".tiff")
#: File name endings a folder scan takes as images (an OME-Zarr is a ``*.zarr`` folder).
IMAGE_SUFFIXES = (*TIFF_SUFFIXES, ".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp",
                  *DICOM_SUFFIXES, ".svs", ".ndpi", ".scn", ".bif", ".npy")


#: OME length units as figures and records write them.
_UNITS = {"nm": "nm", "µm": "µm", "um": "µm", "micrometer": "µm", "micron": "µm", "mm": "mm",
          "millimeter": "mm", "cm": "cm", "m": "m", "nanometer": "nm"}


@dataclass(frozen=True)
class ImageInfo:
    """What an image file says beyond its pixel values.

    Attributes
    ----------
    pixel_size : (float, float) or None
        Size of one pixel of a plane, (rows, columns), in ``unit``; None when unknown.
    unit : str or None
        ``"mm"`` (DICOM), ``"µm"`` (OME's default), ...
    kind : str or None
        The kind of image (``radiology``, ``pathology``, ``microscopy``: see
        :data:`~napari_attnreg.core.stats.diagnostics.IMAGE_KINDS`), None when the file
        does not say.
    kind_source : str
        Where ``kind`` came from (``"DICOM Modality CT"``, ``"OME metadata"``).
    origin : float
        Where the centre of pixel 0 lies, in ``unit``: 0, except for a slide read at a
        coarser level, whose pixel 0 is centred among the full-resolution pixels it spans
        (:attr:`~napari_attnreg.core.run.lazy.LazyImage.pixel_origin`).
    """

    pixel_size: tuple[float, float] | None = None
    unit: str | None = None
    kind: str | None = None
    kind_source: str = ""
    origin: float = 0.0
    #: A slide's level read (``slide_level``, ``slide_resample``, ``slide_downsample``), which
    #: a run of its pixels read whole records as a tiled run of it does.
    slide: Mapping[str, Any] | None = None
    #: What reading the file said that its result lists among its diagnostics (transparency
    #: made background, an EXIF orientation not applied: ``ImageNoteWarning``).
    notes: tuple[str, ...] = ()
    #: The display window the file states, ``(low, high)`` in the values read (a DICOM's
    #: WindowCenter/WindowWidth, in rescaled units, turned round with a MONOCHROME1 image's
    #: values); the run's ``intensity_window="auto"`` analyses the image through it.
    window: tuple[float, float] | None = None
    #: The file's format states display windows (DICOM), whether or not this one does.
    states_window: bool = False
    #: Every window the file states, ``(low, high, explanation)`` in its order (``window``
    #: is the first); ``intensity_window="stored 2"`` chooses the second.
    windows: tuple[tuple[float, float, str], ...] = ()
    #: Names of the stack's plane axes where the file states them (``("z",)`` for a DICOM
    #: volume's slices), so messages say "z = 12", not "plane 12". A layer's own
    #: ``axis_labels`` name them in napari, so it takes no part in comparing two infos.
    plane_names: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_layer_metadata(cls, metadata: Mapping[str, Any]) -> ImageInfo:
        """The same facts from the metadata our napari reader gives a layer (``"dicom"``,
        ``"slide"`` or ``"ome"``), so a front end running on a layer records what the command
        line does.

        Example
        -------
        >>> extra = ImageInfo.from_layer_metadata(layer.metadata).run_extra()  # doctest: +SKIP
        >>> RunConfig(..., extra={**extra, ...})                                # doctest: +SKIP
        """
        dicom, ome = metadata.get("dicom"), metadata.get("ome")
        if isinstance(dicom, Mapping):
            spacing = dicom.get("pixel_spacing")
            size = (float(spacing[0]), float(spacing[1])) if spacing and len(spacing) == 2 \
                else None
            modality = str(dicom.get("modality") or "")
            kind = kind_of_modality(modality)
            return cls(size, "mm" if size else None, kind,
                       f"DICOM Modality {modality}" if kind else "",
                       window=_window_of(dicom.get("window")), states_window=_grey(dicom),
                       windows=_windows_of(dicom.get("windows")))
        slide = metadata.get("slide")
        if isinstance(slide, Mapping) and slide.get("kind") != "ome":  # OME: microscopy
            mpp = slide.get("mpp")
            return cls((float(mpp), float(mpp)) if mpp else None, "µm" if mpp else None,
                       "pathology", "slide file")
        if isinstance(ome, Mapping):
            physical = ome.get("physical_size") or {}
            sizes = [physical.get(a) for a in "YX"]
            units = {_UNITS.get(str(s[1])) for s in sizes if s}
            known = all(sizes) and len(units) == 1 and None not in units
            return cls((float(sizes[0][0]), float(sizes[1][0])) if known else None,
                       units.pop() if known else None, "microscopy", "OME metadata")
        return cls()

    def run_extra(self) -> dict[str, Any]:
        """What a run records of this (``RunConfig.extra``): ``spatial`` (the pixel size and
        its unit, read back by :attr:`AttentionResult.spatial` for the figure's scale bar and
        for reopening the result in napari in the same units), ``image_kind`` and
        ``image_kind_source`` for the off-domain check. Unknown values are left out."""
        extra: dict[str, Any] = {}
        if self.pixel_size is not None and self.unit:
            extra["spatial"] = {  # AttentionResult.spatial reads it back
                "scale": [float(v) for v in self.pixel_size],
                "translate": [float(self.origin)] * 2,
                "units": [self.unit, self.unit]}
        if self.kind:
            extra.update(image_kind=self.kind, image_kind_source=self.kind_source)
        if self.states_window:  # None: a DICOM without a window (the run says so)
            extra["stored_window"] = None if self.window is None else list(self.window)
            extra["stored_windows"] = [list(w) for w in self.windows]
        extra.update(self.slide or {})
        if self.notes:  # the run adds them to its diagnostics
            extra["reading_notes"] = list(self.notes)
        return extra


def _window_of(value: Any) -> tuple[float, float] | None:
    """A stored window ``(low, high)`` from layer metadata, None unless two finite numbers
    with low < high (metadata a user or another plugin edited is not trusted)."""
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        return None
    return (low, high) if math.isfinite(low) and math.isfinite(high) and low < high else None


def _windows_of(value: Any) -> tuple[tuple[float, float, str], ...]:
    """The stored windows ``(low, high, explanation)`` from layer metadata; entries that
    are not (edited metadata) are left out."""
    found = []
    for entry in value if isinstance(value, (list, tuple)) else ():
        window = _window_of(entry[:2]) if isinstance(entry, (list, tuple)) else None
        if window is not None:
            found.append((*window, str(entry[2]) if len(entry) > 2 else ""))
    return tuple(found)


def _grey(dicom: Mapping[str, Any]) -> bool:
    """A grey DICOM image (MONOCHROME1/2), the kind a display window applies to; a colour
    one (RGB, a palette) is shown as stored."""
    return str(dicom.get("photometric_interpretation", "")).upper().startswith("MONOCHROME")


#: The first bytes of a TIFF and a BigTIFF, little and big endian.
_TIFF_MAGIC = (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+")


def is_tiff(path: str | Path) -> bool:
    """A TIFF file: named ``.tif``/``.tiff``, or without an image ending and starting with
    TIFF's marker (``IMG_0001``, ``stack.ome`` from a script). Read by imageio, such a file
    gave its first page alone: an OME-TIFF's or ImageJ hyperstack's other planes, channels
    and pixel size were lost without a word."""
    path = Path(path)
    if not path.is_file():
        return False
    if path.suffix.lower() in TIFF_SUFFIXES:
        return True
    if path.name.lower().endswith(IMAGE_SUFFIXES):
        return False
    try:
        with open(path, "rb") as fh:
            return fh.read(4) in _TIFF_MAGIC
    except OSError:
        return False


def is_zarr(path: str | Path) -> bool:
    """An OME-Zarr image: a folder named ``*.zarr``."""
    path = Path(path)
    return path.suffix.lower() == ".zarr" and path.is_dir()


def read_stack(path: str | Path, channel_axis: int | None = None) -> PlaneStack:
    """An image file as a :class:`~napari_attnreg.core.run.planes.PlaneStack`.

    Parameters
    ----------
    path : str or Path
        A TIFF, an OME-Zarr folder, a DICOM file, or any format imageio reads.
    channel_axis : int, optional
        Overrides the layout the file states (``--channel-axis``).

    Raises
    ------
    ValueError
        The file is missing or not a readable image (the message names it), or its layout is
        ambiguous (the message says how to choose).
    """
    return read_source(path, channel_axis)[0]


def read_source(path: str | Path, channel_axis: int | None = None,
                files: Sequence[str | Path] | None = None) -> tuple[PlaneStack, ImageInfo]:
    """An image file, or a folder of DICOM slices, with what the file says about it.

    Parameters
    ----------
    path : str or Path
        As for :func:`read_stack`, or a folder holding one DICOM series (its slices are the
        planes, in position order).
    channel_axis : int, optional
        Overrides the layout the file states.
    files : sequence of path, optional
        The DICOM files of the series in the folder ``path`` (read once, not searched for
        again).

    Returns
    -------
    (PlaneStack, ImageInfo)

    Raises
    ------
    ValueError
        As :func:`read_stack`; a DICOM folder holding several series names them.
    """
    from napari_attnreg.core.run.notes import ImageNoteWarning
    from napari_attnreg.core.run.planes import PlaneStack

    path = Path(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ImageNoteWarning)
        data, hints, info = _read_with_layout(path, files)
    for seen in caught:  # shown as ever; what the result should say is kept with the file
        warnings.warn_explicit(seen.message, seen.category, seen.filename, seen.lineno)
    notes = tuple(str(w.message) for w in caught if issubclass(w.category, ImageNoteWarning))
    if notes:
        info = replace(info, notes=info.notes + notes)
    if channel_axis is not None:
        hints = {"channel_axis": channel_axis}
    try:
        return PlaneStack.from_array(data, **hints), info
    except ValueError as err:  # an empty or odd layout: say which file has it
        raise ValueError(f"{path}: {err}") from None


def image_info(path: str | Path) -> ImageInfo:
    """What a TIFF's OME-XML or an OME-Zarr's attributes say, without reading pixels (for
    images a tiled run reads on demand); an empty :class:`ImageInfo` for anything else."""
    path = Path(path)
    try:
        if is_zarr(path):
            return _zarr_info(path)
        if is_tiff(path):
            import tifffile

            with decoding(path), tifffile.TiffFile(path, _multifile=False) as tif:
                note = _other_images_note(tif, path)
                info = _tiff_info(tif)
            return replace(info, notes=info.notes + (note,)) if note else info
    except ValueError:  # unreadable here: reading its pixels reports it
        pass
    return ImageInfo()


def read_image(path: str | Path) -> np.ndarray:
    """The pixels of an image file, as the file stores them (see :func:`read_stack`).

    Raises
    ------
    ValueError
        The file is missing or not a readable image; the message names it.
    """
    return np.asarray(_read_with_layout(Path(path))[0])


def read_lazy(path: str | Path) -> LazyImage | None:
    """The image opened for reading on demand, or None when it cannot be read that way.

    A TIFF or an OME-Zarr holding one 2D image (grey, RGB or up to 3 channels) stays on
    disk and is read tile by tile by a tiled run; anything else (a stack, another format, a
    damaged file, zarr not installed) gives None, to be read by :func:`read_stack`, which
    then reports a damaged file.
    """
    path = Path(path)
    if not (is_zarr(path) or is_tiff(path)):
        return None
    if is_tiff(path) and tiff_in_colour_planes(path):  # tile by tile it would read indices
        return None
    from napari_attnreg.core.run.lazy import open_lazy

    try:
        with decoding(path):
            return open_lazy(path)
    except ValueError:
        return None


def open_for_run(path: str | Path, opts: Mapping[str, Any],
                 files: Sequence[str | Path] | None = None,
                 ) -> tuple[PlaneStack | LazyImage, ImageInfo]:
    """An input as a run reads it, with what the file says about its pixels.

    A slide (SVS, NDPI, pyramidal TIFF, DICOM WSI: a file or a folder of a slide's
    instances; a tiled TIFF of one image above the untiled pixel budget,
    :func:`~napari_attnreg.io.slides.is_large_tiled_image`) is opened at the level or
    resolution of ``opts`` (``level``, ``mpp``), and so is an OME-TIFF pyramid given one
    (``channel``: one of its channels, as a napari channel layer runs); a tiled run reads
    it, and any TIFF/OME-Zarr holding one image, on demand; other inputs are read into
    memory (a DICOM series: its ``files``, once). An untiled run of an image above the
    pixel budget is refused from the size the file's header states, before its pixels are
    read.

    Raises
    ------
    ValueError
        Unreadable, too large for an untiled run (the message names ``--tiled``), or an
        impossible slide level.
    """
    from napari_attnreg.core.run.lazy import MAX_UNTILED_PIXELS, check_untiled_size
    from napari_attnreg.io.dicom_wsi import is_dicom_wsi, open_dicom_slide
    from napari_attnreg.io.ometiff import is_ome_image
    from napari_attnreg.io.slides import (
        is_large_tiled_image,
        is_pyramid,
        is_slide,
        open_slide,
        tiled_image_shape,
    )

    path, tiled = Path(path), bool(opts.get("tiled"))
    asked = opts.get("level") is not None or opts.get("mpp") is not None
    slide_file = is_slide(path)
    dicom_slide = not slide_file and is_dicom_wsi(path, files)
    # a tiled TIFF of one image (no slide metadata) above the untiled budget, or at a level
    # or resolution: a slide of one level, as napari shows and its dock runs it (an OME-TIFF
    # of one 2D image at a level: an OME pyramid's)
    one_level = not slide_file and (is_large_tiled_image(path) if not asked
                                    else tiled_image_shape(path) is not None)
    if slide_file or dicom_slide or one_level or (
            asked and (is_pyramid(path) or is_ome_image(path))):
        if slide_file or one_level:
            slide = open_slide(path, level=opts.get("level"), mpp=opts.get("mpp"))
            info = slide_info(slide)
        elif dicom_slide:  # a DICOM WSI: a slide, never a stack of its tiles
            slide = open_dicom_slide(path, level=opts.get("level"), mpp=opts.get("mpp"),
                                     files=files)
            info = slide_info(slide)
        else:  # an OME pyramid (is_slide leaves those out) at a chosen level: read by its
            # OME axes (colour, grey, channels: ``channel`` picks one), its pixel size from
            # its OME-XML; a microscope's image
            from napari_attnreg.io.ometiff import open_ome_level

            slide = open_ome_level(path, level=opts.get("level"), mpp=opts.get("mpp"),
                                   channel=opts.get("channel"))
            info = replace(image_info(path), unit="µm" if slide.mpp else None,
                           pixel_size=None if slide.mpp is None else (slide.mpp, slide.mpp),
                           origin=slide.pixel_origin)
        if tiled:
            _check_tiled_slide(slide, opts, one_level=one_level)
            return slide, info
        check_untiled_size(slide.analysed_shape, str(path))
        # read whole, the pixels no longer say which level they are: the record does
        read = {k: v for k, v in slide.run_extra().items() if k.startswith("slide_")}
        return PlaneStack.from_array(slide.read_whole()), replace(info, slide=read)
    if asked:  # read at full resolution, it would be recorded as read at the level asked
        _check_header(path)  # a damaged file is called damaged, not an image of one resolution
        raise ValueError(
            f"{path.name} is neither a slide nor a pyramid: it has one resolution, so a slide "
            "level or resolution does not apply ('Slide level' / 'Slide resolution' in "
            "napari, level= / mpp= in Python, --level / --mpp on the command line). Leave "
            "them unset, or analyse it coarser with the downsample option (tile_scale, "
            "--tile-scale).")
    lazy_ok = tiled and opts.get("tile_scale", 1.0) == 1 and all(
        opts.get(k) is None for k in ("channels", "merge", "channel_axis"))
    lazy = read_lazy(path) if lazy_ok and not files else None
    if lazy is not None and lazy.has_alpha and lazy.shape[0] * lazy.shape[1] <= MAX_UNTILED_PIXELS:
        lazy = None  # in memory its transparent pixels become background, with a note
    if lazy is not None:
        return lazy, image_info(path)
    shape = None if tiled else header_plane_shape(path)
    if shape is not None:
        check_untiled_size(shape, str(path))
    return read_source(path, opts.get("channel_axis"), files or None)


def _check_tiled_slide(slide: LazyImage, opts: Mapping[str, Any], *,
                       one_level: bool = False) -> None:
    """Refuse, saying what to give instead, the options a slide read tile by tile cannot
    take (the tiled engine's refusal named reading it into memory, which no option does):
    a coarser analysis is a level or a resolution; channels or merging an untiled run.
    ``one_level``: a tiled TIFF of one image, which has no coarser level to name."""
    scale = opts.get("tile_scale", 1.0)
    if scale is not None and scale != 1:
        try:
            coarser = float(scale)
        except (TypeError, ValueError):
            coarser = None
        if one_level and not (slide.mpp and coarser and coarser > 0):
            raise ValueError(
                f"{Path(slide.path).name} is one large tiled image without a pixel size, read "
                f"tile by tile as a slide of one level: it has no coarser level to read, and "
                f"it is too large for the downsample option (tile_scale={scale}), which reads "
                "an image whole into memory first. Leave the downsample at 1, or save it as a "
                "pyramid (e.g. vips tiffsave IN out.tif --tile --pyramid) and choose a level "
                "(--level N).")
        instead = (f"--mpp {slide.mpp * coarser:.3g} (mpp={slide.mpp * coarser:.3g} in "
                   "Python; 'Slide resolution' in napari)" if slide.mpp and coarser
                   and coarser > 0 else "--level N (level= in Python; 'Slide level' in napari)")
        raise ValueError(f"A slide (or pyramid) is analysed coarser by reading a coarser "
                         f"level or resolution, not with the downsample option (tile_scale="
                         f"{scale}); give {instead} in place of it (and of a level), and "
                         "leave the downsample at 1.")
    chosen = [k for k in ("channels", "merge", "channel_axis") if opts.get(k) is not None]
    if chosen:
        raise ValueError(f"A slide (or pyramid) level read tile by tile (tiled) is analysed "
                         f"with its own colours; the option(s) {', '.join(chosen)} apply "
                         "only to an untiled run of a level that fits in memory (leave out "
                         "--tiled and give --level or --mpp).")


def slide_info(image: LazyImage) -> ImageInfo:
    """What an opened slide says: µm per analysed pixel, and that it is a pathology image."""
    size = None if image.mpp is None else (float(image.mpp), float(image.mpp))
    return ImageInfo(size, "µm" if size else None, "pathology", "slide file",
                     image.pixel_origin)


def _check_header(path: Path) -> None:
    """Raise what reading ``path``'s header raises (UnreadableFileError for damaged bytes, a
    file whose content is not its ending's format); nothing for a readable image file."""
    if not path.is_file() or path.suffix.lower() in DICOM_SUFFIXES or is_zarr(path):
        return
    if is_tiff(path):
        import tifffile

        with decoding(path), tifffile.TiffFile(path, _multifile=False):
            return
    _refuse_numpy_archive(path)
    import imageio.v3 as iio

    with decoding(path):
        iio.improps(path)


def _read_npy(path: Path) -> np.ndarray:
    """A NumPy ``.npy`` array (a volume exported from a NIfTI or a script), memory-mapped
    (a plane is read when it is run); its layout follows the shape rules, as for an array
    given to :func:`regularize_stack`. imageio has no reader for it: the file was refused
    as "not a readable image". No pickled objects are loaded (a file cannot run code)."""
    with decoding(path, "NumPy array file"):
        data = np.load(path, mmap_mode="r", allow_pickle=False)
    if data.dtype.kind not in "biuf":
        raise ValueError(f"{path} holds a NumPy array of {data.dtype}, not pixel values; save "
                         "the image as a numeric array (e.g. np.save(path, volume.astype("
                         "np.float32))).")
    return data


def _refuse_numpy_archive(path: Path) -> None:
    """Refuse an ``.npz``: imageio reads its first array as a picture, so a saved result
    (``*.attnreg.npz``) was analysed as a 16×16 "image" of its own attention map."""
    if path.suffix.lower() != ".npz":
        return
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            result = "metadata_json.npy" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        result = False
    if result:
        raise ValueError(
            f"{path} is a napari-attnreg result file, not an image. Reopen it with "
            "AttentionResult.load(path) (the notebook: explorer.open_result(path) over the "
            "image it was made from; napari: drop it on the viewer with that image open), and "
            "give the image itself to a run.")
    raise ValueError(f"{path} is a NumPy archive (.npz), not an image: load the array you "
                     "mean with numpy.load(path)[name] and give that array instead.")


def header_plane_shape(path: str | Path) -> tuple[int, int] | None:
    """``(H, W)`` of an image file's planes as its header states them, without decoding the
    pixels (TIFF, OME-Zarr, formats imageio reads); None where the header does not say."""
    path = Path(path)
    try:
        if is_zarr(path):
            lazy = read_lazy(path)
            return None if lazy is None else lazy.shape
        if not path.is_file() or path.suffix.lower() in DICOM_SUFFIXES:
            return None
        if is_tiff(path):
            import tifffile

            with decoding(path), tifffile.TiffFile(path, _multifile=False) as tif:
                series = tif.series[0]
                shape, axes = series.shape, series.axes
            return int(shape[axes.index("Y")]), int(shape[axes.index("X")])
        import imageio.v3 as iio

        with decoding(path):
            props = iio.improps(path)
        shape = props.shape[1:] if props.is_batch else props.shape
        return (int(shape[0]), int(shape[1])) if len(shape) >= 2 else None
    except (ValueError, IndexError):  # unreadable or unnamed axes: reading reports it
        return None


def _read_with_layout(path: Path, files: Sequence[str | Path] | None = None,
                      ) -> tuple[Any, dict[str, Any], ImageInfo]:
    """The pixels, the layout the file itself states (``PlaneStack.from_array`` keywords)
    and what it says about them."""
    if is_zarr(path):
        from napari_attnreg.core.run.lazy import open_lazy

        return open_lazy(path).read(slice(None), slice(None)), {}, _zarr_info(path)
    _refuse_empty(path)
    if path.is_dir() or (path.is_file() and (path.suffix.lower() in DICOM_SUFFIXES
                                             or _is_extensionless_dicom(path))):
        return _read_dicom(path, files)
    if not path.is_file():
        raise ValueError(f"No such image file: {path}")
    if is_tiff(path):
        return _read_tiff(path)
    if path.suffix.lower() == ".npy":
        return _read_npy(path), {}, ImageInfo()
    _refuse_numpy_archive(path)
    frames, data = _read_picture(path)
    if frames and data.ndim >= 3:  # an animated GIF/WebP: frames are planes, colours stay whole
        if data.shape[0] == 1:
            return data[0], {}, ImageInfo()
        return data, {"channel_last": True} if data.ndim == 4 else {"rgb": False}, ImageInfo()
    return data, {}, ImageInfo()


def _refuse_empty(path: Path) -> None:
    """A file of 0 bytes is named as such (decoders said "no backend" or "not a TIFF")."""
    try:
        empty = path.is_file() and path.stat().st_size == 0
    except OSError:
        return  # reading it says why
    if empty:
        raise ValueError(f"{path} is empty (0 bytes): it was not written or copied completely; "
                         "copy or export it again.")


#: Pillow modes whose colours are not RGB as stored: read converted by Pillow.
_CONVERTED_MODES = {"CMYK": "RGB", "YCbCr": "RGB", "LAB": "RGB", "HSV": "RGB", "LA": "LA",
                    "La": "LA", "PA": "RGBA"}


def _read_picture(path: Path) -> tuple[bool, np.ndarray]:
    """A PNG, JPEG, GIF, WebP or BMP's pixels as the picture shows them, and whether it
    holds several frames.

    imageio hands over a CMYK JPEG's four ink channels, which were taken for RGB and alpha
    (a false-colour negative was analysed); Pillow converts them to RGB here. A palette
    image's transparent entry and a grey image's alpha were dropped or taken for a second
    channel; they are kept as alpha, which the run turns into background with a note
    (:func:`~napari_attnreg.core.run.images.flatten_alpha`).
    """
    import imageio.v3 as iio

    from napari_attnreg.core.run.images import flatten_alpha
    from napari_attnreg.core.run.notes import ImageNoteWarning, TransparencyWarning

    _refuse_text(path)
    with decoding(path):  # whatever Pillow/imageio raise on these bytes is this file's error
        frames = iio.improps(path).is_batch
        meta = {} if frames else iio.immeta(path)
        mode = str(meta.get("mode", ""))
        if mode == "P" and "transparency" in meta:
            mode = "PA"
        data = iio.imread(path, mode=_CONVERTED_MODES[mode]) if mode in _CONVERTED_MODES \
            else iio.imread(path)
        turned = 1 if frames else _exif_orientation(path)
    if mode in ("LA", "La") and data.ndim == 3 and data.shape[-1] == 2:  # grey and alpha
        data, note = flatten_alpha(data)
        data = data[..., 0]
        if note is not None:
            warnings.warn(f"{path.name}: {note}", TransparencyWarning, stacklevel=4)
    if turned not in (1, None):
        warnings.warn(
            f"{path.name}: its EXIF orientation tag ({turned}) asks photo viewers to show it "
            f"{_EXIF_TURNS.get(turned, 'turned or mirrored')}; it is analysed as stored, as "
            "napari, Fiji and QuPath show it, so the maps and regions line up with those. "
            "For the turned picture, save it turned (e.g. PIL.ImageOps.exif_transpose).",
            ImageNoteWarning, stacklevel=4)
    return frames, data


_BINARY_PICTURES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp")


def _refuse_text(path: Path) -> None:
    """A text file under an image's name (a README saved as .jpg, an HTML error page
    downloaded as .png) is called text: imageio's words were that no backend could open it
    "with iomode `r`". Only names of binary formats are looked at (ASCII PGM/PPM and SVG
    are images in text)."""
    if path.suffix.lower() not in _BINARY_PICTURES:
        return
    try:
        with open(path, "rb") as fh:
            head = fh.read(512)
    except OSError:
        return  # reading it says why
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return
    if head and "\0" not in text and all(c.isprintable() or c.isspace() for c in text):
        start = " ".join(text.split())[:40]
        raise UnreadableFileError(
            f"{path} is not a readable image: it holds text (it starts {start!r}); check "
            "that it is the file you meant (a download or export may have saved an error "
            "page or a note under the image's name).")


_EXIF_TURNS = {2: "mirrored", 3: "upside down (turned 180°)", 4: "flipped upside down",
               5: "mirrored and turned", 6: "turned 90° clockwise", 7: "mirrored and turned",
               8: "turned 90° anticlockwise"}


def _exif_orientation(path: Path) -> int | None:
    """The EXIF Orientation (tag 274) a picture states, None when none."""
    from PIL import Image

    with Image.open(path) as picture:
        value = picture.getexif().get(0x0112)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _is_extensionless_dicom(path: Path) -> bool:
    """A DICOM file without a DICOM ending (``IM0001``, ``1.2.840.1234``): the DICM marker,
    looked for only where no other image format claims the name."""
    return not path.name.lower().endswith(IMAGE_SUFFIXES) and is_dicom_file(path)


def _read_tiff(path: Path) -> tuple[np.ndarray, dict[str, Any], ImageInfo]:
    import tifffile

    from napari_attnreg.core.run.planes import layout_from_axes

    with decoding(path), tifffile.TiffFile(path) as tif:
        if not tif.series:
            raise ValueError("the TIFF holds no image")
        series = tif.series[0]
        data, axes = _colours_as_shown(series.asarray(), series.axes, tif.pages.first,
                                       tif.is_shaped)
        info = _tiff_info(tif)
        note = _other_images_note(tif, path)
    if note:  # only the first image is analysed: never without a word
        from napari_attnreg.core.run.notes import ImageNoteWarning

        warnings.warn(note, ImageNoteWarning, stacklevel=2)
    return data, layout_from_axes(axes), info  # ours: outside the decoding boundary


def _other_images_note(tif: Any, path: Path) -> str | None:
    """What a TIFF of several images (series of other shapes: pages of different sizes)
    leaves out; the run analyses the first alone."""
    others = [tuple(s.shape) for s in tif.series[1:]]
    if not others:
        return None
    sizes = ", ".join("x".join(map(str, shape)) for shape in others[:4])
    first = "x".join(map(str, tif.series[0].shape))
    return (f"{path.name} holds {len(others) + 1} images of different shapes; only the first "
            f"({first}) was analysed, not {sizes}{', ...' if len(others) > 4 else ''}. Save "
            "each image as its own file to analyse the others.")


def _colours_as_shown(data: np.ndarray, axes: str, page: Any,
                      shaped: bool) -> tuple[np.ndarray, str]:
    """A TIFF's pixels in the colours its photometric tag states, colours last.

    A scanner's planar RGB TIFF (each colour a plane, ``SYX``) was called ambiguous, and
    several pages of it became a stack of red, green and blue planes; a palette TIFF was
    analysed as its colour indices. Fiji, QuPath and viewers show both in colour.
    """
    kind = _colour_layout(axes, data.shape, page, shaped)
    if kind == "palette":  # the colormap is (3, 2**bits): each index's R, G, B, 16-bit
        return np.take(np.asarray(page.colormap).T, data, axis=0), axes + "S"
    if kind == "planar":
        at = axes.index("S")
        return np.moveaxis(data, at, -1), axes[:at] + axes[at + 1:] + "S"
    return data, axes


def _colour_layout(axes: str, shape: Sequence[int], page: Any, shaped: bool) -> str | None:
    """``"palette"``, ``"planar"`` (RGB stored as planes) or None for other TIFFs.

    tifffile writes any ``(3, H, W)`` array as planar RGB, with the array's shape in its
    description (``shaped``): there the tag is tifffile's default, not a statement about
    colour, and the array's rules apply, as in ``regularize`` (a short first axis is
    ambiguous).
    """
    import tifffile

    photometric = tifffile.PHOTOMETRIC
    if page.photometric == photometric.PALETTE and page.colormap is not None \
            and "S" not in axes:
        return "palette"
    if page.photometric in (photometric.RGB, photometric.YCBCR) and "S" in axes[:-1] \
            and shape[axes.index("S")] in (3, 4) and not shaped:
        return "planar"
    return None


def tiff_in_colour_planes(path: str | Path) -> bool:
    """Whether a TIFF holds RGB as planes or palette colours, from its header: earlier
    versions read those as grey planes or colour indices, so a resumed batch redoes them."""
    import tifffile

    try:
        with tifffile.TiffFile(path) as tif:
            series = tif.series[0]
            return _colour_layout(series.axes, series.shape, tif.pages.first,
                                  tif.is_shaped) is not None
    except Exception:  # unreadable here: reading it reports it  # noqa: BLE001
        return False


def _tiff_info(tif: Any) -> ImageInfo:
    """The OME pixel size of the first image (OME's default unit is µm; a microscope's
    file), else the one its resolution tags state (:func:`_tagged_pixel_size`)."""
    if not tif.is_ome or not tif.ome_metadata:
        size = _tagged_pixel_size(tif)
        return ImageInfo(size, "µm") if size is not None else ImageInfo()
    import tifffile

    ome = tifffile.xml2dict(tif.ome_metadata).get("OME", {})
    image = ome.get("Image", {}) if isinstance(ome, dict) else {}
    image = (image[0] if image else {}) if isinstance(image, list) else image
    pixels = image.get("Pixels", {}) if isinstance(image, dict) else {}
    pixels = pixels if isinstance(pixels, dict) else {}
    size = [_length(pixels.get(f"PhysicalSize{a}")) for a in "YX"]
    units = {_UNITS.get(str(pixels.get(f"PhysicalSize{a}Unit", "µm"))) for a in "YX"}
    known = None not in size and len(units) == 1 and None not in units
    return ImageInfo((size[0], size[1]) if known else None, units.pop() if known else None,
                     "microscopy", "OME metadata")


#: µm per unit of a TIFF's ResolutionUnit (2: inch, 3: centimetre; 4, 5: tifffile's mm and µm)
#: and of ImageJ's ``unit``
#: (its resolution tags in pixels per that unit, ResolutionUnit none).
_TAG_UNIT_UM = {2: 25400.0, 3: 10000.0, 4: 1000.0, 5: 1.0}
_IMAGEJ_UNIT_UM = {"nm": 1e-3, "nanometer": 1e-3, "µm": 1.0, "um": 1.0, "micron": 1.0,
                   "micrometer": 1.0, "\\u00b5m": 1.0, "mm": 1000.0, "millimeter": 1000.0,
                   "cm": 1e4, "m": 1e6}


def _tagged_pixel_size(tif: Any) -> tuple[float, float] | None:
    """µm per pixel ``(rows, columns)`` that a TIFF's resolution tags state, or None.

    The same reading a large TIFF gets as a slide of one level (there through tiffslide),
    so a file's scale bar and µm outputs do not depend on its size: XResolution and
    YResolution in pixels per inch or centimetre, or per ImageJ's ``unit`` (ResolutionUnit
    none). Programs' defaults (72, 96, 300 dpi, 1 pixel per mm, cm or inch) say nothing
    about the pixels and are ignored, as for slides (:func:`~.slides.stated_mpp`).
    """
    from napari_attnreg.io.slides import stated_mpp

    try:
        page = tif.pages.first
        x_res, y_res = (page.tags.valueof(t) for t in ("XResolution", "YResolution"))
        unit = int(page.tags.valueof("ResolutionUnit", 2))
        if unit in _TAG_UNIT_UM:
            per_unit = _TAG_UNIT_UM[unit]
        else:
            imagej = tif.imagej_metadata or {}
            per_unit = _IMAGEJ_UNIT_UM.get(str(imagej.get("unit", "")).strip().lower())
        if per_unit is None or x_res is None or y_res is None:
            return None
        sizes = [per_unit * r[1] / r[0] for r in (y_res, x_res)]
    except (AttributeError, TypeError, ValueError, ZeroDivisionError, IndexError):
        return None
    if not all(math.isfinite(v) and v > 0 for v in sizes):
        return None
    kept = [stated_mpp(v, "its TIFF tags say")[0] for v in sizes]
    return None if None in kept else (float(kept[0]), float(kept[1]))


def _zarr_info(path: Path) -> ImageInfo:
    """An OME-Zarr's pixel size from its first multiscale's axes units and level-0 scale."""
    attrs: Any = {}
    for name, key in ((".zattrs", None), ("zarr.json", "attributes")):
        try:
            attrs = json.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        attrs = attrs.get(key, {}) if key and isinstance(attrs, dict) else attrs
        break
    attrs = attrs if isinstance(attrs, dict) else {}
    multiscales = attrs.get("multiscales") or (attrs.get("ome") or {}).get("multiscales")
    if not (isinstance(multiscales, list) and multiscales and isinstance(multiscales[0], dict)):
        return ImageInfo()
    return ImageInfo(*_zarr_scale(multiscales[0]), "microscopy", "OME metadata")


def _zarr_scale(multiscale: dict[str, Any]) -> tuple[tuple[float, float] | None, str | None]:
    axes = multiscale.get("axes") or []
    try:
        scale = next(t["scale"] for t in multiscale["datasets"][0]["coordinateTransformations"]
                     if t.get("type") == "scale")
        units = [_UNITS.get(str(a.get("unit"))) for a in axes[-2:]]
        size = [_length(v) for v in scale[-2:]]
    except (KeyError, IndexError, TypeError, AttributeError, StopIteration):
        return None, None
    if len(axes) != len(scale) or None in size or None in units or units[0] != units[1]:
        return None, None
    return (size[0], size[1]), units[0]


def _length(value: Any) -> float | None:
    """A physical size that can be one (finite, positive), else None."""
    try:
        size = float(value)
    except (TypeError, ValueError):
        return None
    return size if math.isfinite(size) and 1e-12 <= size <= 1e12 else None


def _read_dicom(path: Path, files: Sequence[str | Path] | None = None,
                ) -> tuple[np.ndarray, dict[str, Any], ImageInfo]:
    """A DICOM series (a folder of slices, or one file) as napari's reader gives it: slices
    and frames are planes, samples are colours; spacing in mm, Modality the kind."""
    from napari_attnreg.io.dicom import read_dicom

    try:
        (data, kwargs), *others = read_dicom(path, files)
    except ImportError as err:  # this file's problem here, not the end of a batch
        raise ValueError(f"{path}: {err}") from None
    if others:
        names = "; ".join(f"{kw['name']} ({kw['metadata']['dicom']['files']} files)"
                          for _, kw in [(data, kwargs), *others])
        raise ValueError(f"{path} holds {1 + len(others)} DICOM series or volumes ({names}); "
                         "put each series in a folder of its own, or open it in napari to "
                         "choose one.")
    dicom = kwargs["metadata"]["dicom"]
    kind = kind_of_modality(dicom["modality"])
    info = ImageInfo(dicom["pixel_spacing"], "mm" if dicom["pixel_spacing"] else None, kind,
                     f"DICOM Modality {dicom['modality']}" if kind else "",
                     window=_window_of(dicom.get("window")), states_window=_grey(dicom),
                     windows=_windows_of(dicom.get("windows")), plane_names=tuple(kwargs["axis_labels"][:-2]))
    return data, {"rgb": bool(kwargs.get("rgb"))}, info
