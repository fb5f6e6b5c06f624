"""ROI layers (Shapes or Labels) as integer labels on the input image's own pixel grid.

Whatever the ROI layer's scale/translate, each ROI lands on the image's pixels, and the
statistics are the core's :func:`~napari_attnreg.core.stats.roi.roi_table`, never recomputed here.
On an image plane larger than :data:`LABEL_IMAGE_PIXELS` (a slide analysed at full
resolution: 50,000² pixels, a 20 GB label image) shapes are measured as polygons instead
(:func:`~napari_attnreg.core.stats.roi.polygon_roi_table`, the same rows); a Labels layer
is refused above :data:`MAX_LABELS_LAYER_PIXELS`, saying to draw shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_attnreg._napari.geometry import SourceGeometry
from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg.core.stats.roi import (
    PolygonTokens,
    polygon_roi_table,
    polygon_tokens,
    roi_table,
    um2_per_pixel_of,
)

PlaneIndex = tuple[int, ...]
#: Largest image plane (pixels) whose shapes become a label image (int64: 128 MiB here);
#: above it they are measured as polygons, with the same rows.
LABEL_IMAGE_PIXELS = 4096 * 4096
#: Largest image plane (pixels) a Labels layer's ROIs are measured on: they are resampled
#: onto it, and the table's temporaries take about :data:`LABELS_BYTES_PER_PIXEL` each.
MAX_LABELS_LAYER_PIXELS = 16384 * 16384
#: What the Labels path holds a pixel: its int64 labels, one ROI's mask, the core's float64
#: coverage weights and int64 token index.
LABELS_BYTES_PER_PIXEL = 25


def _axis_map(src: SourceGeometry, layer: Any, src_axis: int) -> tuple[float, float]:
    """(a, b) with ``roi_index = a·src_index + b`` along one axis (scale/translate only)."""
    roi_axis = src_axis - src.ndim + layer.ndim
    s0, t0 = src.scale[src_axis], src.translate[src_axis]
    s1, t1 = float(layer.scale[roi_axis]), float(layer.translate[roi_axis])
    return s0 / s1, (t0 - t1) / s1


def _check_plain_transform(src: SourceGeometry, layer: Any) -> None:
    eye = np.eye(layer.ndim)
    plain = (np.allclose(layer.rotate, eye) and np.allclose(np.asarray(layer.shear), 0)
             and np.allclose(layer.affine.affine_matrix, np.eye(layer.ndim + 1))
             and np.allclose(src.rotate, np.eye(src.ndim)) and np.allclose(src.shear, 0)
             and np.allclose(src.affine, np.eye(src.ndim + 1)))
    if not plain:
        raise ValueError(f"ROI layer {layer.name!r} or the image is rotated, sheared or has an "
                         "affine transform; ROIs need plain scale/translate layers.")


def _roi_lead_index(src: SourceGeometry, layer: Any, plane: PlaneIndex) -> tuple[int, ...] | None:
    """Index along the ROI layer's own leading axes for one source plane (None: outside)."""
    lead = layer.ndim - 2
    full = [0] * src.ndim
    for axis, i in zip(src.stack_axes, plane):
        full[axis] = i
    index = []
    for roi_axis in range(lead):
        src_axis = roi_axis + src.ndim - layer.ndim
        if src_axis < 0:
            return None  # the ROI layer has more axes than the image: ambiguous
        a, b = _axis_map(src, layer, src_axis)
        index.append(round(a * full[src_axis] + b))
    return tuple(index)


def labels_roi_on_image(layer: Any, src: SourceGeometry, plane: PlaneIndex) -> np.ndarray:
    """A Labels layer's ROIs resampled (nearest) onto one plane of the image's pixel grid."""
    _check_plain_transform(src, layer)
    h, w = src.image_shape
    out = np.zeros((h, w), dtype=np.int64)
    lead = _roi_lead_index(src, layer, plane)
    if lead is None:
        raise ValueError(f"ROI layer {layer.name!r} has more axes than the image.")
    data = layer.data[0] if getattr(layer, "multiscale", False) else layer.data
    if any(not 0 <= i < n for i, n in zip(lead, data.shape)):
        return out
    plane_data = np.asarray(data[lead]) if lead else np.asarray(data)
    coords = []
    for src_axis, n_src in ((src.ndim - 2, h), (src.ndim - 1, w)):
        a, b = _axis_map(src, layer, src_axis)
        coords.append(np.rint(a * np.arange(n_src) + b).astype(np.int64))
    rows, cols = coords
    ok_r = (rows >= 0) & (rows < plane_data.shape[0])
    ok_c = (cols >= 0) & (cols < plane_data.shape[1])
    out[np.ix_(ok_r, ok_c)] = plane_data[np.ix_(rows[ok_r], cols[ok_c])]
    return out


def _plane_shapes(layer: Any, src: SourceGeometry, plane: PlaneIndex
                  ) -> tuple[list[np.ndarray], list[str], list[int]]:
    """The shapes of ``layer`` on one plane: (row, col) vertices in the image's pixels, their
    types and ROI ids (shape i → id i + 1)."""
    _check_plain_transform(src, layer)
    full = np.zeros(src.ndim)
    for axis, i in zip(src.stack_axes, plane):
        full[axis] = i
    scale = np.asarray(layer.scale, dtype=float)
    translate = np.asarray(layer.translate, dtype=float)
    keep_data, keep_types, ids = [], [], []
    for i, (verts, kind) in enumerate(zip(layer.data, layer.shape_type)):
        world = np.asarray(verts, dtype=float) * scale + translate
        src_axes = np.arange(layer.ndim) + src.ndim - layer.ndim
        if np.any(src_axes < 0):
            raise ValueError(f"ROI layer {layer.name!r} has more axes than the image.")
        src_scale = np.asarray(src.scale)[src_axes]
        src_translate = np.asarray(src.translate)[src_axes]
        pix = (world - src_translate) / src_scale
        lead_ok = all(
            np.all(np.rint(pix[:, k]) == full[src_axes[k]])
            for k in range(layer.ndim - 2) if src_axes[k] in src.stack_axes
        )
        if lead_ok:
            keep_data.append(pix[:, -2:])
            keep_types.append(kind)
            ids.append(i + 1)
    return keep_data, keep_types, ids


def shapes_roi_on_image(layer: Any, src: SourceGeometry, plane: PlaneIndex) -> np.ndarray:
    """A Shapes layer's shapes as labels (shape i → id i+1) on one plane of the image grid.

    Vertices go shapes-data → world → image-data; shapes of an nD layer count on the planes
    they lie on, those of a 2D layer on every plane. Rasterised by napari's ``to_labels``.
    """
    from napari.layers import Shapes

    h, w = src.image_shape
    keep_data, keep_types, ids = _plane_shapes(layer, src, plane)
    if not keep_data:
        return np.zeros((h, w), dtype=np.int64)
    temp = Shapes(keep_data, shape_type=keep_types)
    temp_labels = temp.to_labels(labels_shape=(h, w)).astype(np.int64)
    lut = np.concatenate([[0], ids]).astype(np.int64)
    return lut[temp_labels]


def shapes_roi_polygons(layer: Any, src: SourceGeometry, plane: PlaneIndex
                        ) -> tuple[list[np.ndarray], list[int]]:
    """A Shapes layer's shapes on one plane as polygons in the image's pixels and their ids,
    in the order napari's ``to_labels`` paints them (the polygon its masks are filled from:
    an ellipse's outline points), so :func:`~napari_attnreg.core.stats.roi.polygon_roi_table`
    gives the rows of :func:`shapes_roi_on_image`'s labels without that image.

    Raises
    ------
    ValueError
        A line or path (no area; its labels are drawn along it, not filled).
    """
    from napari.layers import Shapes

    keep_data, keep_types, ids = _plane_shapes(layer, src, plane)
    if not keep_data:
        return [], []
    temp = Shapes(keep_data, shape_type=keep_types)
    view = temp._data_view  # napari's own shapes: what to_labels fills, in its order
    polygons, labels = [], []
    for k in view._z_order[::-1]:
        shape = view.shapes[k]
        if not shape._filled:
            raise ValueError(
                f"Shape {ids[k]} of {layer.name!r} is a {keep_types[k]}, which has no area; "
                "draw regions as rectangles, ellipses or polygons.")
        verts = shape._face_vertices if shape._use_face_vertices else shape.data_displayed
        polygons.append(np.asarray(verts, dtype=np.float64))
        labels.append(ids[k])
    return polygons, labels


def roi_labels(layer: Any, src: SourceGeometry, plane: PlaneIndex) -> np.ndarray:
    """Integer ROI labels on one plane of the image's pixel grid, from Shapes or Labels."""
    from napari.layers import Labels, Shapes

    if isinstance(layer, Shapes):
        return shapes_roi_on_image(layer, src, plane)
    if isinstance(layer, Labels):
        return labels_roi_on_image(layer, src, plane)
    raise ValueError(f"Layer {layer.name!r} is neither Shapes nor Labels; draw ROIs in one of "
                     "those.")


def _too_large_for_labels(layer: Any, src: SourceGeometry) -> str:
    h, w = src.image_shape
    return (f"ROI layer {layer.name!r} is a Labels layer, and this result covers {h}×{w} "
            f"pixels: measuring its labels on them would take about "
            f"{h * w * LABELS_BYTES_PER_PIXEL / 2**30:.0f} GB (at most "
            f"{MAX_LABELS_LAYER_PIXELS:,} pixels). Draw the ROIs in a Shapes layer (measured "
            "as polygons at any size), or run at a coarser level or resolution.")


@dataclass(frozen=True)
class RoiPlane:
    """What one plane's ROI rows are computed from, read off the layer: the plane's result
    and its ROIs, as polygons and ids (a plane too large for a label image) or labels."""

    plane: PlaneIndex
    result: Any
    polygons: list[np.ndarray] | None = None
    ids: list[int] | None = None
    labels: np.ndarray | None = None
    #: µm² per pixel where the image layer lies now (NaN: no physical size; None: the run's)
    um2_per_pixel: float | None = None


def _cached_polygons(layer: Any, src: SourceGeometry, plane: PlaneIndex, cache: dict | None
                     ) -> tuple[list[np.ndarray], list[int]]:
    """:func:`shapes_roi_polygons`, kept in ``cache`` while the shapes and both layers' placing
    stay: napari triangulates every shape of the copy it is read from (0.5 s for four drawn
    regions of 400 vertices), on the GUI thread, at every threshold move."""
    if cache is None:
        return shapes_roi_polygons(layer, src, plane)
    _check_plain_transform(src, layer)
    key = ("polygons", id(layer), plane, src.shape, src.scale, src.translate,
           tuple(np.asarray(layer.scale, dtype=float)),
           tuple(np.asarray(layer.translate, dtype=float)), tuple(layer.shape_type),
           tuple(int(z) for z in layer.z_index),
           tuple((np.shape(d), np.asarray(d, dtype=float).tobytes()) for d in layer.data))
    found = cache.get(key)
    if found is None:
        found = cache[key] = shapes_roi_polygons(layer, src, plane)
    return found


def roi_planes(record: RunRecord, layer: Any, cache: dict | None = None) -> list[RoiPlane]:
    """Read the ROIs of ``layer`` for every computed plane of ``record`` (call it where the
    layer lives, napari's GUI thread: :func:`planes_roi_rows` may then run on any thread).

    ``cache`` (the one :func:`planes_roi_rows` takes) keeps a large plane's polygons.
    """
    from napari.layers import Shapes

    h, w = record.geometry.image_shape
    large = h * w > LABEL_IMAGE_PIXELS and isinstance(layer, Shapes)
    if h * w > MAX_LABELS_LAYER_PIXELS and not isinstance(layer, Shapes):
        raise ValueError(_too_large_for_labels(layer, record.geometry))
    # the image layer as placed now: a pixel size set after the run counts (the result
    # records the one at run time)
    um2 = um2_per_pixel_of(record.geometry.spatial())
    planes = []
    for plane in sorted(record.results):
        # the thresholds chosen for this image travel as the result's own (q_th and "no z
        # mask" included): the table of the selected image uses its thresholds, not another's
        result = record.shown(plane)
        if large:
            polygons, ids = _cached_polygons(layer, record.geometry, plane, cache)
            planes.append(RoiPlane(plane, result, polygons=polygons, ids=ids,
                                   um2_per_pixel=um2))
        else:
            planes.append(RoiPlane(plane, result, um2_per_pixel=um2,
                                   labels=roi_labels(layer, record.geometry, plane)))
    return planes


def planes_roi_rows(planes: list[RoiPlane],
                    cache: dict[tuple, list[PolygonTokens]] | None = None) -> list[dict]:
    """The core's ROI table of every plane of :func:`roi_planes` (stacks: a ``plane`` column).

    ``cache`` keeps a large plane's polygon tokens between calls (a threshold move changes
    the rows, not the regions' tokens); the caller owns it (a dict, or None).
    """
    rows: list[dict] = []
    for item in planes:
        result, plane = item.result, item.plane
        if item.polygons is not None:
            polygons, ids = item.polygons, list(item.ids or [])
            key = (plane, tuple(result.image_shape), result.grid_shape, result.token_scale,
                   tuple(ids), tuple(v.tobytes() for v in polygons))
            tokens = None if cache is None else cache.get(key)
            if tokens is None:
                tokens = polygon_tokens(result, polygons)
                if cache is not None:
                    if len(cache) > 8 * len(planes):
                        cache.clear()  # shapes edited since: old keys would only pile up
                    cache[key] = tokens
            table = polygon_roi_table(result, polygons, labels=ids, tokens=tokens)
        else:
            table = roi_table(result, item.labels)
        for row in table:
            if item.um2_per_pixel is not None:
                row["area_um2"] = row["area_px"] * item.um2_per_pixel
            rows.append({"plane": list(plane), **row} if plane else row)
    return rows


def record_roi_rows(record: RunRecord, layer: Any,
                    cache: dict[tuple, list[PolygonTokens]] | None = None) -> list[dict]:
    """The core's ROI table for every computed plane of ``record`` (stacks: a ``plane`` column).

    ``cache`` keeps a large plane's polygon tokens between calls (a threshold move changes
    the rows, not the regions' tokens); the caller owns it.
    """
    return planes_roi_rows(roi_planes(record, layer, cache), cache)
