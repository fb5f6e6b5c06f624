"""Images at the edge of what a model can read: one patch, or a slide shrunk below one."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import test_slides  # the slide fixtures (tests/ is on the path, as pytest imports tests)

from napari_attnreg import regularize

slide = test_slides.slide


def test_a_one_patch_image_runs_without_a_warning_from_torch():
    image = np.random.default_rng(0).integers(0, 255, (8, 8)).astype(np.uint8)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*degrees of freedom")
        result = regularize(image, "demo", n_boot=4, device="cpu", target_size="native")
    assert result.grid_shape == (1, 1)
    assert np.isnan(result.null_summary["concentration_ratio"])


def test_a_resolution_too_coarse_for_a_patch_says_which_would_do(slide):
    with pytest.raises(ValueError, match=r"smaller than one 8x8 patch; analyse it at a finer "
                                         r"resolution \(at most 62.5 µm per pixel\)"):
        regularize(str(slide), "demo", tiled=True, mpp=100, n_boot=4, device="cpu")
