"""A run of a slide layer: the slide read again from its file, at the level or resolution the
options ask for, with the slide's tissue mask, and placed over the layer.

napari shows a slide as a pyramid whose pixels are level 0's (see
:func:`napari_attnreg._napari.io.read_slide_layers`), or as the one level a layer holds. A
tiled run reads the slide itself tile by tile, as the command line does: at the layer's level
(full resolution for a pyramid) unless *Slide level* or *Slide resolution* says otherwise,
and with the automatic tissue mask unless *Tissue mask* says otherwise. An untiled run reads
a level whole (within the untiled pixel budget): the one asked, else the finest the budget
holds (``run_level``). Either way the analysed pixels are tied to the layer's by an
:class:`AnalysedGrid`, so the output layers lie on the tissue they were computed from. No Qt
in here.

An OME-TIFF pyramid (``kind`` ``"ome"`` in the record) runs the same way, read by its OME
axes (:func:`~napari_attnreg.io.ometiff.open_ome_level`; a channel layer reads its
``channel``), and as a microscope's image: no automatic tissue mask.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from napari_attnreg._napari.geometry import AnalysedGrid
from napari_attnreg.core.run.config import RunConfig


def slide_of(layer: Any) -> dict[str, Any] | None:
    """The ``metadata["slide"]`` record the plugin's readers give a layer of a pyramid file
    (None: none): a slide's, or an OME-TIFF pyramid's (``kind`` ``"ome"``). Either is read
    again from its file at any level, and lies in full-resolution pixels (QuPath's GeoJSON
    frame) scaled to its units."""
    slide = layer.metadata.get("slide") if isinstance(layer.metadata, dict) else None
    return slide if isinstance(slide, dict) and slide.get("path") else None


def slide_run(layer: Any, config: RunConfig) -> tuple[Any, AnalysedGrid | None, RunConfig]:
    """What a run of ``layer`` reads: ``(image, grid, config)``.

    ``image`` is None when the run reads the layer's own pixels (not a slide, or an untiled
    run at the layer's level); else the slide opened again (a lazily read image for a tiled
    run, the level's pixels for an untiled one). ``grid`` places the analysed pixels on the
    layer's (None: they are the layer's). ``config`` records the level asked (the layer's
    when none was) and the level read (``slide_level``); a layer that is not a slide drops
    ``level`` and ``mpp``, which only slides take.

    Raises
    ------
    ValueError
        The slide file is gone, the level or resolution is not in the slide, or an untiled
        run of the level would exceed the pixel budget (the message names Tiled).
    """
    slide = slide_of(layer)
    asked = config.level is not None or config.mpp is not None
    if slide is None:
        return None, None, replace(config, level=None, mpp=None)
    pyramid = bool(getattr(layer, "multiscale", False))
    if not config.tiled and not asked and not pyramid:  # the layer's own pixels
        said = {"slide_level": slide.get("level"), "slide_resample": 1.0,
                "slide_downsample": float(slide.get("downsample") or 1.0)}
        return None, None, replace(config, level=slide.get("level"),
                                   extra={**config.extra, **said})
    from napari_attnreg.io.readers import open_for_run
    from napari_attnreg.io.slides import open_slide

    path = Path(str(slide["path"]))
    if not path.exists():  # a file, or the folder of a DICOM slide's instances
        raise ValueError(f"The slide file of {layer.name!r} ({path}) is no longer there; a "
                         "tiled run, or a run at another level, reads the slide from its file. "
                         "Open the slide again.")
    if asked:
        level = config.level
    elif config.tiled or not pyramid:
        level = slide.get("level")
    else:  # an untiled run of a pyramid: the finest level the pixel budget holds
        level = int(slide.get("run_level") or 0)
    channel = slide.get("channel")
    if slide.get("kind") == "ome":  # by its OME axes; a channel layer reads its channel
        from napari_attnreg.io.ometiff import open_ome_level

        opened = open_ome_level(path, level=level, mpp=config.mpp, channel=channel)
    elif slide.get("format") == "DICOM WSI":
        from napari_attnreg.io.dicom_wsi import open_dicom_slide

        opened = open_dicom_slide(path, level=level, mpp=config.mpp)
    else:
        opened = open_slide(path, level=level, mpp=config.mpp)  # checks the level / resolution
    image, _info = open_for_run(path, {"tiled": config.tiled, "level": level, "mpp": config.mpp,
                                       "channel": channel})
    grid = _grid(layer, slide, opened)
    # the level read is recorded as slide_level; ``level`` keeps what was asked (a level, or
    # none beside a resolution: both together are refused)
    config = replace(config, level=level if config.mpp is None else None, extra={
        **config.extra, **{k: v for k, v in opened.run_extra().items() if k.startswith("slide_")}})
    return image, grid, config


def _grid(layer: Any, slide: dict[str, Any], opened: Any) -> AnalysedGrid | None:
    """How the pixels read sit on the layer's (None: they are the layer's own)."""
    shown = tuple(int(n) for n in layer.data.shape[:2])  # a pyramid's: level 0's
    analysed = tuple(int(n) for n in opened.analysed_shape)
    if opened.level == slide.get("level") and opened.scale == 1 and analysed == shown:
        return None
    if opened.mpp and slide.get("mpp"):
        factor = (float(opened.mpp) / float(slide["mpp"]),) * 2
    else:  # no pixel size: the ratio of the sizes (a level's size is rounded, < 1 px off)
        factor = (shown[0] / analysed[0], shown[1] / analysed[1])
    # read again (a figure): by level, or by resolution where the level was resampled
    again = ({"mpp": opened.mpp} if opened.scale != 1 else {"level": opened.level})
    if slide.get("channel") is not None:  # a channel layer of an OME pyramid
        again["channel"] = slide["channel"]
    return AnalysedGrid(analysed, factor, {"path": str(slide["path"]), **again})


def saved_grid(layer: Any, result: Any) -> AnalysedGrid | None:
    """How a saved result of a slide (a folder the writer saved, a command-line result file)
    sits on a slide layer that shows another level: None when the result is of the layer's
    own pixels, or the layer is no slide, or the two do not share a unit of length.

    The factor is the ratio of their pixel sizes (the result's ``spatial`` record against the
    layer's scale), so a result of level 2 lies over a pyramid's level-0 pixels.
    """
    slide = slide_of(layer)
    shown = tuple(int(n) for n in layer.data.shape[:2])
    analysed = tuple(int(n) for n in result.image_shape)
    spatial = getattr(result, "spatial", None) or {}
    if slide is None or analysed == shown or not spatial.get("scale"):
        return None
    from napari_attnreg.core.results.figure import length_unit

    units = [length_unit(u) for u in spatial.get("units") or []]
    if None in units or units != [length_unit(u) for u in layer.units[-2:]]:
        return None  # pixels, or another unit: no ratio of sizes to go by
    factor = tuple(float(a) / float(b) for a, b in zip(spatial["scale"], layer.scale[-2:]))
    md = result.metadata
    # the analysed image is the level, less what a tiled run cut to whole patches
    cut = [int(p) for p in getattr(result, "patch_size", (1, 1))]
    if not all(f >= 1 - 1e-6 for f in factor) or any(
            not -f <= m - n * f <= (c + 1) * f
            for n, f, m, c in zip(analysed, factor, shown, cut)):
        return None  # not a level or resolution of this slide
    again = ({"mpp": float(spatial["scale"][0])} if md.get("slide_resample", 1.0) != 1.0
             else {"level": md.get("slide_level")})
    return AnalysedGrid(analysed, (factor[0], factor[1]), {"path": str(slide["path"]), **again})


#: Longest side of the grid a Labels layer's tissue mask is sampled on: a tile's tissue share
#: needs no more, and an image-sized int64 grid of a large layer would be half a gigabyte.
MASK_SIDE = 2048


def mask_layer(viewer: Any, value: Any) -> Any | None:
    """The Labels or Shapes layer the *Tissue mask* option names (None: it names none)."""
    from napari.layers import Labels, Shapes

    if not isinstance(value, str):
        return None
    return next((lay for lay in viewer.layers if isinstance(lay, (Labels, Shapes))
                 and lay.name == value.strip()), None)


def labels_mask(viewer: Any, value: Any, layer: Any, geometry: Any) -> Any:
    """The *Tissue mask* option with a layer's name or a GeoJSON file replaced by its mask.

    A Labels layer (painted tissue, or the tissue layer of an earlier run) or a Shapes layer
    (an outline drawn in napari, or QuPath's annotations opened from GeoJSON) is sampled
    over the image layer's extent through both layers' transforms, so it lines up whatever
    its resolution. A GeoJSON file holds QuPath's outline in the slide's full-resolution
    pixels, placed here on the image layer's own pixels. Other values (``auto``, ``none``,
    a mask image file) pass unchanged.

    Raises
    ------
    ValueError
        The name is neither such a layer nor a file (the message lists the layers), or the
        layer or file marks no tissue over the image.
    """
    if not isinstance(value, str) or value.strip().lower() in ("", "auto", "none"):
        return value
    from napari.layers import Labels, Shapes

    from napari_attnreg._napari.roi_geometry import roi_labels
    from napari_attnreg.core.run.tissue import NamedMask
    from napari_attnreg.io.geojson import geojson_tissue_mask, is_geojson_path

    name = value.strip()
    drawn = [lay for lay in viewer.layers if isinstance(lay, (Labels, Shapes))]
    chosen = mask_layer(viewer, value)
    if chosen is None:
        if is_geojson_path(name) and Path(name).is_file():
            # the layer's first array is the slide level its downsample names (level 0: 1)
            full_per_pixel = float((slide_of(layer) or {}).get("downsample") or 1.0)
            return geojson_tissue_mask(name, geometry.image_shape, full_per_pixel,
                                       slide=slide_of(layer) is not None)
        if Path(name).is_file():
            return value
        from napari_attnreg._napari.layers import META_KEY

        # not the dock's own significant layers and outline: named here, they read as masks
        known = ", ".join(repr(lay.name) for lay in drawn if not (
            isinstance(lay.metadata, dict) and META_KEY in lay.metadata)) or "none is open"
        raise ValueError(f"Tissue mask: {name!r} is neither a Labels or Shapes layer nor a "
                         f"mask file. Give 'auto', 'none', a layer's name ({known}), the path "
                         "of a mask image or a GeoJSON outline from QuPath.")
    h, w = geometry.image_shape
    step = max(1.0, max(h, w) / MASK_SIDE)
    shape = (max(1, round(h / step)), max(1, round(w / step)))
    grid = AnalysedGrid(shape, (h / shape[0], w / shape[1]))
    first = tuple(0 for _ in geometry.stack_axes)
    mask = roi_labels(chosen, grid.place(geometry), first) > 0
    kind = "Shapes" if isinstance(chosen, Shapes) else "Labels"
    if not mask.any():
        what = "paint the tissue (any label above 0)" if kind == "Labels" else \
            "draw the tissue's outline as polygons"
        raise ValueError(f"The {kind} layer {name!r} marks no tissue over {layer.name!r}; "
                         f"{what} or choose 'auto' or 'none'.")
    return NamedMask(mask, f"{kind} layer {name!r}")


def place_on_slide(shapes: Any, slide_layer: Any) -> bool:
    """Lay a Shapes layer read from GeoJSON (full-resolution pixels, QuPath's frame) over an
    image layer, in its scale and units: a slide shown at any level, or any other image (its
    own pixels); True when it was placed.

    Full-resolution pixel centre ``c`` lies at ``(c − (k − 1)/2)/k`` pixels of a level
    downsampled ``k`` times (``k`` = 1 off a slide). Only a layer still where the reader put
    it is moved, and only over an image placed by scale and translate alone.
    """
    import numpy as np

    slide = slide_of(slide_layer) or {}
    meta = shapes.metadata.get("geojson") if isinstance(shapes.metadata, dict) else None
    if not isinstance(meta, dict) or meta.get("placed") or shapes.ndim != 2:
        return False
    if not (np.allclose(shapes.scale, 1.0) and np.allclose(shapes.translate, 0.0)):
        return False  # moved by the analyst (or a script): theirs
    if not np.allclose(slide_layer.affine.affine_matrix, np.eye(slide_layer.ndim + 1)) \
            or not np.allclose(slide_layer.rotate, np.eye(slide_layer.ndim)) \
            or not np.allclose(slide_layer.shear, 0.0):
        return False  # a rotated or sheared image: its pixels are no scaled grid
    k = float(slide.get("downsample") or 1.0)
    scale = np.asarray(slide_layer.scale[-2:], dtype=float) / k
    shapes.scale = tuple(scale)
    shapes.translate = tuple(np.asarray(slide_layer.translate[-2:], dtype=float)
                             - (k - 1) / 2 * scale)
    shapes.units = tuple(slide_layer.units[-2:])
    meta["placed"] = slide_layer.name
    return True
