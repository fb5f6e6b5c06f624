"""Memory of large tiled runs: what a tiled result keeps (bounded, never the statistics)."""

from __future__ import annotations

import numpy as np
import pytest

import napari_attnreg.core.run.tiled_engine as tiled_mod
from napari_attnreg import AttentionResult, regularize
from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.testing.synthetic import make_cell_image

QUIET = pytest.mark.filterwarnings("ignore::UserWarning")
OPTS = {"n_boot": 8, "chunk_size": 8, "device": "cpu", "tiled": True}


@pytest.fixture(scope="module")
def demo():
    return load_backbone("demo")


@QUIET
def test_a_large_tiled_grid_drops_its_head_maps_and_keeps_its_statistics(demo, monkeypatch,
                                                                         tmp_path):
    image = make_cell_image(5, size=256, abnormal=True).image
    kept = regularize(image, demo, **OPTS)
    assert kept.head_attention is not None  # a small field keeps them, as before
    assembled = []
    real = tiled_mod._assemble

    def spy(owned, layout, tile_maps):
        assembled.append(tuple(tile_maps.shape))
        return real(owned, layout, tile_maps)

    # the grid is "large" for this run: above the bound, the heads are neither kept nor built
    monkeypatch.setattr(tiled_mod, "TILED_HEADS_MAX_VALUES", kept.attention.size)
    monkeypatch.setattr(tiled_mod, "_assemble", spy)
    made_heads = []
    real_close = tiled_mod._ObservedTiles.close

    def close(self):
        made_heads.append(self.heads)
        real_close(self)

    monkeypatch.setattr(tiled_mod._ObservedTiles, "close", close)
    dropped = regularize(image, demo, **OPTS)
    assert dropped.head_attention is None
    assert not any(len(shape) == 4 for shape in assembled)  # (tiles, heads, th, tw): never
    assert made_heads and all(h is None for h in made_heads)  # nor held in the pass
    np.testing.assert_array_equal(dropped.attention, kept.attention)
    for name, values in kept.maps.items():
        np.testing.assert_array_equal(dropped.maps[name], values, err_msg=name)
    assert dropped.pi0 == kept.pi0
    # the file of a result without head maps reopens without them
    again = AttentionResult.load(dropped.save(tmp_path / "large.npz"))
    assert again.head_attention is None
    np.testing.assert_array_equal(again.attention, kept.attention)


def _plain_entropy(attention: np.ndarray) -> float:
    a = np.asarray(attention, dtype=np.float64).reshape(-1)
    a = a / a.sum()
    nz = a[a > 0]
    return float(-(nz * np.log(nz)).sum() / np.log(a.size))


def test_the_entropy_of_a_slide_sized_map_needs_few_copies_and_gives_the_same_value():
    import tracemalloc

    from napari_attnreg.core.stats.diagnostics import normalized_entropy

    rng = np.random.default_rng(0)
    attention = rng.random((1000, 1000), dtype=np.float32)
    attention[:10] = 0  # zeros are left out, as before
    double = attention.astype(np.float64)
    # numpy's allocations are exact, so the peak is too: the plain formula holds three float64
    # maps at once (the copy, its normalised values, then the kept ones with their terms), the
    # in-place one the copy and its mask, then the kept values and their terms
    tracemalloc.start()
    try:
        value = normalized_entropy(attention)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * double.nbytes
    assert value == _plain_entropy(attention)  # bit for bit
    assert normalized_entropy(double) == _plain_entropy(double)
    np.testing.assert_array_equal(double, attention.astype(np.float64))  # input untouched
