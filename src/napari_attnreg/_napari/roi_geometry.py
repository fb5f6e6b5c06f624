"""ROI layers (Shapes or Labels) as integer labels on the input image's own pixel grid.

Whatever the ROI layer's scale/translate, each ROI lands on the image's pixels, and the
statistics are the core's :func:`~napari_attnreg.core.stats.roi.roi_table`, never recomputed here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from napari_attnreg._napari.geometry import SourceGeometry
from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg.core.stats.roi import roi_table

PlaneIndex = tuple[int, ...]


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


def shapes_roi_on_image(layer: Any, src: SourceGeometry, plane: PlaneIndex) -> np.ndarray:
    """A Shapes layer's shapes as labels (shape i → id i+1) on one plane of the image grid.

    Vertices go shapes-data → world → image-data; shapes of an nD layer count on the planes
    they lie on, those of a 2D layer on every plane. Rasterised by napari's ``to_labels``.
    """
    from napari.layers import Shapes

    _check_plain_transform(src, layer)
    h, w = src.image_shape
    if len(layer.data) == 0:
        return np.zeros((h, w), dtype=np.int64)
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
    if not keep_data:
        return np.zeros((h, w), dtype=np.int64)
    temp = Shapes(keep_data, shape_type=keep_types)
    temp_labels = temp.to_labels(labels_shape=(h, w)).astype(np.int64)
    lut = np.concatenate([[0], ids]).astype(np.int64)
    return lut[temp_labels]


def roi_labels(layer: Any, src: SourceGeometry, plane: PlaneIndex) -> np.ndarray:
    """Integer ROI labels on one plane of the image's pixel grid, from Shapes or Labels."""
    from napari.layers import Labels, Shapes

    if isinstance(layer, Shapes):
        return shapes_roi_on_image(layer, src, plane)
    if isinstance(layer, Labels):
        return labels_roi_on_image(layer, src, plane)
    raise ValueError(f"Layer {layer.name!r} is neither Shapes nor Labels; draw ROIs in one of "
                     "those.")


def record_roi_rows(record: RunRecord, layer: Any) -> list[dict]:
    """The core's ROI table for every computed plane of ``record`` (stacks: a ``plane`` column)."""
    rows: list[dict] = []
    for plane in sorted(record.results):
        labels = roi_labels(layer, record.geometry, plane)
        # the thresholds chosen for this image travel as the result's own (q_th and "no z
        # mask" included): the table of the selected image uses its thresholds, not another's
        for row in roi_table(record.shown(plane), labels):
            rows.append({"plane": list(plane), **row} if plane else row)
    return rows
