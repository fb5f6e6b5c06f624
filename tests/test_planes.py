"""PlaneStack: one rule for which axes are planes and which hold channels, everywhere."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from napari_attnreg.core.run.images import map_over_stack
from napari_attnreg.core.run.planes import PlaneStack


def layout(shape, **kw):
    s = PlaneStack.from_array(np.zeros(shape, np.uint8), **kw)
    return s.stack_axes, s.channel_axis, s.rgb


@pytest.mark.parametrize("shape,kw,expected", [
    ((64, 80), {}, ((), None, False)),
    ((64, 80, 3), {}, ((), 2, True)),
    ((64, 80, 4), {}, ((), 2, True)),
    ((64, 80, 2), {}, ((), 2, False)),           # two channels, not 64 planes of 80x2
    ((64, 80, 1), {}, ((), 2, False)),
    ((7, 64, 80), {}, ((0,), None, False)),
    ((2, 7, 64, 80), {}, ((0, 1), None, False)),
    ((5, 64, 80, 3), {"rgb": True}, ((0,), 3, True)),
    ((5, 64, 80, 3), {"channel_last": True}, ((0,), 3, True)),
    ((5, 64, 80, 3), {"channel_last": True, "rgb": False}, ((0,), 3, False)),
    ((5, 64, 80, 2), {"channel_last": True}, ((0,), 3, False)),
    ((3, 64, 80), {"channel_axis": 0}, ((), 0, False)),
    ((3, 64, 80), {"stack": True}, ((0,), None, False)),
    ((3, 64, 80), {"rgb": False}, ((0,), None, False)),  # napari: non-image axes are planes
    ((2, 5, 64, 80), {"channel_axis": 1}, ((0,), 1, False)),
    ((2, 5, 64, 80), {"channel_axis": -4}, ((1,), 0, False)),
    ((5, 64, 80, 3), {"channel_axis": -1}, ((0,), 3, False)),
    ((64, 3, 80), {"channel_axis": 1}, ((), 1, False)),
])
def test_layouts(shape, kw, expected):
    assert layout(shape, **kw) == expected


@pytest.mark.parametrize("shape,kw,match", [
    ((64,), {}, "at least 2 axes"),
    ((), {}, "at least 2 axes"),
    ((0, 64, 64), {}, "empty: shape \\(0, 64, 64\\)"),
    ((0, 0), {}, "empty"),
    ((64, 80), {"channel_axis": 0}, "3 or more axes"),
    ((3, 64, 80), {"channel_axis": 5}, "channel_axis=5 does not exist.*-3 to 2"),
    ((3, 64, 80), {"channel_axis": -4}, "does not exist"),
    ((3, 64, 80), {"channel_axis": 1.5}, "integer"),
    ((3, 64, 80), {"channel_axis": True}, "integer"),
    ((180, 64, 80, 3), {}, "rgb=True or channel_last=True.*--channel-axis -1"),
    ((3, 96, 80), {}, "ambiguous.*channel_axis=0.*--channel-axis 0.*split"),
    ((64, 80), {"rgb": True}, "rgb=True needs a last axis of length 3 or 4"),
    ((64, 80, 5), {"rgb": True}, "rgb=True needs"),
    ((3, 64, 80), {"channel_axis": 0, "channel_last": True}, "give one of them"),
    ((3, 64, 4), {"channel_axis": 0, "rgb": True}, "give one of them"),
])
def test_refused_with_advice(shape, kw, match):
    with pytest.raises(ValueError, match=match):
        PlaneStack.from_array(np.zeros(shape, np.uint8), **kw)


def test_read_keeps_channel_axis_relative_and_drops_stack_axes():
    data = np.arange(2 * 3 * 4 * 5 * 6).reshape(2, 3, 4, 5, 6)  # (Z, C, T, H, W)
    stack = PlaneStack.from_array(data, channel_axis=1)
    assert stack.stack_axes == (0, 2) and stack.stack_shape == (2, 4) and stack.n_planes == 8
    assert stack.plane_shape == (5, 6) and stack.n_channels == 3
    plane, axis = stack.read((1, 3))
    assert axis == 0
    np.testing.assert_array_equal(plane, data[1, :, 3])
    assert stack.planes() == [(z, t) for z in range(2) for t in range(4)]
    with pytest.raises(ValueError, match="not in this stack"):
        stack.read((2, 0))
    with pytest.raises(ValueError, match="not in this stack"):
        stack.read((0,))


def test_single_image_has_one_empty_plane_index():
    stack = PlaneStack.from_array(np.ones((64, 80, 3), np.uint8))
    assert stack.planes() == [()] and stack.n_planes == 1 and not stack.is_stack
    plane, axis = stack.read(())
    assert plane.shape == (64, 80, 3) and axis is None  # RGB: prepare_image sees the colours


def test_data_is_never_copied_and_lazy_arrays_are_read_per_plane():
    da = pytest.importorskip("dask.array")
    data = da.zeros((6, 64, 80), chunks=(1, 64, 80))
    stack = PlaneStack.from_array(data)
    assert stack.data is data
    plane, _ = stack.read((2,))
    assert isinstance(plane, np.ndarray) and plane.shape == (64, 80)
    arr = np.zeros((6, 64, 80))
    assert PlaneStack.from_array(arr).data is arr


def test_lists_are_accepted():
    assert PlaneStack.from_array([[0, 1], [2, 3]]).plane_shape == (2, 2)


def test_map_over_stack_uses_the_same_rules(rng):
    rgb_stack = rng.random((2, 16, 16, 3))
    with pytest.raises(ValueError, match="channel_last=True"):
        map_over_stack(lambda p: p.shape, rgb_stack)  # not "16x3 px smaller than one patch"
    assert map_over_stack(lambda p: p.shape, rgb_stack, channel_last=True) == [(16, 16, 3)] * 2
    assert map_over_stack(lambda p: p.shape, rng.random((16, 16, 2))) == [(16, 16, 2)]
    assert map_over_stack(lambda p: p.shape, rng.random((3, 16, 16))) == [(16, 16)] * 3
    with pytest.raises(ValueError, match="empty"):
        map_over_stack(lambda p: p, np.zeros((0, 64, 64)))


shapes = st.lists(st.integers(1, 6), min_size=2, max_size=5).map(tuple)


@settings(max_examples=150, deadline=None)
@given(shape=shapes, rgb=st.sampled_from([None, True, False]),
       channel_last=st.booleans(), channel_axis=st.one_of(st.none(), st.integers(-6, 6)))
def test_any_layout_is_consistent_or_refused_with_a_value_error(shape, rgb, channel_last,
                                                                channel_axis):
    data = np.arange(int(np.prod(shape))).reshape(shape)
    try:
        stack = PlaneStack.from_array(data, rgb=rgb, channel_last=channel_last,
                                      channel_axis=channel_axis)
    except ValueError as err:
        assert str(err)
        return
    ndim = len(shape)
    used = set(stack.stack_axes) | set(stack.image_axes) | (
        set() if stack.channel_axis is None else {stack.channel_axis})
    assert used == set(range(ndim)) and len(stack.stack_axes) + 2 + (
        stack.channel_axis is not None) == ndim
    assert stack.image_axes == tuple(sorted(stack.image_axes))
    assert stack.n_planes == len(stack.planes()) == int(np.prod(stack.stack_shape))
    if stack.rgb:
        assert stack.channel_axis == ndim - 1 and shape[-1] in (3, 4)
    seen = set()
    for index in stack.planes():
        plane, axis = stack.read(index)
        assert plane.ndim == 2 + (stack.channel_axis is not None)
        rows, cols = [a for a in range(plane.ndim) if a != (plane.ndim - 1 if stack.rgb else axis)]
        assert (plane.shape[rows], plane.shape[cols]) == stack.plane_shape
        seen |= set(plane.ravel().tolist())
    assert seen == set(range(data.size))  # every pixel belongs to exactly one read plane
