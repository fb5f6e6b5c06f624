"""The array forms of the tile bookkeeping equal the per-tile loops they replaced, bit for bit.

The loops are kept here, as they were, as the slow references: a whole slide has hundreds of
thousands of tiles, which the loops took seconds (and gigabytes of image-grid scratch) for.
"""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg.core.run.tiling import TileLayout, make_layout, run_tiles
from napari_attnreg.core.run.tissue import _span, tiles_in_tissue


def reference_tile_tokens(layout: TileLayout) -> np.ndarray:
    """The per-tile loop of ``TileLayout.tile_tokens``."""
    tgh, tgw = layout.tile_grid
    gw = layout.grid_shape[1]
    rows = []
    for index in range(layout.n_tiles):
        y, x = layout.origin(index)
        ty, tx = y // layout.patch[0], x // layout.patch[1]
        rows.append(((ty + np.arange(tgh))[:, None] * gw + tx + np.arange(tgw)[None, :]).ravel())
    return np.stack(rows)


def reference_run_tiles(layout: TileLayout, keep: np.ndarray) -> dict[str, np.ndarray]:
    """The per-tile loop of ``run_tiles`` for a subset of tiles (image-grid scratch arrays)."""
    n_image = layout.grid_shape[0] * layout.grid_shape[1]
    gh, gw = layout.grid_shape
    tgh, tgw = layout.tile_grid
    (ph, pw), (th, tw) = layout.patch, layout.tile
    best = np.full((gh, gw), np.inf)
    owner = np.full((gh, gw), -1, dtype=np.int64)
    corner = np.zeros((gh, gw, 2), dtype=np.int64)
    order = np.flatnonzero(keep)
    for rank, index in enumerate(order):
        y, x = layout.origin(int(index))
        ty, tx = y // ph, x // pw
        dy = np.abs((np.arange(tgh) + 0.5) * ph - th / 2)
        dx = np.abs((np.arange(tgw) + 0.5) * pw - tw / 2)
        distance = dy[:, None] + dx[None, :]
        block = (slice(ty, ty + tgh), slice(tx, tx + tgw))
        nearer = distance < best[block]
        best[block] = np.where(nearer, distance, best[block])
        owner[block] = np.where(nearer, rank, owner[block])
        corner[block] = np.where(nearer[..., None], (ty, tx), corner[block])
    tested = np.flatnonzero(owner.ravel() >= 0)
    gy, gx = np.divmod(tested, gw)
    local = (gy - corner.reshape(-1, 2)[tested, 0]) * tgw + gx - corner.reshape(-1, 2)[tested, 1]
    inverse = np.full(n_image, -1, dtype=np.int64)
    inverse[tested] = np.arange(tested.size)
    return {"order": order, "tested": tested, "family": owner.ravel()[tested], "local": local,
            "family_tokens": inverse[reference_tile_tokens(layout)[order]]}


def reference_tiles_in_tissue(mask: np.ndarray, layout: TileLayout,
                              fraction: float) -> np.ndarray:
    """The per-tile loop of ``tiles_in_tissue`` (after its proportion check)."""
    mh, mw = mask.shape
    h, w = layout.shape
    table = np.zeros((mh + 1, mw + 1))
    table[1:, 1:] = np.cumsum(np.cumsum(mask, axis=0, dtype=np.float64), axis=1)
    keep = np.zeros(layout.n_tiles, dtype=bool)
    th, tw = layout.tile
    for index in range(layout.n_tiles):
        y, x = layout.origin(index)
        y0, y1 = _span(y, th, h, mh)
        x0, x1 = _span(x, tw, w, mw)
        inside = table[y1, x1] - table[y0, x1] - table[y1, x0] + table[y0, x0]
        keep[index] = inside >= fraction * (y1 - y0) * (x1 - x0)
    return keep


LAYOUTS = [
    ((96, 96), (32, 32), (8, 8), 0),
    ((304, 200), (128, 128), (8, 8), 32),
    ((448, 656), (128, 128), (8, 8), 32),
    ((224, 448), (224, 224), (16, 16), 48),
    ((64, 64), (128, 128), (8, 8), 32),  # smaller than one tile
    ((480, 352), (96, 64), (16, 16), 16),  # a non-square tile
]


@pytest.mark.parametrize("shape, tile, patch, overlap", LAYOUTS)
def test_tile_tokens_equal_the_per_tile_loop(shape, tile, patch, overlap):
    layout = make_layout(shape, tile=tile, patch=patch, overlap=overlap)
    expected = reference_tile_tokens(layout)
    got = layout.tile_tokens()
    assert got.dtype == expected.dtype and np.array_equal(got, expected)
    some = np.array([layout.n_tiles - 1, 0, layout.n_tiles // 2])
    assert np.array_equal(layout.tile_tokens(some), expected[some])


@pytest.mark.parametrize("shape, tile, patch, overlap", LAYOUTS)
@pytest.mark.parametrize("share", [0.15, 0.5, 0.9])
def test_run_tiles_of_a_subset_equal_the_per_tile_loop(shape, tile, patch, overlap, share):
    layout = make_layout(shape, tile=tile, patch=patch, overlap=overlap)
    rng = np.random.default_rng(int(share * 100) + layout.n_tiles)
    keep = rng.random(layout.n_tiles) < share
    keep[rng.integers(layout.n_tiles)] = True  # at least one tile
    if keep.all():
        keep[0] = layout.n_tiles == 1
    expected = reference_run_tiles(layout, keep)
    got = run_tiles(layout, keep)
    for name, value in expected.items():
        mine = getattr(got, name)
        assert mine.dtype == value.dtype and np.array_equal(mine, value), name


def test_run_tiles_of_a_blob_of_tiles_equal_the_per_tile_loop():
    """A connected region (a tissue mask's shape), where ties between centres are common."""
    layout = make_layout((1024, 1024), tile=(128, 128), patch=(8, 8), overlap=32)
    ny, nx = len(layout.starts[0]), len(layout.starts[1])
    yy, xx = np.mgrid[:ny, :nx]
    keep = ((yy - 4) ** 2 + (xx - 6) ** 2 <= 12).ravel()
    expected = reference_run_tiles(layout, keep)
    got = run_tiles(layout, keep)
    for name, value in expected.items():
        assert np.array_equal(getattr(got, name), value), name


@pytest.mark.parametrize("mask_shape", [(37, 41), (128, 128), (300, 300)])
@pytest.mark.parametrize("fraction", [0.1, 0.37])
def test_tiles_in_tissue_equals_the_per_tile_loop(mask_shape, fraction):
    layout = make_layout((1000, 1000), tile=(128, 128), patch=(8, 8), overlap=32)
    rng = np.random.default_rng(mask_shape[0])
    mask = rng.random(mask_shape) < 0.3
    mask[: mask_shape[0] // 3, : mask_shape[1] // 2] = True
    expected = reference_tiles_in_tissue(mask, layout, fraction)
    assert np.array_equal(tiles_in_tissue(mask, layout, fraction), expected)
