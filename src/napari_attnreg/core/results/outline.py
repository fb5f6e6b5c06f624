"""Significant patches as polygons: the outline the front ends draw and GeoJSON exports.

A boolean token grid becomes the union of its patches' squares (shapely), so neighbouring
patches merge into one region and a region's holes stay holes. Coordinates are token-grid
units with a token's centre at its integer index, as a token-grid image layer places its
pixels; :func:`to_pixels` maps them onto the image's pixels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from shapely import MultiPolygon, Polygon, box
from shapely.affinity import affine_transform
from shapely.ops import unary_union


def mask_regions(mask: np.ndarray) -> list[Polygon]:
    """The connected regions of a 2-D boolean token grid, one polygon each (holes kept).

    Token ``(r, c)`` covers ``[c - 0.5, c + 0.5] x [r - 0.5, r + 0.5]`` in ``(x, y)`` token
    units. Patches touching only at a corner stay separate regions.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 2:
        raise ValueError(f"mask_regions takes a 2-D token grid, got shape {mask.shape}.")
    rows, cols = np.nonzero(mask)
    squares = [box(c - 0.5, r - 0.5, c + 0.5, r + 0.5) for r, c in zip(rows, cols)]
    union = unary_union(squares) if squares else MultiPolygon()
    parts = list(union.geoms) if isinstance(union, MultiPolygon) else [union]
    # simplify(0) drops the collinear vertices the union leaves between merged squares
    return [p.simplify(0) for p in parts if not p.is_empty]


def outline_rings(mask: np.ndarray) -> list[np.ndarray]:
    """Every boundary ring (outer edges and holes) of the regions, as closed ``(n, 2)``
    arrays of ``(row, col)`` token coordinates, the vertex order napari's shapes use."""
    rings = []
    for region in mask_regions(mask):
        for ring in (region.exterior, *region.interiors):
            xy = np.asarray(ring.coords)
            rings.append(xy[:, ::-1].copy())
    return rings


def to_pixels(region: Polygon, token_size: Sequence[float],
              token_origin: Sequence[float] = (0.0, 0.0)) -> Polygon:
    """``region`` in image pixel coordinates: ``(x, y)`` with the image's top-left corner
    at 0 (QuPath's convention).

    ``token_size`` is a token's ``(height, width)`` in pixels and ``token_origin`` the
    ``(row, col)`` pixel of the grid's top-left corner (0 unless the grid was cropped).
    """
    sy, sx = (float(s) for s in token_size)
    oy, ox = (float(o) for o in token_origin)
    # token centre c sits at pixel (c + 0.5) * size, its edges at c * size and (c + 1) * size
    return affine_transform(region, [sx, 0.0, 0.0, sy, ox + 0.5 * sx, oy + 0.5 * sy])
