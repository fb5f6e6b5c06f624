"""Pure rendering and ROI rasterisation used by the explorer (no widgets involved)."""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg.notebook import regions, render


def test_composite_blends_maps_and_keeps_nan_transparent():
    base = np.full((4, 4), 0.5)
    values = np.array([[0.0, 1.0, np.nan, 0.5]] * 4)
    lut = render.colormap_lut("gray")
    out = render.composite(base, values, lut=lut, vmin=0, vmax=1, opacity=1.0)
    assert out.dtype == np.uint8 and out.shape == (4, 4, 3)
    assert out[0, 0].tolist() == [0, 0, 0] and out[0, 1].tolist() == [255, 255, 255]
    assert out[0, 2].tolist() == [128, 128, 128]  # NaN: the image shows through
    half = render.composite(base, values, lut=lut, vmin=0, vmax=1, opacity=0.5)
    assert half[0, 1].tolist() == [191, 191, 191]  # (0.5 + 1.0) / 2
    with pytest.raises(ValueError, match="Unknown colormap"):
        render.colormap_lut("nope")


def test_outlines_and_display_grid():
    mask = np.zeros((9, 9), bool)
    mask[3:6, 3:6] = True
    edge = render.boundary(mask)
    assert edge[3, 3] and edge[2, 4] and not edge[4, 4] and not edge[0, 0]
    labels = np.zeros((9, 9), int)
    labels[:, :4], labels[:, 4:] = 1, 2
    assert render.label_boundaries(labels)[:, 3:5].all()  # touching regions stay separate
    grid = render.DisplayGrid.for_shape((3000, 1500), max_size=600)
    assert grid.shape == (600, 300) and grid.rows.max() < 3000 and grid.cols.max() < 1500
    small = render.DisplayGrid.for_shape((50, 40))
    assert small.shape == (50, 40) and np.array_equal(small.rows, np.arange(50))


def test_regions_rasterise_by_pixel_centre():
    mask = regions.polygon_mask(regions.rectangle_vertices(5, 2, 1, 6), (10, 10))
    rows, cols = np.nonzero(mask)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (1, 5, 2, 6)
    labels = np.zeros((10, 10), np.int32)
    assert regions.add_region(labels, mask) == 1 and regions.add_region(labels, mask) == 2
    with pytest.raises(ValueError, match="same height and width"):
        regions.as_labels(np.zeros((3, 3), bool), (10, 10))
    with pytest.raises(ValueError, match="at least three"):
        regions.polygon_mask([(0, 0), (1, 1)], (10, 10))
