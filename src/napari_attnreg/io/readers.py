"""Image files as the run reads them: a :class:`PlaneStack` in memory, or a lazy image on disk.

One layout rule for every file: where a file states its axes (a TIFF's ImageJ/OME/tifffile
axes, an animated GIF's frames, a DICOM's frames and samples) they decide which axes are
planes and which are channels; otherwise the shape does, by the
:class:`~napari_attnreg.core.run.planes.PlaneStack` rules that :func:`regularize` follows
too. DICOM files are read by :func:`~napari_attnreg.io.dicom.read_dicom`, as napari reads
them (rescaled values, frames in position order). Whatever a decoder raises on damaged
bytes becomes one ValueError that names the file.

Example
-------
>>> stack = read_stack("embryo.tif")                               # doctest: +SKIP
>>> stack.n_planes, stack.plane_shape                               # doctest: +SKIP
(12, (512, 512))
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from napari_attnreg.core.files import decoding
from napari_attnreg.io.dicom import DICOM_SUFFIXES

if TYPE_CHECKING:
    from napari_attnreg.core.run.lazy import LazyImage
    from napari_attnreg.core.run.planes import PlaneStack

TIFF_SUFFIXES = (".tif", ".tiff")
#: File name endings a folder scan takes as images (an OME-Zarr is a ``*.zarr`` folder).
IMAGE_SUFFIXES = (*TIFF_SUFFIXES, ".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp",
                  *DICOM_SUFFIXES)


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
    from napari_attnreg.core.run.planes import PlaneStack

    path = Path(path)
    data, hints = _read_with_layout(path)
    if channel_axis is not None:
        hints = {"channel_axis": channel_axis}
    try:
        return PlaneStack.from_array(data, **hints)
    except ValueError as err:  # an empty or odd layout: say which file has it
        raise ValueError(f"{path}: {err}") from None


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
    if not (is_zarr(path) or path.is_file() and path.suffix.lower() in TIFF_SUFFIXES):
        return None
    from napari_attnreg.core.run.lazy import open_lazy

    try:
        with decoding(path):
            return open_lazy(path)
    except ValueError:
        return None


def _read_with_layout(path: Path) -> tuple[Any, dict[str, Any]]:
    """The pixels and the layout the file itself states (``PlaneStack.from_array`` keywords)."""
    if is_zarr(path):
        from napari_attnreg.core.run.lazy import open_lazy

        return open_lazy(path).read(slice(None), slice(None)), {}
    if not path.is_file():
        raise ValueError(f"No such image file: {path}")
    suffix = path.suffix.lower()
    if suffix in TIFF_SUFFIXES:
        return _read_tiff(path)
    if suffix in DICOM_SUFFIXES:
        return _read_dicom(path)
    import imageio.v3 as iio

    with decoding(path):  # whatever Pillow/imageio raise on these bytes is this file's error
        frames = iio.improps(path).is_batch
        data = iio.imread(path)
    if frames and data.ndim >= 3:  # an animated GIF/WebP: frames are planes, colours stay whole
        if data.shape[0] == 1:
            return data[0], {}
        return data, {"channel_last": True} if data.ndim == 4 else {"rgb": False}
    return data, {}


def _read_tiff(path: Path) -> tuple[np.ndarray, dict[str, Any]]:
    import tifffile

    from napari_attnreg.core.run.planes import layout_from_axes

    with decoding(path), tifffile.TiffFile(path) as tif:
        if not tif.series:
            raise ValueError("the TIFF holds no image")
        series = tif.series[0]
        data, axes = series.asarray(), series.axes
    return data, layout_from_axes(axes)  # ours: outside the decoding boundary


def _read_dicom(path: Path) -> tuple[np.ndarray, dict[str, Any]]:
    """One DICOM file as napari's reader gives it: frames are planes, samples are colours."""
    from napari_attnreg.io.dicom import read_dicom

    try:
        (data, kwargs), *others = read_dicom(path)
    except ImportError as err:  # this file's problem here, not the end of a batch
        raise ValueError(f"{path}: {err}") from None
    if others:
        raise ValueError(f"{path} holds {1 + len(others)} images; open it in napari to "
                         "choose one.")
    return data, {"rgb": bool(kwargs.get("rgb"))}
