"""The synthetic microscopy generator: deterministic, with ground truth that matches the label."""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg.testing.synthetic import demo_sample, make_cell_image, make_dataset


def test_same_seed_same_image_other_seed_other_image():
    a = make_cell_image(3, size=96, scale=0.5, abnormal=True)
    b = make_cell_image(3, size=96, scale=0.5, abnormal=True)
    c = make_cell_image(4, size=96, scale=0.5, abnormal=True)
    np.testing.assert_array_equal(a.image, b.image)
    np.testing.assert_array_equal(a.decisive_mask, b.decisive_mask)
    assert not np.array_equal(a.image, c.image)


@pytest.mark.parametrize("abnormal", [True, False])
def test_mask_is_non_empty_iff_abnormal(abnormal):
    for seed in range(6):
        s = make_cell_image(seed, size=(80, 112), abnormal=abnormal, scale=0.5)
        assert s.image.shape == (80, 112) and s.image.dtype == np.uint16
        assert s.label == int(abnormal)
        assert s.decisive_mask.shape == (80, 112) and s.decisive_mask.dtype == bool
        assert s.decisive_mask.any() == abnormal
        # decisive figures are bright chromatin: brighter than the field on average
        if abnormal:
            assert s.image[s.decisive_mask].mean() > np.median(s.image)


def test_multichannel_variant():
    s = make_cell_image(1, size=64, channels=3, abnormal=True, scale=0.5)
    assert s.image.shape == (64, 64, 3)
    assert all(s.image[..., c].std() > 0 for c in range(3))


def test_dataset_and_demo_sample():
    ds = make_dataset(4, seed=0, size=64, scale=0.5)
    assert len(ds.labels) == 4 and ds.decisive_masks.shape == (4, 64, 64)
    demo = demo_sample()
    assert demo.image.shape == (512, 512) and demo.label == 1 and demo.decisive_mask.any()
