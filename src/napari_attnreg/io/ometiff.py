"""OME-TIFF → an image with its physical pixel size, axis names and channel axis.

The scale comes from the OME-XML ``PhysicalSizeX/Y/Z`` (and ``TimeIncrement``) of the first
image, the axes from tifffile's series axes (``"TZCYX"``, ``"YXS"``, ...): a ``C`` axis
becomes napari's ``channel_axis`` (one layer per channel, named from the OME channel names), a
trailing ``S`` axis of 3 or 4 samples an RGB(A) image. A pyramid (several resolutions of a
2D image, e.g. bfconvert's or QuPath's sub-IFDs) is all its levels, read on demand, for
napari's multiscale layers; :func:`open_ome_level` opens one level for a run, as
:func:`~napari_attnreg.io.slides.open_slide` opens a slide's.

A layer this package saved (:func:`napari_attnreg.io.export.write_ome_tiff`) comes back as the
layer it was: its type (a Labels layer stays Labels), name, shape, scale, translate, units,
rotate, shear, affine and our metadata, from the MapAnnotation in namespace
:data:`LAYER_NAMESPACE` (or, for files saved before it, from the ``provenance.json`` beside
them); see :func:`read_ome_tiff_layers`.

Example
-------
>>> (data, kwargs), = read_ome_tiff("cells.ome.tif")               # doctest: +SKIP
>>> kwargs["scale"], kwargs["axis_labels"], kwargs["channel_axis"]  # doctest: +SKIP
((2.0, 0.25, 0.25), ('z', 'y', 'x'), 1)
"""

from __future__ import annotations

import json
import math
import numbers
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

import numpy as np

from napari_attnreg.core.files import decoding

if TYPE_CHECKING:  # the run's modules load torch: imported where a level is opened
    from napari_attnreg.core.run.lazy import LazyImage

OME_SUFFIXES = (".ome.tif", ".ome.tiff", ".ome.tf2", ".ome.tf8", ".ome.btf")
#: OME axis letter → (OME-XML size attribute, its unit attribute, the OME default unit).
_PHYSICAL = {"X": ("PhysicalSizeX", "PhysicalSizeXUnit", "µm"),
             "Y": ("PhysicalSizeY", "PhysicalSizeYUnit", "µm"),
             "Z": ("PhysicalSizeZ", "PhysicalSizeZUnit", "µm"),
             "T": ("TimeIncrement", "TimeIncrementUnit", "s")}
#: Units napari (pint) reads; anything else stays in the metadata only.
_UNITS = {"nm": "nm", "µm": "µm", "um": "µm", "mm": "mm", "cm": "cm", "m": "m", "s": "s",
          "ms": "ms", "min": "min", "h": "h"}
LayerKwargs = dict[str, Any]
#: Namespace of the OME MapAnnotation holding a saved layer's napari placement.
LAYER_NAMESPACE = "napari-attnreg/layer"
#: Key of our metadata on napari layers (``layer.metadata[META_KEY]``), kept through a save.
META_KEY = "attnreg"
#: napari (pint) unit names a saved placement may state; anything else is read as pixels.
_LAYER_UNITS = frozenset({*_UNITS, "pixel", "nanometer", "micrometer", "micron", "millimeter",
                          "centimeter", "meter", "second", "millisecond", "minute", "hour"})


def is_ome_tiff(path: str | Path) -> bool:
    """Whether the name says OME-TIFF (``*.ome.tif``, ``*.ome.tiff``, ...); cheap, no read."""
    return str(path).lower().endswith(OME_SUFFIXES) and Path(path).is_file()


#: Images larger than this are read on demand (dask over tifffile's zarr view) when
#: dask and zarr are installed (the ``[scale]`` extra), so a whole-slide image opens at once.
LAZY_BYTES = 1 << 30


def read_ome_tiff_layers(path: str | Path, lazy_bytes: int = LAZY_BYTES,
                         lazy_pixels: int | None = None
                         ) -> list[tuple[np.ndarray, LayerKwargs, str]]:
    """Read an OME-TIFF as napari layer data ``[(data, layer kwargs, layer type)]``.

    A layer saved by this package comes back as it was saved: its type (``"labels"`` or
    ``"image"``), name, shape and placement (``scale``, ``translate``, ``units``, ``rotate``,
    ``shear``, ``affine``), its contrast limits and our metadata; a placement that cannot be
    used (edited, damaged) is set aside with a warning. Any other OME-TIFF is an image (or
    one image per channel) as :func:`read_ome_tiff` describes; a pyramid of a 2D image is
    its levels, full resolution first, each read on demand (``multiscale`` is True). A 2D
    image of one resolution is read on demand too when it has more than ``lazy_pixels``
    pixels a plane (napari's reader asks this of an image it shows as a lazy pyramid).
    """
    import tifffile

    with decoding(path), tifffile.TiffFile(path, _multifile=False) as tif:
        # _multifile=False: a TiffData FileName="../x" must not pull pixels from another file
        ome = tif.is_ome
        if ome:
            series = tif.series[0]
            axes = series.axes.upper()
            levels = _lazy(path, every_level=True) if _is_pyramid(series) else None
            nbytes = int(np.prod(series.shape)) * np.dtype(series.dtype).itemsize
            large = nbytes > lazy_bytes or (
                lazy_pixels is not None and _is_image(series)
                and _plane_pixels(series) > lazy_pixels)
            data = _lazy(path) if levels is None and large else None
            data = levels[0] if levels else data
            data = series.asarray() if data is None else data
            xml = tif.ome_metadata
            pixels = _pixels(tifffile.xml2dict(xml))
    if not ome:
        raise ValueError(f"{path} has no OME-XML metadata; open it with napari's TIFF "
                         "reader instead.")
    saved = _saved_layer(path, data, xml)
    if saved is not None:
        return [saved]
    return [(d, kwargs, "image")
            for d, kwargs in _image_layers(path, levels or [data], axes, pixels)]


def _is_pyramid(series: Any) -> bool:
    """Several resolutions of one 2D image (grey, colour or channels): napari draws it as a
    multiscale layer. A pyramid of planes (Z, T) stays its full resolution, as before."""
    return len(series.levels) > 1 and _is_image(series)


def _is_image(series: Any) -> bool:
    """One 2D image (grey, colour or channels): no planes (Z, T) to step through."""
    return set(series.axes.upper()) <= set("YXCS") and {"Y", "X"} <= set(series.axes.upper())


def _plane_pixels(series: Any) -> int:
    axes = series.axes.upper()
    return int(series.shape[axes.index("Y")]) * int(series.shape[axes.index("X")])


def is_ome_image(path: str | Path) -> bool:
    """Whether ``path`` is an OME-TIFF whose first image is one 2D image (grey, colour or
    channels) of one resolution or several: :func:`open_ome_level` opens it for a run."""
    import tifffile

    if not is_ome_tiff(path):
        return False
    try:
        with tifffile.TiffFile(path, _multifile=False) as tif:
            return bool(tif.is_ome and tif.series) and _is_image(tif.series[0])
    except Exception:  # noqa: BLE001 - any decoder error: no image (the reader reports it)
        return False


def read_ome_tiff(path: str | Path, lazy_bytes: int = LAZY_BYTES
                  ) -> list[tuple[np.ndarray, LayerKwargs]]:
    """Read the first image of an OME-TIFF as ``[(data, napari layer kwargs)]``.

    Parameters
    ----------
    path : str or Path
    lazy_bytes : int
        Above this size the array is a dask array read on demand (needs dask and zarr).

    Returns
    -------
    list of (np.ndarray, dict)
        The full-resolution array of the first series (of a pyramid of a 2D image: its
        levels, full resolution first, each read on demand, with ``multiscale`` True) and
        ``name``, ``scale``, ``units``, ``axis_labels``, ``rgb``, ``channel_axis`` (when there
        are channels) and ``metadata`` (``{"ome": {...}, "source_path": ...}``). Scale and labels cover the
        axes of one channel layer, i.e. without ``C``. A layer this package saved has the
        keyword arguments it was saved with instead (see :func:`read_ome_tiff_layers`,
        which also says its layer type).
    """
    return [(data, kwargs) for data, kwargs, _ in read_ome_tiff_layers(path, lazy_bytes)]


def _image_layers(path: str | Path, levels: list[Any], axes: str, pixels: dict[str, Any]
                  ) -> list[tuple[Any, LayerKwargs]]:
    """An OME-TIFF not saved by us: its physical sizes, axes and channels. ``levels`` holds
    the full resolution, then the coarser levels of a pyramid (a multiscale layer)."""
    data = levels[0]
    rgb = axes.endswith("S") and data.shape[-1] in (3, 4)
    if "S" in axes and not rgb:  # samples that are not colour are channels
        if "C" in axes:
            raise ValueError(f"{path} has both channels and non-colour samples ({axes}); "
                             "napari-attnreg reads one of the two. Re-save it with one.")
        axes = axes.replace("S", "C")
    channel_axis = axes.index("C") if "C" in axes and data.shape[axes.index("C")] > 1 else None
    if "C" in axes and channel_axis is None:  # one channel: drop the axis
        levels = [d[(slice(None),) * axes.index("C") + (0,)] for d in levels]
        axes = axes.replace("C", "")
    spatial = [a for a in axes if a not in "CS"]
    scale, units, physical = [], [], {}
    for axis in spatial:
        size_key, unit_key, default_unit = _PHYSICAL.get(axis, (None, None, "pixel"))
        value = _physical_size(path, axis, pixels.get(size_key)) if size_key else None
        unit = str(pixels.get(unit_key, default_unit)) if size_key else "pixel"
        scale.append(value if value else 1.0)
        units.append(_UNITS.get(unit, "pixel") if value else "pixel")
        if value:
            physical[axis] = (value, unit)
    if len(levels) > 1 and _stated(physical)[1] is not None:  # a pyramid's default size:
        for axis in "YX":  # shown in pixels, as the run records it (no µm)
            k = spatial.index(axis)
            scale[k], units[k] = 1.0, "pixel"
            physical.pop(axis)
    kwargs: LayerKwargs = {
        "name": _stem(path),
        "scale": tuple(scale),
        "axis_labels": tuple(a.lower() for a in spatial),
        "rgb": rgb,
        "metadata": {"source_path": str(path),
                     "ome": {"path": str(path), "axes": axes, "physical_size": physical}},
    }
    if len(levels) > 1:
        kwargs["multiscale"] = True
    if len(set(units)) > 1 or units[0] != "pixel":
        kwargs["units"] = tuple(units)
    if channel_axis is not None:
        kwargs["channel_axis"] = channel_axis
        names = _channel_names(pixels)
        if len(names) == data.shape[channel_axis]:
            kwargs["name"] = [f"{kwargs['name']} · {n}" for n in names]
    return [(levels if len(levels) > 1 else levels[0], kwargs)]


def _lazy(path: str | Path, every_level: bool = False) -> Any | None:
    """The first series as a dask array over tifffile's zarr view (with ``every_level``, a
    list of its levels, full resolution first), or None without dask/zarr."""
    try:
        import dask.array as da
        import zarr
    except ImportError:
        return None
    from napari_attnreg.core.run.lazy import tiff_store

    node = zarr.open(tiff_store(path, series=0), mode="r")
    if hasattr(node, "shape"):  # one level
        return [da.from_zarr(node)] if every_level else da.from_zarr(node)
    if not every_level:
        return da.from_zarr(node["0"])  # pyramid: level 0
    return [da.from_zarr(node[str(k)]) for k in range(len(node))]


# ---- one level of a pyramid, for a run ----------------------------------------------------
#: OME length units in micrometres (slides state their pixel size in µm).
_MICROMETRES = {"nm": 1e-3, "µm": 1.0, "um": 1.0, "mm": 1e3, "cm": 1e4, "m": 1e6}


def micrometres(physical: dict[str, Any]) -> float | None:
    """µm per pixel from an OME ``physical_size`` record (``{"Y": (0.5, "µm"), ...}``): the
    mean of Y and X, as a slide's mpp is; None when either is missing or not a length, or
    when it is no measured size (a program's default, :func:`_stated`)."""
    return _stated(physical)[0]


def _stated(physical: dict[str, Any]) -> tuple[float | None, str | None]:
    """:func:`~napari_attnreg.io.slides.stated_mpp` of a pyramid's OME physical size: a
    converter that carries a TIFF's default resolution tags into the OME-XML (72 dpi as
    352.8 µm) states no pixel size, as the tags themselves do not."""
    from napari_attnreg.io.slides import stated_mpp

    sizes = []
    for axis in "YX":
        value = physical.get(axis)
        factor = _MICROMETRES.get(str(value[1])) if value else None
        if factor is None:
            return None, None
        sizes.append(float(value[0]) * factor)
    return stated_mpp(sum(sizes) / 2, "its OME-XML says")


@dataclass(frozen=True)
class OmePyramid:
    """The levels of an OME-TIFF pyramid's first image, opened without reading pixels.

    Attributes
    ----------
    path : str
    axes : str
        Axis letters of every level (``"YXS"``, ``"YX"``, ``"CYX"``, ...).
    levels : tuple
        zarr arrays, full resolution first.
    mpp : float or None
        Micrometres per full-resolution pixel, when the OME-XML states lengths (and they are
        no program's default, :func:`_stated`).
    ignored_note : str or None
        What the OME-XML stated when it was ignored, for messages.
    """

    path: str
    axes: str
    levels: tuple[Any, ...]
    mpp: float | None
    ignored_note: str | None = None

    @property
    def plane_shapes(self) -> tuple[tuple[int, int], ...]:
        """``(H, W)`` of each level."""
        y, x = self.axes.index("Y"), self.axes.index("X")
        return tuple((int(a.shape[y]), int(a.shape[x])) for a in self.levels)

    def slide_levels(self) -> Any:
        """The :class:`~napari_attnreg.io.slides.SlideLevels` a level or resolution is
        chosen from, as a slide's."""
        from napari_attnreg.io.slides import SlideLevels

        dims = self.plane_shapes
        h0, w0 = dims[0]
        downsamples = tuple((h0 / h + w0 / w) / 2 for h, w in dims)
        return SlideLevels(dims, downsamples, self.mpp, "OME-TIFF",
                           ignored_note=self.ignored_note)


def ome_pyramid(path: str | Path, single: bool = False) -> OmePyramid | None:
    """The OME-TIFF's pyramid, or None when it holds one resolution (unless ``single``:
    then one 2D image of one resolution is a pyramid of one level, as a single-level
    slide is), a pyramid of planes (Z or T), or zarr is not installed.

    Raises
    ------
    ValueError
        The file is not a readable OME-TIFF (the message names it).
    """
    import tifffile

    from napari_attnreg.core.run.lazy import tiff_store

    try:
        import zarr
    except ImportError:
        return None
    with decoding(path), tifffile.TiffFile(path, _multifile=False) as tif:
        if not tif.is_ome or not tif.series:
            raise ValueError(f"{path} is no OME-TIFF (it has no OME-XML metadata).")
        series = tif.series[0]
        if not (_is_pyramid(series) or single and _is_image(series)):
            return None
        axes = series.axes.upper()
        pixels = _pixels(tifffile.xml2dict(tif.ome_metadata))
    physical = {}
    for axis in "YX":
        size_key, unit_key, default_unit = _PHYSICAL[axis]
        value = _physical_size(path, axis, pixels.get(size_key))
        if value:
            physical[axis] = (value, str(pixels.get(unit_key, default_unit)))
    with decoding(path):
        group = zarr.open(tiff_store(path, series=0), mode="r")
        # one resolution: tifffile's store is the level's array, not a group of levels
        levels = (group,) if hasattr(group, "shape") else \
            tuple(group[str(k)] for k in range(len(group)))
    mpp, note = _stated(physical)
    return OmePyramid(str(path), axes, levels, mpp, ignored_note=note)


def open_ome_level(path: str | Path, *, level: int | None = None, mpp: float | None = None,
                   channel: int | None = None) -> LazyImage:
    """One level (or resolution) of an OME-TIFF pyramid as a :class:`LazyImage` whose pixels
    stay on disk, as :func:`~napari_attnreg.io.slides.open_slide` opens a slide's. A 2D
    image of one resolution is a pyramid of one level (level 0, or a resolution made from
    it), as a single-level slide is.

    Parameters
    ----------
    path : str or Path
    level : int, optional
        Pyramid level (0 = full resolution, the default).
    mpp : float, optional
        Micrometres per pixel instead: the coarsest level at least this fine, resampled.
    channel : int, optional
        The one channel to read (napari's layer of that channel); by default colour, or all
        channels when there are at most 3.

    Raises
    ------
    ValueError
        Not an OME-TIFF pyramid, an impossible level or resolution (the message lists the
        levels), a channel that is not there, or more than 3 channels and none chosen.
    """
    from napari_attnreg.core.run.lazy import SAMPLE_PIXELS, LazyImage

    if level is not None and (isinstance(level, bool) or not isinstance(level, numbers.Real)
                              or not float(level).is_integer()):
        raise ValueError(f"level must be a whole number (0 = full resolution), got {level!r}.")
    if mpp is not None and (isinstance(mpp, bool) or not isinstance(mpp, numbers.Real)
                            or not 0 < mpp < math.inf):
        raise ValueError(f"mpp must be a positive number of micrometres per pixel, got "
                         f"{mpp!r}.")
    pyramid = ome_pyramid(path, single=True)
    if pyramid is None:
        raise ValueError(f"{path} is not an OME-TIFF of a 2D image (it holds planes: Z or "
                         "T), or zarr is not installed; open it without a level or "
                         "resolution.")
    axes = pyramid.axes
    rgb = axes.endswith("S") and pyramid.levels[0].shape[-1] in (3, 4)
    # the channel axis (non-colour samples are channels, as napari's layers have them)
    channels = None if rgb or not {"C", "S"} & set(axes) else \
        axes.index("C") if "C" in axes else axes.index("S")
    n = 0 if channels is None else int(pyramid.levels[0].shape[channels])
    if channel is None and n == 1:
        channel = 0
    if channel is not None and not (channels is not None and 0 <= channel < n):
        raise ValueError(f"{path} has no channel {channel} (it has "
                         f"{n or 'no'} channel{'' if n == 1 else 's'}).")
    if channel is None and n > 3:
        raise ValueError(f"{path} has {n} channels: a run of a pyramid level reads up to 3 "
                         "at once; in napari each channel is a layer that runs on its own.")
    levels = pyramid.slide_levels()
    chosen, scale = levels.choose(level, mpp)
    picked = None if channels is None else channel
    array = _LevelView(pyramid.levels[chosen], axes, channels, picked)
    overview = next((_LevelView(pyramid.levels[k], axes, channels, picked)
                     for k in range(chosen + 1, len(pyramid.levels))
                     if math.prod(levels.dimensions[k]) <= SAMPLE_PIXELS), None)
    level_mpp = levels.level_mpp(chosen)
    return LazyImage(array, -1 if len(array.shape) == 3 else None, str(path), scale=scale,
                     mpp=None if level_mpp is None else level_mpp * scale, level=chosen,
                     overview_array=overview, downsample=levels.downsamples[chosen])


def image_view(path: str | Path) -> Any | None:
    """The first image of an OME-TIFF of one 2D image, full resolution, indexed as
    ``(H, W)`` or ``(H, W, C)`` (channels last; a single channel dropped, as napari's layer
    drops it) and read from tifffile's zarr store on demand; None when the file holds planes
    or zarr is not installed. Blocks of it read faster than through a dask array."""
    pyramid = ome_pyramid(path, single=True)
    if pyramid is None:
        return None
    axes, array = pyramid.axes, pyramid.levels[0]
    rgb = axes.endswith("S") and array.shape[-1] in (3, 4)
    channels = None if rgb or not {"C", "S"} & set(axes) else \
        axes.index("C") if "C" in axes else axes.index("S")
    one = channels is not None and int(array.shape[channels]) == 1
    return _LevelView(array, axes, channels, 0 if one else None)


class _LevelView:
    """A pyramid level indexed as ``(H, W)`` or ``(H, W, C)`` (channels last, as
    :class:`~napari_attnreg.core.run.lazy.LazyImage` reads them): one channel picked, or the channel axis moved last.
    Indexing reads only the rows and columns asked for (the level's zarr chunks)."""

    def __init__(self, array: Any, axes: str, channels: int | None,
                 channel: int | None) -> None:
        self.array, self.channels, self.channel = array, channels, channel
        self.y, self.x = axes.index("Y"), axes.index("X")
        kept = [self.y, self.x] + ([axes.index("S")] if "S" in axes and channels is None
                                   else [])
        if channels is not None and channel is None:
            kept.append(channels)
        self.kept = kept
        self.shape = tuple(int(array.shape[a]) for a in kept)
        self.dtype = array.dtype
        self.chunks = tuple(int(array.chunks[a]) for a in kept)

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        ys, xs = key
        index: list[Any] = [slice(None)] * len(self.array.shape)
        index[self.y], index[self.x] = ys, xs
        if self.channel is not None:
            index[self.channels] = self.channel
        block = np.asarray(self.array[tuple(index)])
        # the axes left, in the file's order, to (rows, columns[, channels])
        left = sorted(a for a in range(len(self.array.shape))
                      if not (a == self.channels and self.channel is not None))
        return np.moveaxis(block, [left.index(a) for a in self.kept], range(len(self.kept)))


#: A physical pixel size outside this range (in its unit) is not a real measurement.
_SIZE_RANGE = (1e-12, 1e12)


def _physical_size(path: str | Path, axis: str, value: Any) -> float | None:
    """A usable PhysicalSize/TimeIncrement, or None (scale 1, with a warning when the file
    states a value that cannot be one: 0, negative, NaN, inf, 1e300, text)."""
    if value is None or value == "":
        return None
    try:
        size = float(value)
    except (TypeError, ValueError):
        size = math.nan
    if math.isfinite(size) and _SIZE_RANGE[0] <= size <= _SIZE_RANGE[1]:
        return size
    warnings.warn(f"{path}: the OME physical size of axis {axis} is {value!r}, not a usable "
                  "size; that axis is shown at scale 1 (pixels).", stacklevel=3)
    return None


def _pixels(ome: Any) -> dict[str, Any]:
    """The first image's ``Pixels`` element (empty when the XML lacks it)."""
    image = ome.get("OME", {}) if isinstance(ome, dict) else {}
    image = image.get("Image", {}) if isinstance(image, dict) else {}
    if isinstance(image, list):
        image = image[0] if image else {}
    pixels = image.get("Pixels", {}) if isinstance(image, dict) else {}
    return pixels if isinstance(pixels, dict) else {}


def _channel_names(pixels: dict[str, Any]) -> list[str]:
    channels = pixels.get("Channel", [])
    channels = [channels] if isinstance(channels, dict) else channels
    names = [str(c.get("Name", "")) for c in channels if isinstance(c, dict)]
    return names if all(names) else []


def _stem(path: str | Path) -> str:
    name = Path(path).name
    lower = name.lower()
    for suffix in OME_SUFFIXES:
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


# ---- layers this package saved -------------------------------------------------------------
#: A saved placement or provenance file larger than this is not ours (ours are a few kB).
_MAX_RECORD_BYTES = 16 << 20


def _saved_layer(path: str | Path, data: Any, xml: str
                 ) -> tuple[Any, LayerKwargs, str] | None:
    """The layer as saved, from its MapAnnotation or the provenance beside it; None when the
    file states no placement or an unusable one (then with a warning)."""
    try:
        placement = _annotation(xml)
        if placement is None:
            placement = _provenance_entry(Path(path))
        return None if placement is None else _placed(path, data, placement)
    except ValueError as err:
        warnings.warn(f"{path}: the saved napari placement is not usable ({err}); the layer is "
                      "read from its OME metadata alone.", stacklevel=3)
        return None


def _annotation(xml: str) -> dict[str, Any] | None:
    """Our MapAnnotation's values (each JSON), or None when the file has none."""
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as err:
        raise ValueError(f"its OME-XML does not parse: {err}") from None
    for element in root.iter():
        if element.tag.rpartition("}")[2] == "MapAnnotation" and \
                element.get("Namespace") == LAYER_NAMESPACE:
            values = {}
            for item in element.iter():
                if item.tag.rpartition("}")[2] == "M" and item.get("K"):
                    try:
                        values[item.get("K")] = json.loads(item.text or "null")
                    except json.JSONDecodeError:
                        raise ValueError(f"its value {item.get('K')!r} is not JSON") from None
            return values
    return None


def _provenance_entry(path: Path) -> dict[str, Any] | None:
    """This file's entry in ``<stem>.provenance.json`` or the folder's ``provenance.json``
    (files saved before the placement was written into the OME-XML)."""
    for record in (path.with_name(_stem(path) + ".provenance.json"),
                   path.with_name("provenance.json")):
        if not record.is_file() or record.stat().st_size > _MAX_RECORD_BYTES:
            continue
        try:
            layers = json.loads(record.read_text(encoding="utf-8")).get("layers")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            continue
        for entry in layers if isinstance(layers, list) else []:
            if isinstance(entry, dict) and entry.get("file") == path.name:
                ours = entry.get("metadata")
                return {**{k: entry.get(k) for k in ("layer_type", "name", "shape", "scale",
                                                      "translate", "units")},
                        "metadata": {META_KEY: ours} if isinstance(ours, dict) else None}
    return None


def _placed(path: str | Path, data: Any, saved: dict[str, Any]
            ) -> tuple[Any, LayerKwargs, str]:
    """``(data, kwargs, layer type)`` from a saved placement, every value checked."""
    layer_type = saved.get("layer_type") or "image"
    if layer_type not in ("image", "labels"):
        raise ValueError(f"layer type {layer_type!r} is neither image nor labels")
    shape = _numbers(saved.get("shape"), "shape", None, integer=True)
    if shape is None or math.prod(shape) != math.prod(data.shape) or min(shape) < 1:
        raise ValueError(f"its shape {saved.get('shape')!r} does not match the {data.shape} "
                         "pixels of the file")
    data = data.reshape(tuple(int(n) for n in shape))  # OME drops axes of length 1
    rgb = layer_type == "image" and saved.get("rgb") is True
    n = len(shape) - (1 if rgb else 0)
    name = saved.get("name")
    kwargs: LayerKwargs = {"name": name if isinstance(name, str) and 0 < len(name) <= 1000
                           else _stem(path)}
    for key, shapes in (("scale", [(n,)]), ("translate", [(n,)]), ("rotate", [(n, n)]),
                        ("shear", [(n * (n - 1) // 2,), (n, n)]), ("affine", [(n + 1, n + 1)])):
        value = _numbers(saved.get(key), key, shapes)
        if value is not None:
            kwargs[key] = value
    if "scale" in kwargs and not np.all(np.asarray(kwargs["scale"]) > 0):
        raise ValueError(f"its scale {kwargs['scale']} is not positive")
    units = _layer_units(saved.get("units"), n)
    if units is not None:
        kwargs["units"] = units
    if layer_type == "image":
        kwargs["rgb"] = rgb
        limits = _numbers(saved.get("contrast_limits"), "contrast_limits", [(2,)])
        if limits is not None and limits[0] < limits[1]:
            kwargs["contrast_limits"] = tuple(limits)
    metadata = saved.get("metadata")
    kwargs["metadata"] = {**(metadata if isinstance(metadata, dict) else {}),
                          "source_path": str(path),
                          "ome": {"path": str(path), "layer_type": layer_type}}
    return data, kwargs, layer_type


def _numbers(value: Any, key: str, shapes: list[tuple[int, ...]] | None,
             integer: bool = False) -> Any:
    """Finite numbers of one of ``shapes`` (any 1D length when None) as nested lists, or None
    when absent; a value that is there but wrong raises ValueError."""
    if value is None:
        return None
    try:
        array = np.asarray(value, dtype=np.int64 if integer else np.float64)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"its {key} {value!r} is not numbers") from None
    ok = array.ndim == 1 if shapes is None else array.shape in shapes
    if not ok or not np.all(np.isfinite(array)):
        raise ValueError(f"its {key} {value!r} does not fit the layer")
    return array.tolist()


def _layer_units(value: Any, ndim: int) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, list) and len(value) == ndim and \
            all(isinstance(u, str) and u in _LAYER_UNITS for u in value):
        return tuple(_UNITS.get(u, u) for u in value)
    warnings.warn(f"saved units {value!r} are not lengths or times napari knows; the layer is "
                  "read in pixels.", stacklevel=4)
    return None
