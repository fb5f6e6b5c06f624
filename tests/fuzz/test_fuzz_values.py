"""Edge values of issue #27 item 13: images whose values a narrow float would merge, arrays
that are not numbers, weights that are not numbers. Each is analysed exactly or refused in
our words, naming what is wrong."""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg.core.run.images import scale_intensity
from napari_attnreg.core.run.planes import PlaneStack, as_plain_array


@pytest.mark.parametrize("values, dtype", [((2**62, 2**62 + 1), np.int64),
                                           ((2**64 - 2, 2**64 - 1), np.uint64),
                                           ((-2**63, 2**63 - 1), np.int64),
                                           ((2**31 - 2, 2**31 - 1), np.int32),
                                           ((2**32 - 2, 2**32 - 1), np.uint32)])
def test_nearby_wide_integers_are_not_a_constant_image(values, dtype):
    """float32 holds 24 bits: 2**62 and 2**62 + 1 were one value, "the image is constant"."""
    image = np.tile(np.array(values, dtype=dtype), (4, 8))
    scaled = scale_intensity(image)
    assert scaled.dtype == np.float32
    np.testing.assert_array_equal(scaled, np.tile(np.array([0.0, 1.0], np.float32), (4, 8)))


def test_an_offset_of_wide_integers_does_not_change_their_scaling():
    rng = np.random.default_rng(0)
    small = rng.integers(0, 5000, (16, 16))
    np.testing.assert_allclose(scale_intensity(small.astype(np.int64) + 2**62),
                               scale_intensity(small.astype(np.int64)), atol=1e-6)


@pytest.mark.parametrize("image", [np.full((8, 8), 1.5, dtype=object),
                                   np.array([["a", "b"], ["c", "d"]]),
                                   [[1, 2, 3], [4, 5]]], ids=["object", "text", "ragged"])
def test_arrays_that_are_not_numbers_are_refused_in_our_words(image):
    """numpy's own messages ("Cannot change data-type for array of references") named
    neither the problem nor the fix."""
    with pytest.raises(ValueError, match="not numeric|not a rectangular array"):
        as_plain_array(image)
    with pytest.raises(ValueError, match="not numeric|not a rectangular array"):
        PlaneStack.from_array(image if isinstance(image, np.ndarray) else image)


def test_an_object_array_is_refused_before_the_run(tiny_backbone):
    from napari_attnreg.core.run.api import regularize

    with pytest.raises(ValueError, match="dtype object is not numeric"):
        regularize(np.full((32, 32), 1.5, dtype=object), tiny_backbone, n_boot=2, device="cpu")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_that_are_not_finite_are_refused_at_load_naming_the_file(tmp_path, value):
    """Issue #27 item 13: NaN weights surfaced as "null_scores contains NaN", naming neither
    the weights nor their file."""
    import timm
    import torch
    from safetensors.torch import save_file

    from napari_attnreg.core.models.backbones import BackboneError, load_backbone

    torch.manual_seed(0)
    state = timm.create_model("vit_tiny_patch16_224", pretrained=False).state_dict()
    state["blocks.3.attn.qkv.weight"][0, 0] = value
    path = tmp_path / "diverged.safetensors"
    save_file(state, str(path))
    with pytest.raises(BackboneError, match=r"diverged\.safetensors.*NaN or infinite.*"
                                            r"blocks\.3\.attn\.qkv\.weight"):
        load_backbone(path, arch="vit_tiny_patch16_224")


def test_a_given_module_with_nan_weights_is_refused(fresh_tiny_backbone):
    import torch

    from napari_attnreg.core.models.backbones import BackboneError, load_backbone

    module = fresh_tiny_backbone.model
    with torch.no_grad():
        next(module.parameters()).fill_(float("nan"))
    with pytest.raises(BackboneError, match="given module.*NaN or infinite"):
        load_backbone(module)
