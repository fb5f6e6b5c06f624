"""The tokens a tiled run with a tissue mask tested, from what its result records.

A tiled run with a tissue mask runs only its tissue tiles; the tokens no tissue tile holds
(glass) were never run. A result records which tiles were run (``tissue_tiles`` among its
summaries) and where every tile lies (``tile_origins_y``, ``tile_origins_x`` and
``tile_shape`` in its metadata), so the tested tokens are derived from those records, never
listed (a slide has millions of tokens). Both the result file's reader (which accepts NaN
statistics there only) and the front ends (which leave glass uncovered) read them here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def tissue_token_grid(tiles: Any, metadata: Mapping[str, Any], patch_size: tuple[int, int],
                      grid_shape: tuple[int, int], glass: Any = None) -> np.ndarray | None:
    """Boolean ``grid_shape`` map of the tokens the run tiles ``tiles`` hold and measured
    (all but the ``glass`` tokens of those tiles).

    Parameters
    ----------
    tiles : array of bool, optional
        ``(n_tiles,)`` the tiles that were run (the result's ``tissue_tiles``), in C order
        over the tile origins.
    metadata : mapping
        The result's metadata: ``tile_origins_y``, ``tile_origins_x`` (pixels) and
        ``tile_shape`` (pixels).
    patch_size, grid_shape : (int, int)
    glass : array of int, optional
        Flat tokens of run tiles that the run left out as glass by its mask (the result's
        ``tissue_glass_tokens``; files of earlier versions have none).

    Returns
    -------
    np.ndarray of bool, or None for a run without a tissue mask or records that do not
    describe the tiles of this grid (a file from before the records, or an edited one).
    """
    ys, xs, shape = (metadata.get(k) for k in ("tile_origins_y", "tile_origins_x",
                                                "tile_shape"))
    if tiles is None or not (_ints(ys) and _ints(xs) and _ints(shape) and len(shape) == 2):
        return None
    run = np.asarray(tiles)
    if run.size != len(ys) * len(xs) or run.dtype.kind not in "biu":
        return None
    (ph, pw), (th, tw), (gh, gw) = patch_size, shape, grid_shape
    if min(ph, pw, th, tw) < 1:
        return None
    rows, cols = np.asarray(ys, np.int64) // ph, np.asarray(xs, np.int64) // pw
    # a run's tile origins rise strictly inside the grid (which also bounds the work below
    # for an edited file): others are not this grid's records
    for starts, size in ((rows, gh), (cols, gw)):
        if starts[0] < 0 or starts[-1] >= size or np.any(np.diff(starts) <= 0):
            return None
    run = run.reshape(len(ys), len(xs)).astype(bool)
    tested = np.zeros(grid_shape, dtype=bool)
    # one row of tiles at a time: the union of its run tiles' column spans (a slide's
    # 35,000 run tiles in 70 ms one by one), then its band of token rows
    for r in np.flatnonzero(run.any(axis=1)):
        first = cols[run[r]]
        edges = np.zeros(gw + 1, dtype=np.int64)
        np.add.at(edges, first, 1)
        np.add.at(edges, np.minimum(first + tw // pw, gw), -1)
        tested[rows[r]:rows[r] + th // ph] |= np.cumsum(edges[:gw]) > 0
    left_out = np.asarray(glass if glass is not None else [], dtype=np.int64).reshape(-1)
    if left_out.size and (np.asarray(glass).dtype.kind not in "iu" or left_out.min() < 0
                          or left_out.max() >= tested.size):
        return None  # not this grid's records
    tested.reshape(-1)[left_out] = False
    return tested


def _ints(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value)
