"""Regions of interest drawn in the notebook: shapes → integer labels on the original image.

Shapes arrive in image coordinates with pixel centres at integers (what ``imshow`` with
``extent=(-0.5, W-0.5, H-0.5, -0.5)`` reports), so a pixel belongs to a shape when its
centre lies inside it — the same rule napari uses to rasterise Shapes to Labels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from skimage.draw import polygon as _fill_polygon


def rectangle_vertices(y0: float, x0: float, y1: float, x1: float) -> np.ndarray:
    """``(4, 2)`` (row, col) corners of an axis-aligned rectangle given by two corners."""
    top, bottom = sorted((float(y0), float(y1)))
    left, right = sorted((float(x0), float(x1)))
    return np.array([[top, left], [top, right], [bottom, right], [bottom, left]])


def polygon_mask(vertices: Sequence[Sequence[float]], shape: tuple[int, int]) -> np.ndarray:
    """Boolean mask of the pixels whose centres lie inside a polygon of (row, col) vertices.

    Raises
    ------
    ValueError
        Fewer than three vertices, or a polygon that covers no pixel centre.
    """
    verts = np.asarray(vertices, dtype=np.float64)
    if verts.ndim != 2 or verts.shape[1] != 2 or len(verts) < 3:
        raise ValueError("A region needs at least three (row, col) vertices.")
    rr, cc = _fill_polygon(verts[:, 0], verts[:, 1], shape=shape)
    mask = np.zeros(shape, dtype=bool)
    mask[rr, cc] = True
    if not mask.any():
        raise ValueError("The region covers no pixel centre; draw a larger region.")
    return mask


def add_region(labels: np.ndarray, mask: np.ndarray) -> int:
    """Paint ``mask`` into ``labels`` (in place) with the next free id; return that id.

    A later region is drawn over an earlier one where they overlap, as in a paint program.
    """
    new_id = int(labels.max()) + 1 if labels.size else 1
    labels[np.asarray(mask, dtype=bool)] = new_id
    return new_id


def as_labels(roi: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """A user's ROI (boolean mask or integer labels) as an int32 label image of ``shape``.

    Raises
    ------
    ValueError
        Wrong shape or a non-integer, non-boolean array.
    """
    arr = np.asarray(roi)
    if arr.shape != tuple(shape):
        raise ValueError(f"The ROI has shape {arr.shape} but the image plane is {tuple(shape)}; "
                         "pass a mask or label image of the same height and width.")
    if arr.dtype == bool:
        return arr.astype(np.int32)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"The ROI must be a boolean mask or an integer label image, got dtype "
                         f"{arr.dtype}.")
    if arr.size and arr.min() < 0:
        raise ValueError("ROI labels must be >= 0 (0 is background).")
    return arr.astype(np.int32)


def region_mask(shape: tuple[int, int], *, rectangle: Sequence[float] | None = None,
                polygon: Sequence[Sequence[float]] | None = None,
                mask: np.ndarray | None = None) -> np.ndarray:
    """One region given as exactly one of a rectangle, a polygon or a mask, as a boolean mask.

    Parameters
    ----------
    shape : (H, W)
        The image plane.
    rectangle : (row0, col0, row1, col1), optional
        Two opposite corners in pixel coordinates.
    polygon : sequence of (row, col), optional
    mask : (H, W) bool, optional

    Raises
    ------
    ValueError
        Not exactly one of them, or a region that covers no pixel.
    """
    if sum(v is not None for v in (rectangle, polygon, mask)) != 1:
        raise ValueError("Give exactly one of rectangle=, polygon= or mask=.")
    if rectangle is not None:
        return polygon_mask(rectangle_vertices(*rectangle), shape)
    if polygon is not None:
        return polygon_mask(polygon, shape)
    return as_labels(mask, shape) > 0


def on_result(vertices: np.ndarray, ratio: float) -> np.ndarray:
    """(row, col) vertices of a slide's picture in the pixels of a result with ``ratio`` of
    its pixels per picture pixel (a level-1 result over a level-0 picture: 0.5).

    Both frames start at the same corner and pixel centres lie at whole numbers, so a
    picture pixel's edges (``p ± 0.5``) land on the result's ``(p ± 0.5)·ratio − 0.5``.
    """
    return (np.asarray(vertices, dtype=np.float64) + 0.5) * float(ratio) - 0.5


def polygons_to_labels(polygons: Sequence[np.ndarray], shape: tuple[int, int]) -> np.ndarray:
    """Polygon ``i`` (``(n, 2)`` (row, col)) as label ``i + 1`` of an int32 image of ``shape``,
    pixel centres inside (a later polygon drawn over an earlier one, as :func:`add_region`);
    a polygon that covers no pixel centre of ``shape`` leaves its label out."""
    labels = np.zeros(shape, dtype=np.int32)
    for label, verts in enumerate(polygons, start=1):
        verts = np.asarray(verts, dtype=np.float64)
        rr, cc = _fill_polygon(verts[:, 0], verts[:, 1], shape=shape)
        labels[rr, cc] = label
    return labels


def polygons_on_grid(polygons: Sequence[np.ndarray], rows: np.ndarray,
                     cols: np.ndarray) -> np.ndarray:
    """Labels (as :func:`polygons_to_labels`) at the pixels ``rows × cols`` of the picture
    only: a display grid over a slide, whose full label image would be as large as it."""
    from skimage.measure import points_in_poly

    rr, cc = np.meshgrid(np.asarray(rows, dtype=np.float64), np.asarray(cols, dtype=np.float64),
                         indexing="ij")
    points = np.column_stack([rr.ravel(), cc.ravel()])
    labels = np.zeros(rr.size, dtype=np.int32)
    for label, verts in enumerate(polygons, start=1):
        labels[points_in_poly(points, np.asarray(verts, dtype=np.float64))] = label
    return labels.reshape(rr.shape)


def check_on_picture(vertices: Sequence[Sequence[float]], shape: tuple[int, int]) -> np.ndarray:
    """A region drawn on a slide's picture of ``shape`` as ``(n, 2)`` vertices, checked
    without rasterizing the slide.

    Raises
    ------
    ValueError
        Fewer than three vertices, or a region with no area on the picture.
    """
    from shapely.geometry import Polygon, box

    verts = np.asarray(vertices, dtype=np.float64)
    if verts.ndim != 2 or verts.shape[1] != 2 or len(verts) < 3:
        raise ValueError("A region needs at least three (row, col) vertices.")
    h, w = shape
    inside = Polygon(verts[:, ::-1]).buffer(0).intersection(box(-0.5, -0.5, w - 0.5, h - 0.5))
    if inside.area <= 0:
        raise ValueError("The region covers none of the slide; draw it on the slide.")
    return verts


def full_resolution(vertices: np.ndarray, downsample: float) -> np.ndarray:
    """(row, col) vertices of a picture whose pixels span ``downsample`` full-resolution
    (level 0) pixels, as ``(x, y)`` in QuPath's frame: full-resolution pixels with the
    slide's top-left corner at (0, 0) (:mod:`napari_attnreg.io.geojson`)."""
    return (np.asarray(vertices, dtype=np.float64)[:, ::-1] + 0.5) * float(downsample)
