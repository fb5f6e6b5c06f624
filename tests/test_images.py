"""Image preparation: dtypes, channels, sizes, geometry, and clear errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg.core.run.images import map_over_stack, model_input_shape, prepare_image

KW = dict(patch_size=(16, 16), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25),
          default_size=(224, 224))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32, np.float64, bool, np.int32])
def test_grayscale_dtypes(dtype, rng):
    img = (rng.random((100, 150)) * (1 if dtype in (np.float32, np.float64) else 200)).astype(dtype)
    if dtype is bool:
        img = rng.random((100, 150)) > 0.5
    prep = prepare_image(img, **KW)
    assert prep.tensor.shape == (3, 144, 224)  # long side 224, aspect kept, multiples of 16
    assert prep.image_shape == (100, 150)
    assert prep.grid_shape == (9, 14)
    assert np.isclose(prep.token_scale[0], 16 * 100 / 144)
    assert np.isclose(prep.token_scale[1], 16 * 150 / 224)
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
    with pytest.raises(ValueError, match="NaN/inf values at 1 pixels"):
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


# ---- issue #12: sizes, numbers and shapes that used to pass silently or fail obscurely ----------
@pytest.mark.parametrize("size", [(0, 0), (-16, -16), True, 4, 15, 0, (16, 8), (True, 16), "big",
                                  8.5, (16,), (16, 16, 16), "modell"])
def test_target_sizes_below_one_patch_or_of_the_wrong_kind_are_refused(size, rng):
    with pytest.raises(ValueError, match="'model'.*'native'.*long side in pixels ≥ the patch "
                                         "size \\(16\\).*\\(height, width\\)"):
        prepare_image(rng.random((64, 64)), target_size=size, **KW)


def test_smallest_allowed_target_sizes_work(rng):
    assert prepare_image(rng.random((64, 48)), target_size=16, **KW).model_shape == (16, 16)
    assert prepare_image(rng.random((64, 48)), target_size=(16, 32), **KW).model_shape == (16, 32)
    assert prepare_image(rng.random((64, 48)), target_size=np.int64(32), **KW).grid_shape == (2, 2)


def test_a_large_upscale_warns_with_its_factor_and_suggests_model(rng):
    from napari_attnreg.core.run.images import ImageSizeWarning, warn_if_upscaled

    with pytest.warns(ImageSizeWarning, match="enlarges this 96x80 image 21.4x per side.*"
                                              "target_size='model'"):
        assert warn_if_upscaled((96, 80), (2048, 1712), 2048) == pytest.approx(1712 / 80)
    with pytest.warns(ImageSizeWarning, match="5.0x per side"):
        prepare_image(rng.random((64, 48)), target_size=320, **KW)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ImageSizeWarning)
        prepare_image(rng.random((64, 48)), target_size=256, **KW)  # 4x: no warning
        prepare_image(rng.random((32, 32)), target_size="model", **KW)  # the model's own size
    with pytest.warns(ImageSizeWarning, match="This 16x16 image has fewer pixels than the "
                                              "model's 20x20 patch grid"):
        prepare_image(rng.random((16, 16)), target_size=320, **KW)  # a patch < a pixel


@pytest.mark.parametrize("factor", [1e300, 1e-300, 1e30])
def test_extreme_float64_scales_are_rescaled_not_called_constant(factor, rng):
    img = rng.random((64, 64))
    plain = prepare_image(img, target_size="native", **KW)
    scaled = prepare_image(img * factor, target_size="native", **KW)
    np.testing.assert_allclose(scaled.display, plain.display, atol=1e-5)


def test_extreme_range_that_overflows_the_span_is_rescaled(rng):
    img = rng.random((64, 64)) * 2 - 1
    img *= 1.5e308  # hi - lo would overflow to inf
    shown = prepare_image(img, target_size="native", **KW).display
    assert np.isfinite(shown).all() and shown.max() - shown.min() > 0.9


def test_nan_and_inf_are_named_as_such_not_constant(rng):
    from napari_attnreg.core.run.images import scale_intensity

    img = rng.random((32, 32))
    img[0, :3] = np.nan
    img[5, 5] = -np.inf
    for call in (lambda: prepare_image(img, **KW), lambda: scale_intensity(img)):
        with pytest.raises(ValueError, match="contains NaN/inf values at 4 pixels.*nan_to_num.*"
                                             "crop") as info:
            call()
        assert "constant" not in str(info.value)
    rgb = rng.random((32, 32, 3))
    rgb[0] = np.nan
    with pytest.raises(ValueError, match="at 32 pixels"):  # an RGB pixel counts once
        scale_intensity(rgb)


@pytest.mark.parametrize("shape", [(0, 0), (0, 64), (64, 0)])
def test_empty_images_are_refused(shape):
    with pytest.raises(ValueError, match="empty"):
        prepare_image(np.zeros(shape), **KW)


def test_an_empty_stack_is_an_error_not_an_empty_list():
    with pytest.raises(ValueError, match="empty: shape \\(0, 64, 64\\)"):
        map_over_stack(lambda p: p, np.zeros((0, 64, 64)))


@pytest.mark.parametrize("axis", [5, -4, 1.5, True, "0"])
def test_a_channel_axis_that_does_not_exist_is_named(axis, rng):
    with pytest.raises(ValueError, match=f"channel_axis={axis!r} does not exist"):
        prepare_image(rng.random((3, 32, 32)), channel_axis=axis, **KW)


def test_two_trailing_channels_are_channels(rng):
    prep = prepare_image(rng.random((32, 48, 2)), target_size="native", **KW)
    assert prep.source.shape == (2, 32, 48) and prep.channel_map.kind == "zero-fill"
    assert prep.display.shape == (32, 48, 3) and not prep.display[..., 2].any()  # red/green


@pytest.mark.parametrize("tiled", [False, True])
def test_a_masked_array_is_refused_not_analysed_under_its_mask(tiny_backbone, tiled):
    from napari_attnreg import regularize, regularize_stack
    data = np.random.default_rng(0).random((64, 64))
    masked = np.ma.masked_array(data, mask=data > 0.5)
    with pytest.raises(ValueError, match=r"masked array.*\.filled\("):
        regularize(masked, tiny_backbone, n_boot=3, device="cpu", tiled=tiled)
    with pytest.raises(ValueError, match="masked array"):
        regularize_stack(np.ma.stack([masked, masked]), tiny_backbone, n_boot=3, device="cpu")
