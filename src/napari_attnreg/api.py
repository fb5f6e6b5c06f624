"""``napari_attnreg.regularize``: the core's :func:`~napari_attnreg.core.run.api.regularize`,
which also takes the path of an image file and opens it as the command line does.

A slide is opened at ``level=`` / ``mpp=`` (read tile by tile when ``tiled=True``), a TIFF or
OME-Zarr of one image is read on demand by a tiled run, anything else is read into memory
after the untiled pixel-budget check; what the file says (pixel size, kind of image) is
recorded in the result. Reading files belongs to :mod:`napari_attnreg.io`, above the core,
hence this module at the package's top.

Example
-------
>>> from napari_attnreg import regularize
>>> result = regularize("biopsy.svs", tiled=True, mpp=1.0)      # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run import api as core_api
from napari_attnreg.core.run.planes import PlaneStack

if TYPE_CHECKING:
    from napari_attnreg.core.run.lazy import LazyImage

#: The options :func:`~napari_attnreg.io.readers.open_for_run` reads.
OPEN_OPTIONS = ("tiled", "level", "mpp", "tile_scale", "channels", "merge", "channel_axis")


def regularize(image: Any, model: Any = "demo", **kwargs: Any) -> AttentionResult:
    """Bootstrap significance and regularized attention maps for one 2D image or image file.

    Parameters
    ----------
    image : array-like, LazyImage, str or Path
        As :func:`napari_attnreg.core.run.api.regularize` takes it, or the path of an image
        file (a slide, a TIFF, an OME-Zarr, a PNG, ...), opened with the run's options.
    model, **kwargs
        As :func:`napari_attnreg.core.run.api.regularize` (``progress``, ``cancel``,
        ``arch`` and the run's options).

    Returns
    -------
    AttentionResult

    Raises
    ------
    ValueError
        A missing or unreadable file, a file of several planes (read it and use
        :func:`~napari_attnreg.core.run.api.regularize_stack`), or what the core raises.
    """
    if not isinstance(image, (str, os.PathLike)):
        return core_api.regularize(image, model, **_placed_mask(image, kwargs, {}))
    path = Path(image)
    if not path.exists():
        raise ValueError(f"regularize: no such image file {path}; give an existing file, an "
                         "array or an opened image (open_slide, open_lazy).")
    source, provenance = open_path(path, kwargs)
    if isinstance(source, PlaneStack) and source.n_planes > 1:
        raise ValueError(f"{path} holds {source.n_planes} planes (stack shape "
                         f"{source.stack_shape}); regularize() analyses one 2D image: use "
                         "napari_attnreg.regularize_stack(path, ...) for every plane, or run "
                         "the file with 'attnreg run'.")
    # level/mpp stay: the core checks they are those the file was opened at, and records
    # them as the command line does
    return core_api.regularize(source, model, provenance=provenance,
                               **_placed_mask(source, kwargs, provenance))


def regularize_stack(stack: Any, model: Any = "demo", **kwargs: Any) -> core_api.StackResults:
    """:func:`~napari_attnreg.core.run.api.regularize_stack` on every plane of a stack, which
    may also be the path of an image file (an ImageJ hyperstack, an OME-TIFF, a DICOM series'
    folder), opened as the command line opens it: planes and channels as the file states
    them, its pixel size recorded in each result.

    Parameters
    ----------
    stack : array-like, PlaneStack, str or Path
    model, **kwargs
        As :func:`napari_attnreg.core.run.api.regularize_stack`.

    Returns
    -------
    StackResults

    Raises
    ------
    ValueError
        A missing or unreadable file, a slide (one image: use :func:`regularize`), or what
        the core raises.

    Examples
    --------
    >>> results = regularize_stack("embryo.tif", n_boot=100)       # doctest: +SKIP
    """
    if not isinstance(stack, (str, os.PathLike)):
        return core_api.regularize_stack(stack, model, **kwargs)
    path = Path(stack)
    if not path.exists():
        raise ValueError(f"regularize_stack: no such image file {path}; give an existing "
                         "file or an array.")
    opened = {k: v for k, v in kwargs.items() if k != "tiled"}  # planes are read whole
    source, provenance = open_path(path, opened)
    if not isinstance(source, PlaneStack):
        raise ValueError(f"{path} is one image read on demand (a slide or a large image), "
                         "not a stack of planes: use napari_attnreg.regularize(path, ...).")
    options = {k: v for k, v in kwargs.items() if k != "channel_axis"}  # the file's, above
    return core_api.regularize_stack(source, model, provenance=provenance, **options)


def _placed_mask(image: Any, kwargs: dict[str, Any],
                 provenance: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with a GeoJSON ``tissue_mask`` (QuPath's outline, in full-resolution
    pixels) rasterized over the image as the run analyses it
    (:func:`~napari_attnreg.io.geojson.tissue_mask_for_run`); other values as given."""
    from napari_attnreg.core.run.lazy import LazyImage
    from napari_attnreg.io.geojson import is_geojson_path, tissue_mask_for_run

    if not is_geojson_path(kwargs.get("tissue_mask")):
        return kwargs
    if isinstance(image, LazyImage):
        shape, extra = image.analysed_shape, {**image.run_extra(), **provenance}
    else:
        stack = image if isinstance(image, PlaneStack) else PlaneStack.from_array(
            image, channel_axis=kwargs.get("channel_axis"))
        shape, extra = stack.plane_shape, provenance
    return {**kwargs, "tissue_mask": tissue_mask_for_run(kwargs["tissue_mask"], shape, extra)}


def open_path(path: str | os.PathLike, options: Mapping[str, Any],
              ) -> tuple[PlaneStack | LazyImage, dict[str, Any]]:
    """An image file opened for a run with ``options`` as the command line opens it.

    Shared by :func:`regularize` and the notebook explorer, so a path means the same pixels
    and the same record in every front end.

    Parameters
    ----------
    path : str or Path
    options : mapping
        Run options; those in :data:`OPEN_OPTIONS` that are set choose how the file is read
        (a slide's level or resolution, lazily for a tiled run, ...).

    Returns
    -------
    (PlaneStack or LazyImage, dict)
        The image, and what the run records of the file (``RunConfig.extra``: its pixel size
        as ``spatial``, the kind of image, ``source``).

    Raises
    ------
    ValueError
        As :func:`~napari_attnreg.io.readers.open_for_run`: unreadable, too large for an
        untiled run (naming tiled), or an impossible slide level.
    """
    from napari_attnreg.io.readers import open_for_run

    opts = {k: options[k] for k in OPEN_OPTIONS if options.get(k) is not None}
    if options.get("tiled") is not None:
        opts["tiled"] = bool(options["tiled"])
    source, info = open_for_run(Path(path), opts)
    return source, {**info.run_extra(), "source": str(path)}
