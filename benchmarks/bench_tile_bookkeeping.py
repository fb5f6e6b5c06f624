"""Tile bookkeeping of a whole slide's layout: the per-tile loops against the array forms.

    PYTHONPATH=src python benchmarks/bench_tile_bookkeeping.py

The layout of a 50,000² slide for the demo model (128² tiles, quarter overlap: 271,441
tiles), a tissue subset of ~9 % of the tiles in four blobs and a 3125² mask. The loops are
the references kept in ``tests/test_tiling_vectorized.py``. Times are taken under
tracemalloc (for the peaks), which slows the Python loops several-fold.
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_tiling_vectorized import (
    reference_run_tiles,
    reference_tile_tokens,
    reference_tiles_in_tissue,
)

from napari_attnreg.core.run.tiling import make_layout, run_tiles
from napari_attnreg.core.run.tissue import tiles_in_tissue


def measure(name: str, fn) -> None:
    tracemalloc.start()
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"{name:30s} {seconds:7.2f} s  peak {peak / 1e6:8.0f} MB", flush=True)


def main() -> None:
    layout = make_layout((49992, 49992), tile=(128, 128), patch=(8, 8), overlap=32)
    n = len(layout.starts[0])
    yy, xx = np.mgrid[:n, :n]
    keep = np.zeros((n, n), bool)
    for cy, cx, r in ((130, 156, 60), (312, 364, 48), (390, 104, 36), (182, 416, 30)):
        keep |= (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
    keep = keep.ravel()
    mask = np.zeros((3125, 3125), bool)
    mask[500:900, 600:1100] = True
    print(f"{layout.n_tiles} tiles, {int(keep.sum())} kept, token grid {layout.grid_shape}")
    measure("tile_tokens loop", lambda: reference_tile_tokens(layout))
    measure("tile_tokens arrays", lambda: layout.tile_tokens())
    measure("tiles_in_tissue loop", lambda: reference_tiles_in_tissue(mask, layout, 0.1))
    measure("tiles_in_tissue arrays", lambda: tiles_in_tissue(mask, layout, 0.1))
    measure("run_tiles loop", lambda: reference_run_tiles(layout, keep))
    measure("run_tiles sort", lambda: run_tiles(layout, keep))


if __name__ == "__main__":
    main()
