"""Image preparation: dtypes, channels, sizes, geometry, and clear errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg.core.images import map_over_stack, model_input_shape, prepare_image

KW = dict(patch_size=(16, 16), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), default_size=(224, 224))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32, np.float64, bool, np.int32])
def test_grayscale_dtypes(dtype, rng):
    img = (rng.random((100, 150)) * (1 if dtype in (np.float32, np.float64) else 200)).astype(dtype)
    if dtype is bool:
        img = rng.random((100, 150)) > 0.5
    prep = prepare_image(img, **KW)
    assert prep.tensor.shape == (3, 144, 224)  # long side 224, aspect kept, multiples of 16
    assert prep.image_shape == (100, 150)
    assert prep.grid_shape == (9, 14)
    assert np.isclose(prep.token_scale[0], 16 * 100 / 144) and np.isclose(prep.token_scale[1], 16 * 150 / 224)
    assert 0 <= prep.display.min() and prep.display.max() <= 1


def test_sixteen_bit_uses_percentiles(rng):
    img = (1000 + 100 * rng.random((64, 64))).astype(np.uint16)
    img[0, 0] = 65535  # one hot pixel must not squash the contrast
    prep = prepare_image(img, **KW)
    assert np.median(prep.display) > 0.3


def test_rgb_rgba_and_multichannel(rng):
    rgb = (rng.random((64, 80, 3)) * 255).astype(np.uint8)
    rgba = np.concatenate([rgb, np.full((64, 80, 1), 255, np.uint8)], axis=-1)
    a = prepare_image(rgb, target_size="native", **KW)
    b = prepare_image(rgba, target_size="native", **KW)
    np.testing.assert_array_equal(a.tensor.numpy(), b.tensor.numpy())
    stack = rng.random((5, 64, 80)).astype(np.float32)
    chosen = prepare_image(stack, channel_axis=0, channels=[4, 0, 2], target_size="native", **KW)
    assert chosen.tensor.shape == (3, 64, 80)
    merged = prepare_image(stack, channel_axis=0, merge="max", target_size="native", **KW)
    assert merged.display.ndim == 2
    with pytest.raises(ValueError, match="choose up to three"):
        prepare_image(stack, channel_axis=0, **KW)
    with pytest.raises(ValueError, match="ambiguous"):
        prepare_image(stack, **KW)


@pytest.mark.parametrize(
    "img,match",
    [
        (np.zeros((0, 10)), "empty"),
        (np.full((32, 32), np.nan), "NaN"),
        (np.full((32, 32), 7.0), "constant"),
        (np.ones((8, 40)), "smaller than one"),
        (np.ones((2, 3, 4, 5)), "Expected a 2D image"),
        (np.array(["a", "b"]), "not numeric"),
    ],
)
def test_bad_input_messages(img, match):
    with pytest.raises(ValueError, match=match):
        prepare_image(img, **KW)


def test_inf_pixel_is_rejected(rng):
    img = rng.random((32, 32))
    img[3, 4] = np.inf
    with pytest.raises(ValueError, match="1 NaN/Inf"):
        prepare_image(img, **KW)


def test_target_sizes():
    assert model_input_shape((512, 512), (16, 16), "model", (224, 224)) == (224, 224)
    assert model_input_shape((500, 333), (8, 8), "native", (224, 224)) == (496, 336)
    assert model_input_shape((100, 400), (16, 16), 320, (224, 224)) == (80, 320)
    assert model_input_shape((100, 400), (16, 16), (64, 96), (224, 224)) == (64, 96)
    with pytest.raises(ValueError, match="target_size"):
        model_input_shape((10, 10), (2, 2), "big", (224, 224))


def test_map_over_stack_order(rng):
    stack = rng.random((2, 3, 16, 16))
    out = map_over_stack(lambda p: float(p.sum()), stack)
    assert out == [float(stack[i, j].sum()) for i in range(2) for j in range(3)]
