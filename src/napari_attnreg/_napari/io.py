"""npe2 reader and writer adapters over :mod:`napari_attnreg.io` (no Qt here).

The reader takes DICOM (a folder of ``.dcm`` files, one file, a multi-frame file), OME-TIFF,
slides (SVS, NDPI, pyramidal TIFF: :func:`read_slide_layers`; DICOM whole-slide images:
:func:`read_dicom_wsi_layers`), a folder the writer saved
(its ``provenance.json`` lists the layers) and result files (``*.attnreg.npz``,
:meth:`AttentionResult.save`), and declines everything else (returns None) so napari's other
readers get it. The writer saves image/labels layers as
OME-TIFF with their placement (scale, translate, units, ...) plus ``provenance.json``; the
reader puts such layers back where they were, as the layer type and under the name they had.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.io.dicom import looks_like_dicom
from napari_attnreg.io.export import OME_SUFFIXES, PROVENANCE_FILE, save_layer, save_outputs
from napari_attnreg.io.ometiff import is_ome_tiff

LayerData = tuple[Any, dict[str, Any], str]
#: Result files of the command line and the notebook (``AttentionResult.save``).
RESULT_SUFFIX = ".attnreg.npz"
ReaderFunction = Callable[[Any], list[LayerData]]


def get_reader(path: str | list[str]) -> ReaderFunction | None:
    """npe2 reader: a function for a DICOM or OME-TIFF path, None for anything else."""
    if isinstance(path, list):  # napari passes a list when several files are dropped
        if len(path) != 1:
            if not all(_is_dicom(p) for p in path):
                return None
            return read_dicom_wsi_layers if _is_dicom_wsi(path[0]) else read_dicom_files
        path = path[0]
    if is_ome_tiff(path):
        return read_ome_tiff_layers
    if _is_slide(path) or _is_large_tiled_image(path):
        return read_slide_layers
    if (Path(path) / PROVENANCE_FILE).is_file():
        return read_saved_folder
    if str(path).lower().endswith(RESULT_SUFFIX) and Path(path).is_file():
        return read_result_layers
    if str(path).lower().endswith(".geojson") and Path(path).is_file():
        return read_geojson_layers
    if _is_dicom(path):
        return read_dicom_wsi_layers if _is_dicom_wsi(path) else read_dicom_layers
    return None


def _is_slide(path: str) -> bool:
    from napari_attnreg.io.slides import is_slide

    return is_slide(path)


def _is_large_tiled_image(path: str) -> bool:
    """A tiled TIFF of one image without slide metadata (QuPath's or libvips' export of a
    slide) above the untiled pixel budget: napari's own reader would read all of it to draw
    it, so ours shows it as a slide of one level, as every run reads it
    (:func:`~napari_attnreg.io.slides.is_large_tiled_image`). A smaller one is left to
    napari, as before."""
    from napari_attnreg.io.slides import is_large_tiled_image

    return is_large_tiled_image(path)


def read_slide_layers(path: str | list[str]) -> list[LayerData]:
    """A slide (SVS, NDPI, pyramidal TIFF) as one image layer in micrometres, read lazily.

    A slide with several levels is a multiscale layer: napari shows its full resolution
    where one zooms in, reading only the tiles on screen, and its coarser levels further
    out. ``metadata["slide"]`` names the file, the level the layer's pixels are (0 for a
    pyramid), its pixel size, and ``run_level``: the finest level a run in napari's dock
    holds in memory when it is not tiled (a tiled run reads level 0, or the level asked,
    tile by tile, as ``attnreg run --tiled`` does). A tiled TIFF of one image without a
    scanner's metadata above that budget is read here as such a slide. A slide of one level
    is that level (napari
    then reads all of it to draw it) when it is small enough for an untiled run
    (``MAX_UNTILED_PIXELS``); a larger one is shown as a multiscale layer whose finest level
    is the file's and whose coarser levels are made from it as napari draws them
    (:mod:`~napari_attnreg._napari.slide_pyramid`), for display only: ``levels`` counts the
    file's levels, which a run reads, and ``display_levels`` the layer's.
    """
    from napari_attnreg.core.run.lazy import MAX_UNTILED_PIXELS
    from napari_attnreg.io.slides import open_slide

    path = str(path[0] if isinstance(path, list) else path)
    levels = [open_slide(path)]
    while True:
        try:
            levels.append(open_slide(path, level=len(levels)))
        except ValueError:  # no coarser level
            break
    sizes = [image.analysed_shape[0] * image.analysed_shape[1] for image in levels]
    run_level = next((k for k, n in enumerate(sizes) if n <= MAX_UNTILED_PIXELS),
                     len(levels) - 1)
    shown = _with_display_levels([image.array for image in levels], Path(path).name)
    full = levels[0]
    scale = (full.mpp, full.mpp) if full.mpp else (1.0, 1.0)
    rgb = full.channel_axis == -1 and full.array.shape[-1] in (3, 4)
    kwargs: dict[str, Any] = {
        "name": source_layer_name(path), "rgb": rgb, "multiscale": len(shown) > 1,
        "scale": scale, "units": ("µm", "µm") if full.mpp else ("pixel", "pixel"),
        "metadata": {"slide": {"path": path, "level": 0, "mpp": full.mpp, "downsample": 1.0,
                               "levels": len(levels), "display_levels": len(shown),
                               "run_level": run_level}}}
    return [(shown if len(shown) > 1 else full.array, kwargs, "image")]


def _with_display_levels(levels: list[Any], name: str) -> list[Any]:
    """A slide's levels as napari shows them: a single level above the untiled pixel budget
    followed by halved copies made as napari draws them (napari would read a single array
    whole, gigabytes for such a slide), computed off the main thread in a viewer; any other
    slide's levels as they are. ``name`` (the file's) is what the progress bar reads."""
    from napari_attnreg.core.run.lazy import MAX_UNTILED_PIXELS

    if len(levels) != 1 or levels[0].shape[0] * levels[0].shape[1] <= MAX_UNTILED_PIXELS:
        return levels
    from napari_attnreg._napari.slide_fill import fill_in_background
    from napari_attnreg._napari.slide_pyramid import display_levels

    shown = [levels[0], *display_levels(levels[0])]
    fill_in_background(shown, name)
    return shown


def _is_dicom_wsi(path: str) -> bool:
    from napari_attnreg.io.dicom_wsi import is_dicom_wsi

    return is_dicom_wsi(path)


def read_dicom_wsi_layers(path: str | list[str]) -> list[LayerData]:
    """A DICOM whole-slide image (a file, a slide's folder, or its files dropped together) as
    :func:`read_slide_layers` reads an SVS: one image layer in micrometres, a multiscale
    one over the slide's VOLUME levels (its label and overview left out), each level decoded
    tile by tile as napari draws it (a single large level with coarser ones made for display,
    as a slide's); ``metadata["slide"]`` as there."""
    from napari_attnreg.core.run.lazy import MAX_UNTILED_PIXELS
    from napari_attnreg.io.dicom_wsi import wsi_pyramid

    if isinstance(path, list):
        folders = {str(Path(p).parent) for p in path}
        path = path[0] if len(path) == 1 else folders.pop() if len(folders) == 1 else ""
        if not path:
            raise ValueError("Drop the files of one DICOM slide at a time, or drop its folder.")
    slide = wsi_pyramid(path)
    shown = _with_display_levels(list(slide.levels), Path(path).name)
    sizes = [h * w for h, w in slide.pyramid.dimensions]
    run_level = next((k for k, n in enumerate(sizes) if n <= MAX_UNTILED_PIXELS),
                     len(sizes) - 1)
    mpp = slide.pyramid.mpp
    name = Path(path).name if Path(path).is_dir() else source_layer_name(str(path))
    kwargs: dict[str, Any] = {
        "name": name, "rgb": shown[0].ndim == 3, "multiscale": len(shown) > 1,
        "scale": (mpp, mpp) if mpp else (1.0, 1.0),
        "units": ("µm", "µm") if mpp else ("pixel", "pixel"),
        "metadata": {"slide": {"path": str(path), "level": 0, "mpp": mpp, "downsample": 1.0,
                               "levels": len(sizes), "display_levels": len(shown),
                               "run_level": run_level,
                               "format": "DICOM WSI"}}}
    return [(shown if len(shown) > 1 else shown[0], kwargs, "image")]


def _is_dicom(path: str) -> bool:
    return Path(path).suffix.lower() in (".dcm", ".dicom") or looks_like_dicom(path)


def read_dicom_layers(path: str | list[str]) -> list[LayerData]:
    """Read a DICOM series (pydicom needed: the ``[dicom]`` extra)."""
    from napari_attnreg.io.dicom import read_dicom

    path = path[0] if isinstance(path, list) else path
    return [(data, kwargs, "image") for data, kwargs in read_dicom(path)]


def read_dicom_files(paths: list[str]) -> list[LayerData]:
    """Several DICOM files dropped together: read as the series of their common folder."""
    folders = {str(Path(p).parent) for p in paths}
    if len(folders) != 1:
        raise ValueError("Drop DICOM files of one folder at a time, or drop the folder itself.")
    return read_dicom_layers(folders.pop())


def read_ome_tiff_layers(path: str | list[str]) -> list[LayerData]:
    """Read an OME-TIFF with its physical scale and channels; an output layer saved by the
    dock comes back placed, typed, named and drawn as the dock made it.

    An OME-TIFF pyramid (bfconvert's, QuPath's: several resolutions of a 2D image) is a
    multiscale layer, one per channel as a single resolution is: napari reads only the tiles
    on screen. Each layer carries a ``metadata["slide"]`` record as a slide's does
    (:func:`read_slide_layers`), with ``kind`` ``"ome"`` and, for a channel layer, its
    ``channel``: the dock runs it from the file at the finest level the untiled pixel budget
    holds, or tiled at full resolution, without a slide's automatic tissue mask. A 2D image
    of one resolution above the untiled pixel budget is shown as a single-level slide is:
    the file's level, read on demand, and coarser levels made from it as napari draws them
    (:mod:`~napari_attnreg._napari.slide_pyramid`), with the same record (``levels`` 1).
    """
    from napari_attnreg._napari.layers import KINDS, META_KEY, output_style
    from napari_attnreg._napari.outline import outline_layer_data
    from napari_attnreg.core.run.lazy import MAX_UNTILED_PIXELS
    from napari_attnreg.io.ometiff import read_ome_tiff_layers as read

    path = path[0] if isinstance(path, list) else path
    layers = []
    for data, kwargs, layer_type in read(path, lazy_pixels=MAX_UNTILED_PIXELS):
        ours = kwargs.get("metadata", {}).get(META_KEY)
        kind = ours.get("kind") if isinstance(ours, dict) else None
        if kind in KINDS and (kind == "significant") == (layer_type == "labels"):
            kwargs = {**output_style(kind, kwargs.get("contrast_limits"),
                                     signed=bool(ours.get("map_signed"))), **kwargs}
        if layer_type == "image" and kwargs.get("multiscale"):
            kwargs = _ome_pyramid_record(str(path), data, kwargs)
        elif layer_type == "image" and (shown := _ome_single_level(data, kwargs)) is not None:
            kwargs = _ome_pyramid_record(str(path), [data], {**kwargs, "multiscale": True},
                                         display_levels=len(shown))
            data = shown
        layers.append((data, kwargs, layer_type))
        if kind == "significant" and layer_type == "labels":  # drawn by its thin outline
            layers.append(outline_layer_data(data, kwargs))
    return layers


def _ome_single_level(data: Any, kwargs: dict[str, Any]) -> list[Any] | None:
    """The levels napari shows of an OME-TIFF's 2D image of one resolution above the untiled
    pixel budget: its array, then halved levels made from it on demand (channels kept
    where napari's channel split takes them); None for any other image (shown as before)."""
    from napari_attnreg.core.run.lazy import MAX_UNTILED_PIXELS

    ome = kwargs.get("metadata", {}).get("ome") if isinstance(kwargs.get("metadata"),
                                                              dict) else None
    axes = str(ome.get("axes", "")) if isinstance(ome, dict) else ""
    if not axes or not set(axes) <= set("YXCS") or {"Y", "X"} - set(axes) or \
            len(axes) != len(data.shape) or isinstance(data, np.ndarray) or \
            int(data.shape[axes.index("Y")]) * int(data.shape[axes.index("X")]) \
            <= MAX_UNTILED_PIXELS:
        return None  # planes, a pixel array read at open (no dask), or small: as before
    from napari_attnreg._napari.slide_fill import fill_in_background
    from napari_attnreg._napari.slide_pyramid import ChannelsAt, display_levels
    from napari_attnreg.io.ometiff import image_view

    # the means are taken over (rows, columns[, channels]): a CYX image's channels moved
    # last; read from the file's zarr store, twice as fast as through the layer's dask array
    order = (axes.index("Y"), axes.index("X"), *(a for a, n in enumerate(axes) if n in "CS"))
    data_yx = image_view(ome["path"])
    if data_yx is None or tuple(data_yx.shape) != tuple(int(data.shape[a]) for a in order):
        import dask.array as da  # the image is a dask array here (read on demand)

        data_yx = da.transpose(data, order)
    coarse = display_levels(data_yx)
    fill_in_background(coarse, Path(str(ome["path"])).name)
    axis = kwargs.get("channel_axis")
    if axis is not None:  # one layer per channel: each takes its channel lazily
        coarse = [ChannelsAt(level, int(axis)) for level in coarse]
    return [data, *coarse]


def _ome_pyramid_record(path: str, levels: list[Any], kwargs: dict[str, Any],
                        display_levels: int | None = None) -> dict[str, Any]:
    """``kwargs`` with the ``metadata["slide"]`` record of an OME pyramid: per channel (a
    list napari's channel split hands out) when the layers are channels. ``levels`` are the
    file's; ``display_levels`` counts the layer's when coarser ones were made for display."""
    from napari_attnreg.core.run.lazy import MAX_UNTILED_PIXELS
    from napari_attnreg.io.ometiff import micrometres

    ome = kwargs["metadata"]["ome"]
    axes = str(ome["axes"])  # the axes of ``levels``: Y, X and C or S
    y, x = axes.index("Y"), axes.index("X")
    sizes = [int(level.shape[y]) * int(level.shape[x]) for level in levels]
    run_level = next((k for k, n in enumerate(sizes) if n <= MAX_UNTILED_PIXELS),
                     len(levels) - 1)
    record = {"path": path, "kind": "ome", "level": 0,
              "mpp": micrometres(ome.get("physical_size") or {}), "downsample": 1.0,
              "levels": len(levels), "run_level": run_level}
    if display_levels is not None:
        record["display_levels"] = int(display_levels)
    axis = kwargs.get("channel_axis")
    if axis is None:
        return {**kwargs, "metadata": {**kwargs["metadata"], "slide": record}}
    return {**kwargs, "metadata": [{**kwargs["metadata"], "slide": {**record, "channel": c}}
                                   for c in range(int(levels[0].shape[axis]))]}


def read_saved_folder(path: str | list[str]) -> list[LayerData]:
    """A folder the writer made: the OME-TIFF files its ``provenance.json`` lists, in the
    order they were saved (stacking order), each as :func:`read_ome_tiff_layers` reads it;
    a slide the record names (saved by reference, not copied) is opened again from its file
    where it was placed. A slide file that is gone is said in a warning; the folder's other
    layers still open."""
    folder = Path(path[0] if isinstance(path, list) else path)
    try:
        entries = json.loads((folder / PROVENANCE_FILE).read_text(encoding="utf-8"))["layers"]
        listed = [(e.get("file"), e) for e in entries]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{folder / PROVENANCE_FILE} does not list saved layers ({err}).") \
            from None
    layers: list[LayerData] = []
    reopened: set[str] = set()  # a file whose channel layers were saved: opened once
    for file, entry in listed:
        if entry.get("slide") and file is None:
            layers.extend(_saved_slide(entry, folder, reopened))
        # only files inside the folder: a name such as "../x" in an edited record is skipped
        elif isinstance(file, str) and Path(file).name == file and is_ome_tiff(folder / file):
            layers.extend(read_ome_tiff_layers(str(folder / file)))
    if not layers:
        raise ValueError(f"None of the layers {folder / PROVENANCE_FILE} lists is in {folder}.")
    from napari_attnreg._napari.reopen import link_result_files, saved_result_files

    # the run's results the writer saved beside the maps: a dock takes them up as its own
    return link_result_files(layers, saved_result_files(folder, layers))


def _saved_slide(entry: dict[str, Any], folder: Path, reopened: set[str]) -> list[LayerData]:
    """The slide or pyramid a saved folder refers to, opened again by the reader that opened
    it, under the name and placement it had (nothing, with a warning, when its file is gone
    or no reader takes it any more; nothing when it is open already)."""
    import warnings

    record = entry["slide"] if isinstance(entry["slide"], dict) else {"path": entry["slide"]}
    slide = Path(str(record.get("path")))
    if not slide.is_absolute():
        slide = folder / slide
    reader = get_reader(str(slide)) if slide.exists() else None
    if str(slide) in reopened:
        return []
    if reader is None or reader in (read_saved_folder, read_result_layers):
        warnings.warn(f"{folder / PROVENANCE_FILE} refers to the slide {slide}, which is no "
                      f"longer there (or no slide); open it to see "
                      f"{entry.get('name')!r} with its results.", stacklevel=2)
        return []
    reopened.add(str(slide))
    layers = reader(str(slide))
    if len(layers) != 1 or layers[0][1].get("channel_axis") is not None:
        return layers  # a pyramid's channel layers: as the reader names and places them
    [(data, kwargs, kind)] = layers
    placed = {key: tuple(entry[key]) for key in ("scale", "translate")
              if isinstance(entry.get(key), list) and len(entry[key]) == 2}
    return [(data, {**kwargs, **placed, "name": entry.get("name") or kwargs["name"]}, kind)]


def read_result_layers(path: str | list[str]) -> list[LayerData]:
    """A result file (``*.attnreg.npz``) as the output layers the dock makes of it, placed on
    its source image by the spacing the result records (pixels when it records none)."""
    from napari_attnreg._napari.geometry import SourceGeometry
    from napari_attnreg._napari.layers import result_layers
    from napari_attnreg._napari.reopen import link_result_files
    from napari_attnreg.core.results.result import AttentionResult

    path = Path(path[0] if isinstance(path, list) else path)
    result = AttentionResult.load(path)  # a ValueError that names the file and the problem
    source = result.metadata.get("source")
    name = source_layer_name(str(source) if source else path.name[: -len(RESULT_SUFFIX)])
    geometry = SourceGeometry.of_image(result.image_shape, **result.spatial)
    params = {**result.metadata, "source": name, "source_path": str(source or path),
              "result_file": str(path)}
    mask = tissue_layer(result, name)
    layers = result_layers({(): result}, name, geometry, params)
    # a dock takes the file up as a result of its own (thresholds, inspector, ROI table)
    return [*([mask] if mask is not None else []), *link_result_files(layers, {(): path})]


def tissue_layer(result: Any, source_name: str) -> LayerData | None:
    """The tissue mask a tiled run used, as a Labels layer over its image (None without one).

    The mask has a thumbnail's resolution; its scale stretches it over the analysed image,
    in the result's units.
    """
    mask = result.null_summary.get("tissue_mask")
    if mask is None:
        return None
    mask = np.asarray(mask, dtype=np.uint8)
    spatial = result.spatial
    # a mask pixel covers f analysed pixels: its centre is (f - 1)/2 of them in
    f = [float(result.image_shape[a]) / mask.shape[a] for a in range(2)]
    scale = tuple(f[a] * float(spatial["scale"][a]) for a in range(2))
    translate = tuple(float(spatial["translate"][a]) + (f[a] - 1) / 2 * float(spatial["scale"][a])
                      for a in range(2))
    md = result.metadata
    return (mask, {"name": f"{source_name} tissue", "scale": scale, "translate": translate,
                   "units": tuple(str(u) for u in spatial["units"]),
                   "opacity": 0.35, "metadata": {"tissue": {
                       "source": md.get("tissue_mask"), "tiles": md.get("n_tissue_tiles"),
                       "of": md.get("n_tiles_total"), "image": source_name,
                       "digest": _digest(mask)}}}, "labels")


def tissue_untouched(layer: Any, source_name: str) -> bool:
    """Whether ``layer`` is the tissue mask a run of ``source_name`` added, as it was added
    (the analyst has not painted on it)."""
    meta = layer.metadata.get("tissue") if isinstance(layer.metadata, dict) else None
    return (isinstance(meta, dict) and meta.get("image") == source_name
            and meta.get("digest") is not None
            and meta.get("digest") == _digest(np.asarray(layer.data, dtype=np.uint8)))


def _digest(mask: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(mask, dtype=np.uint8).tobytes()
                          + str(mask.shape).encode()).hexdigest()


def read_geojson_layers(path: str | list[str]) -> list[LayerData]:
    """GeoJSON polygon annotations (QuPath's export, in image pixels) as a Shapes layer the
    dock takes as ROIs: one polygon per annotation, in file order (ROI ``i`` is feature
    ``i``), holes left out; the layer's features name each one (QuPath's name, class and
    object type) and its edges take the class colour."""
    import numpy as np
    import pandas as pd

    from napari_attnreg.io.geojson import read_geojson_annotations

    path = Path(path[0] if isinstance(path, list) else path)
    shapes, colors, table = [], [], []
    for geom, about in read_geojson_annotations(path):
        # (x, y) from the top-left corner -> napari's (row, col) with pixel centres at 0
        shapes.append(napari_polygon(geom)[:, ::-1] - 0.5)
        colors.append(np.r_[np.asarray(about["color"]) / 255.0, 1.0] if about["color"]
                      else np.array([1.0, 1.0, 0.0, 1.0]))  # yellow: no class colour
        table.append({k: about[k] for k in ("name", "classification", "object_type")})
    name = path.name[: -len(".geojson")] + " ROIs"
    # in the file's pixels (a slide's: full resolution); the dock lays them over a slide layer
    return [(shapes, {"name": name, "shape_type": "polygon", "edge_color": np.array(colors),
                      "face_color": "transparent", "edge_width": 1.0,
                      "features": pd.DataFrame(table),
                      # a shape drawn next is no copy of the last annotation's name and class
                      "feature_defaults": {"name": "", "classification": "",
                                           "object_type": ""},
                      "metadata": {"geojson": {"path": str(path), "frame": "pixels"}}},
             "shapes")]


def napari_polygon(geom: Any) -> Any:
    """One napari polygon, ``(n, 2)`` (x, y) vertices, filling what a shapely ``Polygon`` or
    ``MultiPolygon`` fills.

    Only the outer ring was read, so a hole (necrosis left out of a tumour outline) was
    measured as ROI, and each part of a multi-part annotation became its own ROI. napari
    fills a polygon by the even-odd rule and drops an edge walked twice (its way of holding
    holes): each hole is walked from its part's first vertex and back, each further part
    from the first part's, so one annotation stays one ROI.
    """
    import numpy as np
    from shapely.geometry.polygon import orient

    parts = [orient(part, 1.0) for part in getattr(geom, "geoms", [geom])]
    first = np.asarray(parts[0].exterior.coords)
    if len(parts) == 1 and not parts[0].interiors:
        return first[:-1]  # a plain polygon: its ring, as drawn
    walk = []
    for number, part in enumerate(parts):
        ring = np.asarray(part.exterior.coords)  # closed: ends where it starts
        walk.append(ring)
        for hole in part.interiors:  # clockwise after orient: against the outer ring
            walk += [np.asarray(hole.coords), ring[:1]]
        if number < len(parts) - 1:
            walk.append(first[:1])
    verts = np.concatenate(walk)
    keep = np.r_[True, np.any(np.diff(verts, axis=0) != 0, axis=1)]  # no zero-length edges
    return verts[keep]


def source_layer_name(path: str) -> str:
    """The name napari gives a layer read from ``path`` (the file name without its image
    suffix, ``.ome.tif`` whole): output layers of a result file are named after it, as the
    dock names those of the same image opened in napari."""
    name = Path(path).name
    lower = name.lower()
    for suffix in (*OME_SUFFIXES, ".tiff", ".tif", ".png", ".jpg", ".jpeg", ".dcm", ".dicom",
                   ".npy", ".czi", ".nd2", ".lif", ".bmp"):
        if lower.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return Path(name).stem or name


def write_outputs(path: str, layer_data: list[LayerData]) -> list[str]:
    """npe2 writer: one layer to ``*.ome.tif``, or several layers into a folder.

    A single layer saved under an OME-TIFF name is that one file plus
    ``<name>.provenance.json`` beside it; otherwise ``path`` (without an OME-TIFF suffix) is
    a folder with one OME-TIFF per layer and ``provenance.json``.
    """
    lower = path.lower()
    suffix = next((s for s in OME_SUFFIXES if lower.endswith(s)), None)
    if suffix and len(layer_data) == 1:
        return [str(p) for p in save_layer(path, layer_data[0])]
    from napari_attnreg._napari.reopen import write_result_files

    folder = path[: -len(suffix)] if suffix else path
    written = save_outputs(folder, layer_data)
    # the run's results too, so the folder reopens as a result the dock can threshold again
    return [str(p) for p in [*written, *write_result_files(folder, layer_data)]]
