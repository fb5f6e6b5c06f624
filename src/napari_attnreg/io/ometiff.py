"""OME-TIFF → an image with its physical pixel size, axis names and channel axis.

The scale comes from the OME-XML ``PhysicalSizeX/Y/Z`` (and ``TimeIncrement``) of the first
image, the axes from tifffile's series axes (``"TZCYX"``, ``"YXS"``, ...): a ``C`` axis
becomes napari's ``channel_axis`` (one layer per channel, named from the OME channel names), a
trailing ``S`` axis of 3 or 4 samples an RGB(A) image.

Example
-------
>>> (data, kwargs), = read_ome_tiff("cells.ome.tif")               # doctest: +SKIP
>>> kwargs["scale"], kwargs["axis_labels"], kwargs["channel_axis"]  # doctest: +SKIP
((2.0, 0.25, 0.25), ('z', 'y', 'x'), 1)
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.core.files import decoding

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


def is_ome_tiff(path: str | Path) -> bool:
    """Whether the name says OME-TIFF (``*.ome.tif``, ``*.ome.tiff``, ...); cheap, no read."""
    return str(path).lower().endswith(OME_SUFFIXES) and Path(path).is_file()


#: Images larger than this are read on demand (dask over tifffile's zarr view) when
#: dask and zarr are installed (the ``[scale]`` extra), so a whole-slide image opens at once.
LAZY_BYTES = 1 << 30


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
        The full-resolution array of the first series and ``name``, ``scale``, ``units``,
        ``axis_labels``, ``rgb``, ``channel_axis`` (when there are channels) and
        ``metadata`` (``{"ome": {...}, "source_path": ...}``). Scale and labels cover the
        axes of one channel layer, i.e. without ``C``.
    """
    import tifffile

    with decoding(path), tifffile.TiffFile(path, _multifile=False) as tif:
        # _multifile=False: a TiffData FileName="../x" must not pull pixels from another file
        ome = tif.is_ome
        if ome:
            series = tif.series[0]
            axes = series.axes.upper()
            nbytes = int(np.prod(series.shape)) * np.dtype(series.dtype).itemsize
            data = _lazy(path) if nbytes > lazy_bytes else None
            data = series.asarray() if data is None else data
            pixels = _pixels(tifffile.xml2dict(tif.ome_metadata))
    if not ome:
        raise ValueError(f"{path} has no OME-XML metadata; open it with napari's TIFF "
                         "reader instead.")
    rgb = axes.endswith("S") and data.shape[-1] in (3, 4)
    if "S" in axes and not rgb:  # samples that are not colour are channels
        if "C" in axes:
            raise ValueError(f"{path} has both channels and non-colour samples ({axes}); "
                             "napari-attnreg reads one of the two. Re-save it with one.")
        axes = axes.replace("S", "C")
    channel_axis = axes.index("C") if "C" in axes and data.shape[axes.index("C")] > 1 else None
    if "C" in axes and channel_axis is None:  # one channel: drop the axis
        data = data[(slice(None),) * axes.index("C") + (0,)]
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
    kwargs: LayerKwargs = {
        "name": _stem(path),
        "scale": tuple(scale),
        "axis_labels": tuple(a.lower() for a in spatial),
        "rgb": rgb,
        "metadata": {"source_path": str(path),
                     "ome": {"path": str(path), "axes": axes, "physical_size": physical}},
    }
    if len(set(units)) > 1 or units[0] != "pixel":
        kwargs["units"] = tuple(units)
    if channel_axis is not None:
        kwargs["channel_axis"] = channel_axis
        names = _channel_names(pixels)
        if len(names) == data.shape[channel_axis]:
            kwargs["name"] = [f"{kwargs['name']} · {n}" for n in names]
    return [(data, kwargs)]


def _lazy(path: str | Path) -> Any | None:
    """The first series as a dask array over tifffile's zarr view, or None without dask/zarr."""
    try:
        import dask.array as da
        import zarr
    except ImportError:
        return None
    import tifffile

    node = zarr.open(tifffile.imread(path, aszarr=True, series=0), mode="r")
    return da.from_zarr(node if hasattr(node, "shape") else node["0"])  # pyramid: level 0


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
