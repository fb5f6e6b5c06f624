"""A user's tissue mask at a slide's full resolution: tile choice without a whole-mask
table, and a result that keeps a display-sized copy.

``tiles_in_tissue`` built a float64 summed-area table of the whole mask (16 bytes per mask
pixel with its temporary: 40 GB for a 50,000² mask) and the result kept the mask itself.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from napari_attnreg.core.run import tissue
from napari_attnreg.core.run.tiling import make_layout
from napari_attnreg.core.run.tissue import stored_mask, tiles_in_tissue


def _summed_area_choice(mask, layout, fraction):
    """The previous whole-table computation, as the reference."""
    mh, mw = mask.shape
    h, w = layout.shape
    table = np.zeros((mh + 1, mw + 1))
    table[1:, 1:] = np.cumsum(np.cumsum(mask, axis=0, dtype=np.float64), axis=1)
    th, tw = layout.tile
    y0, y1 = tissue._spans(layout.starts[0], th, h, mh)
    x0, x1 = tissue._spans(layout.starts[1], tw, w, mw)
    inside = (table[y1[:, None], x1[None, :]] - table[y0[:, None], x1[None, :]]
              - table[y1[:, None], x0[None, :]] + table[y0[:, None], x0[None, :]])
    return (inside >= fraction * (y1 - y0)[:, None] * (x1 - x0)[None, :]).ravel()


@pytest.mark.parametrize("band", [None, 7, 1000])  # one band, bands of a few rows
@pytest.mark.parametrize("scale", [0.25, 1.0, 3.0])  # a thumbnail, the image, finer
def test_the_tiles_chosen_are_the_whole_tables(monkeypatch, band, scale):
    if band is not None:
        monkeypatch.setattr(tissue, "GLASS_BLOCK_PIXELS", band)
    layout = make_layout((448, 656), tile=(128, 128), patch=(8, 8), overlap=32)
    rng = np.random.default_rng(int(scale * 10))
    shape = (round(448 * scale), round(656 * scale))
    blobs = rng.random((7, 9)) < 0.45  # tissue in blocks, noise at their edges
    mask = np.kron(blobs, np.ones((shape[0] // 7 + 1, shape[1] // 9 + 1), bool))
    mask = (mask[:shape[0], :shape[1]] ^ (rng.random(shape) < 0.05))
    for fraction in (0.1, 0.5, 0.97):
        assert np.array_equal(tiles_in_tissue(mask, layout, fraction),
                              _summed_area_choice(mask, layout, fraction))


def test_a_full_resolution_mask_takes_no_table_of_its_size():
    layout = make_layout((8000, 8000), tile=(224, 224), patch=(16, 16), overlap=48)
    mask = np.zeros((8000, 8000), bool)
    mask[1000:6000, 500:7000] = True
    tracemalloc.start()
    chosen = tiles_in_tissue(mask, layout)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * 2**20, peak  # the whole table: 1 GB
    assert np.array_equal(chosen, _summed_area_choice(mask, layout, tissue.TISSUE_FRACTION))


def test_a_large_mask_is_kept_reduced_by_half_covered_blocks():
    rng = np.random.default_rng(1)
    mask = rng.random((1000, 1500)) < 0.3
    mask[100:600, 200:900] = True
    small = stored_mask(mask, most=10_000)  # f = ceil(sqrt(150)) = 13
    assert small.dtype == np.uint8 and small.shape == (77, 116)
    f = 13
    for i, j in ((0, 0), (20, 30), (76, 115), (5, 60)):
        block = mask[i * f:(i + 1) * f, j * f:(j + 1) * f]
        assert small[i, j] == (block.mean() >= 0.5)
    assert np.array_equal(stored_mask(mask), mask.astype(np.uint8))  # within the budget


def test_a_run_keeps_a_display_sized_copy_of_a_large_users_mask(monkeypatch):
    from napari_attnreg import regularize

    image = np.random.default_rng(0).random((256, 256)).astype(np.float32)
    mask = np.zeros((256, 256), bool)
    mask[:128, :160] = True
    monkeypatch.setattr(tissue, "STORED_MASK_PIXELS", 64 * 64)
    result = regularize(image, "demo", tiled=True, tissue_mask=mask, n_boot=4, seed=0,
                        device="cpu")
    kept = result.null_summary["tissue_mask"]
    assert kept.shape == (64, 64) and kept[:32, :40].all() and not kept[32:].any()
    assert result.metadata["n_tissue_tiles"] == int(result.null_summary["tissue_tiles"].sum())
