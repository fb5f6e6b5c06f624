"""Any array and any option value: prepare_image and the plane splitting either give a
consistent model input or one ValueError that says what is wrong — never another exception,
a NaN tensor, a silent empty list, or "constant" for an image that is not."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from napari_attnreg.core.run.images import (
    ImageSizeWarning,
    map_over_stack,
    prepare_image,
    scale_intensity,
)
from napari_attnreg.core.run.planes import PlaneStack

PATCH = (8, 8)
KW = dict(patch_size=PATCH, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), default_size=(32, 32))
DTYPES = [np.uint8, np.uint16, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64,
          np.bool_]

image_shapes = st.one_of(
    st.tuples(st.integers(8, 40), st.integers(8, 40)),
    st.tuples(st.integers(8, 40), st.integers(8, 40), st.sampled_from([2, 3, 4])),
    st.tuples(st.integers(0, 40), st.integers(0, 40)),
    st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(1, 5)),
    st.tuples(st.integers(1, 5), st.integers(0, 40), st.integers(0, 40)),
    st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(8, 20), st.integers(8, 20)),
)


@st.composite
def images(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(image_shapes)
    if dtype.kind == "f":
        elements = st.floats(allow_nan=True, allow_infinity=True, width=8 * dtype.itemsize)
    else:
        elements = None
    arr = draw(hnp.arrays(dtype, shape, elements=elements))
    if dtype.kind == "f" and arr.size and draw(st.booleans()):  # mostly clean float data
        arr = np.nan_to_num(arr, nan=0.0, posinf=1.0, neginf=-1.0)
        arr = arr + np.arange(arr.size, dtype=dtype).reshape(shape) % 7  # not constant
    return arr


target_sizes = st.one_of(
    st.sampled_from(["model", "native", None, "big", True, False, "16"]),
    st.integers(-20, 64),
    st.tuples(st.integers(-20, 40), st.integers(-20, 40)),
    st.floats(-10, 40),
)
channel_axes = st.one_of(st.none(), st.integers(-4, 4), st.sampled_from([1.5, True]))


@settings(max_examples=300, deadline=None)
@given(image=images(), target_size=target_sizes, channel_axis=channel_axes)
def test_prepare_image_gives_a_consistent_input_or_a_value_error(image, target_size,
                                                                  channel_axis):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImageSizeWarning)
        try:
            prep = prepare_image(image, target_size=target_size, channel_axis=channel_axis, **KW)
        except ValueError as err:
            message = str(err)
            event("refused: " + re.sub(r"[^A-Za-z ]", "", message.split(";")[0])[:32])
            assert message and "Traceback" not in message
            if image.size == 0:
                assert "empty" in message or "target_size" in message
            if "constant" in message:  # only ever for an image that is constant (RGBA: its RGB)
                assert image.ndim == 3 or np.ptp(image.astype(np.float64)) == 0
                assert not (image.dtype.kind == "f" and np.isnan(image).any())
            return
    event("prepared")
    h, w = prep.model_shape
    assert h % PATCH[0] == 0 and w % PATCH[1] == 0 and h >= PATCH[0] and w >= PATCH[1]
    assert prep.grid_shape == (h // PATCH[0], w // PATCH[1])
    assert prep.image_shape[0] >= PATCH[0] and prep.image_shape[1] >= PATCH[1]
    assert prep.tensor.shape == (3, h, w) and bool(prep.tensor.isfinite().all())
    assert np.isfinite(prep.display).all() and prep.display.min() >= 0 and prep.display.max() <= 1
    assert prep.display.max() > prep.display.min()  # a constant image is refused instead
    if target_size in (True, False) or isinstance(target_size, float):
        pytest.fail(f"target_size={target_size!r} was accepted")


@settings(max_examples=100, deadline=None)
@given(values=hnp.arrays(np.float64, st.tuples(st.integers(8, 24), st.integers(8, 24)),
                         elements=st.floats(-1e308, 1e308)))
def test_any_finite_float64_range_scales_into_zero_one(values):
    assume(np.ptp(values / 2) > 0)  # not constant (halved: the span itself may overflow)
    out = scale_intensity(values)
    assert out.dtype == np.float32 and np.isfinite(out).all()
    assert out.min() >= 0 and out.max() <= 1 and out.max() > out.min()


@settings(max_examples=150, deadline=None)
@given(shape=st.lists(st.integers(0, 5), min_size=0, max_size=5).map(tuple),
       channel_last=st.booleans())
def test_map_over_stack_never_returns_an_empty_list(shape, channel_last):
    data = np.zeros(shape, np.uint8)
    try:
        out = map_over_stack(lambda plane: plane.shape, data, channel_last=channel_last)
    except ValueError as err:
        assert str(err)
        return
    stack = PlaneStack.from_array(data, channel_last=channel_last, stack=True)
    assert len(out) == stack.n_planes >= 1
    assert all(s[:2] == stack.plane_shape for s in out)


@settings(max_examples=150, deadline=None)
@given(shape=st.lists(st.integers(0, 6), min_size=0, max_size=5).map(tuple),
       rgb=st.sampled_from([None, True, False]), channel_axis=channel_axes,
       channel_last=st.booleans())
def test_plane_stack_options_never_raise_anything_but_value_error(shape, rgb, channel_axis,
                                                                   channel_last):
    try:
        stack = PlaneStack.from_array(np.zeros(shape), rgb=rgb, channel_axis=channel_axis,
                                      channel_last=channel_last)
    except ValueError as err:
        assert str(err)
        if 0 in shape and len(shape) >= 2:
            assert "empty" in str(err) or "channel" in str(err) or "rgb" in str(err)
        return
    assert 0 not in shape and stack.n_planes == len(stack.planes()) >= 1


tiff_layouts = st.sampled_from([
    ((64, 72), None), ((64, 72, 3), None), ((64, 72, 2), None), ((64, 72, 4), None),
    ((3, 64, 72), None), ((2, 64, 72), None), ((6, 64, 72), None), ((2, 64, 72, 3), None),
    ((3, 64, 72), "CYX"), ((3, 64, 72), "ZYX"), ((1, 64, 72), "ZYX"), ((1, 2, 64, 72), "ZCYX"),
    ((2, 2, 64, 72), "TCYX"), ((1, 3, 1, 64, 72), "TCZYX"), ((1, 1, 1, 64, 72), "TCZYX"),
])


@settings(max_examples=40, deadline=None)
@given(layout=tiff_layouts, dtype=st.sampled_from([np.uint8, np.uint16, np.float32]),
       channel_axis=st.one_of(st.none(), st.integers(-1, 1)))
def test_the_in_memory_and_the_lazy_tiff_readers_agree(tmp_path_factory, layout, dtype,
                                                       channel_axis):
    import tifffile

    pytest.importorskip("zarr")
    from napari_attnreg.core.run.lazy import open_lazy
    from napari_attnreg.io.readers import read_stack

    shape, axes = layout
    path = tmp_path_factory.mktemp("tif") / ("x.ome.tif" if axes else "x.tif")
    data = np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)
    tifffile.imwrite(path, data, **({"ome": True, "metadata": {"axes": axes}} if axes else {}))
    try:
        stack = read_stack(path, channel_axis)
    except ValueError as eager_err:
        event("both refuse")
        with pytest.raises(ValueError) as lazy_err:
            open_lazy(path, channel_axis=channel_axis)
        assert str(path) in str(lazy_err.value) and str(eager_err)
        return
    try:
        lazy = open_lazy(path, channel_axis=channel_axis)
    except ValueError as err:  # only what lazy tiling cannot do: a stack, or > 3 channels
        assert stack.n_planes > 1 or stack.n_channels > 3 or "channels between" in str(err)
        event("lazy refuses a stack or many channels")
        return
    event("both read one image")
    assert stack.n_planes == 1 and lazy.shape == stack.plane_shape
    plane, _ = stack.read(stack.planes()[0])
    block = lazy.read(slice(0, 5), slice(0, 7))
    expected = plane if stack.channel_axis is None or stack.rgb else np.moveaxis(
        plane, stack.plane_channel_axis(), -1)
    if expected.ndim == 3 and expected.shape[-1] == 4:
        expected = expected[..., :3]
    np.testing.assert_array_equal(block, np.squeeze(expected[:5, :7]))
