"""nD stacks (current slice / all slices), RGB and multichannel images."""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg._napari.layers import token_grid

pytestmark = pytest.mark.gui


@pytest.fixture
def stack(cells_image):
    return np.stack(
        [cells_image, np.roll(cells_image, 20, axis=1), np.roll(cells_image, 35, axis=0)]
    )


def test_current_slice_then_all_slices(viewer_widget, run_and_wait, stack, qtbot):
    viewer, widget = viewer_widget
    image = viewer.add_image(stack, name="zstack", scale=(3.0, 1.0, 1.0))
    assert widget.source.scope_combo.isVisibleTo(widget)
    viewer.dims.set_point(0, 3.0)  # world z = 3 → plane 1
    run_and_wait(widget)
    att = viewer.layers["zstack · attention"]
    assert att.data.shape[0] == 3
    computed = [not np.isnan(att.data[i]).all() for i in range(3)]
    assert computed == [False, True, False]
    # planes never computed are NaN (drawn transparent), not zeros a reader could take for a
    # result, and the status names the computed plane
    assert not np.isnan(att.data[1]).any()
    status = widget.run_panel.status_label.text()
    assert "Computed 1 of 3 planes (axis 0 = 1)" in status and "not computed" in status
    assert att.axis_labels == image.axis_labels  # napari's placeholders: no names invented
    assert "not computed" in viewer.status
    np.testing.assert_allclose(att.data_to_world((1, 0, 0))[0], image.data_to_world((1, 0, 0))[0])

    viewer.dims.set_point(0, 6.0)  # another slice adds its plane to the same layers
    run_and_wait(widget)
    assert [not np.isnan(att.data[i]).all() for i in range(3)] == [False, True, True]
    assert viewer.layers["zstack · attention"] is att

    widget.source.scope_combo.setCurrentText("all slices")
    outcome = run_and_wait(widget)
    assert sorted(outcome.results) == [(0,), (1,), (2,)]
    assert not np.isnan(att.data).any()
    assert "not computed" not in widget.run_panel.status_label.text()
    sig = viewer.layers["zstack · significant"].data
    for i in range(3):  # one class (label 1) on every plane, each plane its own result's mask
        assert set(np.unique(sig[i])) <= {0, 1}
        np.testing.assert_array_equal(token_grid(sig[i]) == 1, outcome.results[(i,)].significant())
    # the ROI table has one block of rows per computed plane
    shapes = viewer.add_shapes([np.array([[10, 10], [60, 60]])], shape_type="rectangle", name="r")
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.roi_panel.set_layer(shapes)
    assert [r["plane"] for r in blocker.args[0]] == [[0], [1], [2]]


def test_rgb_image(viewer_widget, run_and_wait):
    from skimage.data import immunohistochemistry

    viewer, widget = viewer_widget
    rgb = immunohistochemistry()[::4, ::4]
    image = viewer.add_image(rgb, name="ihc")
    assert image.rgb and not widget.source.channel_box.isVisibleTo(widget)
    outcome = run_and_wait(widget)
    assert outcome.ok
    att = viewer.layers["ihc · attention"]
    assert att.ndim == 2
    gh, gw = att.data.shape
    np.testing.assert_allclose(
        att.data_to_world((gh - 0.5, gw - 0.5)),
        image.data_to_world((rgb.shape[0] - 0.5, rgb.shape[1] - 0.5)),
    )


def test_multichannel_choose_channels(viewer_widget, run_and_wait, stack, notifications):
    viewer, widget = viewer_widget
    four = np.concatenate([stack, stack[:1] // 2])  # (4, H, W): four fluorescence channels
    viewer.add_image(four, name="channels")
    assert widget.source.channel_box.isVisibleTo(widget)
    widget.source.channel_axis_combo.setCurrentIndex(widget.source.channel_axis_combo.findData(0))
    assert not widget.source.scope_combo.isVisibleTo(widget)  # no stack axis left
    outcome = run_and_wait(widget)  # four channels, none chosen: the core says what to do
    assert "choose up to three" in outcome.message
    widget.source.channels_edit.setText("0,2")
    outcome = run_and_wait(widget)
    assert outcome.ok and list(outcome.results) == [()]
    att = viewer.layers["channels · attention"]
    assert att.data.shape[0] == 1
    # the single output plane spans all four channel positions
    for c in range(4):
        viewer.dims.set_point(0, c)
        assert np.rint(att.world_to_data(viewer.dims.point)[0]) == 0
    widget.source.channels_edit.setText("0,x")
    assert widget.run() is None
    assert "comma-separated" in notifications[-1].message


def test_a_stack_whose_file_names_its_axes_is_spoken_of_by_those_names(
        viewer_widget, run_and_wait, cells_image, tmp_path, qtbot):
    """An OME-TIFF z-stack opened through the plugin's reader names its axes (z, c, y, x):
    the dock said "axis 0 = 3", its output layers carried napari's placeholders ('-3') and
    the slice cue spoke of slices of a time-lapse."""
    import tifffile

    from napari_attnreg._napari.slice_cue import text_overlay

    viewer, widget = viewer_widget
    zcyx = np.stack([np.stack([np.roll(cells_image, 9 * z, axis=1), cells_image[::-1]])
                     for z in range(4)])
    path = tmp_path / "stack.ome.tif"
    tifffile.imwrite(path, zcyx, ome=True, metadata={
        "axes": "ZCYX", "PhysicalSizeX": 0.2, "PhysicalSizeY": 0.2, "PhysicalSizeZ": 0.5,
        "Channel": {"Name": ["DAPI", "GFP"]}})
    viewer.open(str(path), plugin="napari-attnreg")
    image = viewer.layers["stack · GFP"]
    assert image.axis_labels == ("z", "y", "x")
    widget.set_layer(image)
    combo = widget.source.channel_axis_combo
    assert [combo.itemText(i) for i in range(combo.count())] == ["no channel axis",
                                                                 "axis 0 · z (4)"]
    viewer.dims.set_current_step(0, 2)
    said, render = [], widget.run_panel._render_progress
    widget.run_panel._render_progress = lambda item: (said.append(item.message), render(item))
    run_and_wait(widget)
    # the run's progress names the plane by its axis too (it said "plane (2,) (1/1): ...")
    assert any(m.startswith("z = 2 (1/1): ") for m in said), said
    record = widget.current_record()
    assert sorted(record.results) == [(2,)]
    for layer in record.outputs.values():
        assert layer.axis_labels == ("z", "y", "x")
        np.testing.assert_allclose(layer.scale[0], 0.5)  # the file's z spacing
    assert viewer.layers["stack · GFP · significant outline"].axis_labels == ("z", "y", "x")
    assert viewer.dims.axis_labels == ("z", "y", "x")
    status = widget.run_panel.status_label.text()
    assert "Computed 1 of 4 planes (z = 2)" in status and "axis 0" not in status
    viewer.dims.set_current_step(0, 1)
    qtbot.waitUntil(lambda: "z = 1 has no result" in text_overlay(viewer).text, timeout=2000)
    assert "cover z = 2 only" in text_overlay(viewer).text
    viewer.cursor.position = (1 * 0.5, 30 * 0.2, 30 * 0.2)
    widget.inspector.inspect_world(viewer.cursor.position)
    assert "z = 1: no result yet" in widget.inspector.label.text()


def test_channels_kept_as_separate_layers_are_joined_and_analysed_together(
        viewer_widget, run_and_wait, cells_image):
    """napari (and the plugin's OME-TIFF reader) shows a multichannel file as one layer per
    channel, and the dock analysed one layer at a time: DAPI, GFP and mCherry could not be
    analysed together without knowing napari's Merge to Stack (which removes the layers)."""
    viewer, widget = viewer_widget
    planes = {"DAPI": cells_image, "GFP": cells_image[::-1].copy(), "mCherry": cells_image // 3}
    kept = {name: viewer.add_image(data, name=f"cells · {name}", scale=(0.5, 0.5),
                                   axis_labels=("y", "x"), metadata={"source_path": "cells.tif"})
            for name, data in planes.items()}
    viewer.add_image(cells_image[:60], name="other size")
    viewer.add_image(np.zeros((*cells_image.shape, 3), np.uint8), name="rgb", rgb=True)
    widget.set_layer(kept["GFP"])
    button = widget.source.join_button
    assert button.isVisibleTo(widget) and button.text() == "Join 3 layers as channels"
    assert "'cells · mCherry'" in button.toolTip()
    widget.set_layer(viewer.layers["other size"])  # nothing of its size to join
    assert not button.isVisibleTo(widget)
    widget.set_layer(kept["GFP"])
    viewer.layers.selection = {kept["DAPI"], kept["GFP"]}  # the analyst picks two
    assert button.text() == "Join 2 layers as channels"
    viewer.layers.selection = {kept["GFP"]}

    button.click()
    joined = viewer.layers["cells · DAPI + GFP + mCherry"]
    assert widget.current_layer() is joined and not joined.visible
    np.testing.assert_array_equal(joined.data, np.stack(list(planes.values())))
    np.testing.assert_allclose(joined.scale, (1, 0.5, 0.5))
    assert joined.axis_labels == ("c", "y", "x")
    assert joined.metadata["source_path"] == "cells.tif"  # the file's metadata goes along
    combo = widget.source.channel_axis_combo
    assert combo.currentData() == 0 and combo.currentText() == "axis 0 · c (3)"
    assert "3 channels on axis 0" in widget.run_panel.status_label.text()
    for name, layer in kept.items():  # the analyst's layers are left as they were
        assert layer in viewer.layers and layer.visible
        np.testing.assert_array_equal(layer.data, planes[name])

    outcome = run_and_wait(widget)
    assert outcome.ok and list(outcome.results) == [()]
    result = outcome.results[()]
    assert result.metadata["channel_axis"] == 0 and result.metadata["channels"] is None
    assert result.metadata["channel_map"] == "identity"  # three channels as R, G, B
    attention = viewer.layers["cells · DAPI + GFP + mCherry · attention"]
    assert attention.data.shape[0] == 1  # one output plane over the three channel positions
    # the map covers the image where napari shows it, in its µm
    np.testing.assert_allclose(np.multiply(attention.data.shape[1:], attention.scale[1:]),
                               np.multiply(cells_image.shape, 0.5), rtol=0.05)

    # the joined layer is a copy: once a channel layer is edited, it is not run silently
    kept["GFP"].data = cells_image // 2
    assert widget.run() is None
    assert "'cells · GFP' changed after" in widget.run_panel.status_label.text()


def test_napari_merge_to_stack_placeholder_axis_is_not_called_by_its_placeholder(
        viewer_widget):
    """napari's own Merge to Stack puts a placeholder ('-3') in front of named axes; the dock
    listed it as "axis 0 · -3"."""
    viewer, widget = viewer_widget
    layer = viewer.add_image(np.zeros((3, 40, 40), np.uint16), name="merged",
                             axis_labels=("-3", "y", "x"))
    widget.set_layer(layer)
    combo = widget.source.channel_axis_combo
    assert [combo.itemText(i) for i in range(combo.count())] == ["no channel axis",
                                                                 "axis 0 (3)"]
