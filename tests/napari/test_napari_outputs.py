"""Output layers belong to a run: copies, other docks, closed docks and changed sources."""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg._napari.layers import KINDS, META_KEY, layer_name

pytestmark = pytest.mark.gui


def _start_and_act(widget, qtbot, act, n_boot=64):
    """Run, call ``act()`` on the GUI thread at the first progress event, wait for the end."""
    widget.options.controls["n_boot"].setValue(n_boot)
    widget.options.controls["chunk_size"].setValue(4)
    acted = []

    def once(item):
        if not acted and item.event is not None:
            acted.append(True)
            act()

    with qtbot.waitSignal(widget.run_panel.finished, timeout=60_000) as blocker:
        worker = widget.run()
        worker.yielded.connect(once)  # queued: runs on the GUI thread before the outcome
    assert acted
    return blocker.args[0]


def test_duplicated_output_is_the_analysts_copy(viewer_widget, run_and_wait, cells_image, qtbot):
    from napari.layers._layer_actions import _duplicate_layer

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    presets = widget.options.controls["preset"]  # the q rule and its slider
    presets.setCurrentIndex(presets.findData("directional"))
    run_and_wait(widget)
    record = widget.current_record()
    real = viewer.layers[layer_name("cells", "regularized")]
    viewer.layers.selection.active = real
    _duplicate_layer(viewer.layers)  # napari's Duplicate Layer: metadata (run id) copied too
    copy = viewer.layers[f"{real.name} copy"]
    assert copy.metadata[META_KEY]["run_id"] == record.run_id
    viewer.layers.move(viewer.layers.index(copy), 1)  # move the copy below
    copy_data, copy_name = copy.data.copy(), copy.name
    viewer.layers.selection.active = viewer.layers["cells"]

    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.q_th_slider.setValue(1.0)
    result = record.results[()]
    np.testing.assert_allclose(real.data, result.regularized(**{**widget.thresholds(),
                                                               "z_th": None}), rtol=1e-6)
    assert not np.allclose(real.data, copy_data)  # the real output moved with the slider …
    np.testing.assert_array_equal(copy.data, copy_data)  # … the copy did not
    assert copy.name == copy_name

    widget.options.controls["seed"].setValue(5)
    run_and_wait(widget)
    assert copy.name == copy_name and np.array_equal(copy.data, copy_data)
    assert widget.current_record().outputs["regularized"] is real  # updated in place
    assert real.metadata[META_KEY]["run_id"] == widget.current_record().run_id != \
        copy.metadata[META_KEY]["run_id"]
    assert len([lay for lay in viewer.layers if META_KEY in lay.metadata]) == len(KINDS) + 2  # + outline


def test_two_docks_write_their_own_layers(viewer_widget, run_and_wait, cells_image, qtbot,
                                          tiny_backbone):
    from napari_attnreg._napari.widget import AttentionWidget

    viewer, first = viewer_widget
    viewer.add_image(cells_image, name="cells")
    second = AttentionWidget(viewer)
    viewer.window.add_dock_widget(second, name="second dock")
    second.set_model(tiny_backbone, name="tiny")
    second.options.controls["n_boot"].setValue(16)
    second.options.controls["device"].setCurrentText("cpu")
    for dock in (first, second):  # the q rule and its slider
        dock.options.controls["preset"].setCurrentIndex(
            dock.options.controls["preset"].findData("directional"))
    run_and_wait(first)
    run_and_wait(second)
    a, b = first.current_record(), second.current_record()
    assert a.run_id != b.run_id
    assert all(a.outputs[k] is not b.outputs[k] for k in KINDS)
    assert len(viewer.layers) == 1 + 2 * (len(KINDS) + 1)  # each with its outline
    before = a.outputs["significant"].data.copy(), a.outputs["significant"].name
    with qtbot.waitSignal(second.outputs_updated, timeout=5000):
        second.thresholds_panel.q_th_slider.setValue(1.0)
    assert b.outputs["significant"].data.any()
    np.testing.assert_array_equal(a.outputs["significant"].data, before[0])
    assert a.outputs["significant"].name == before[1]


def test_removing_the_dock_mid_run_cancels_and_adds_nothing(viewer_widget, qtbot, cells_image):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    outcome = _start_and_act(widget, qtbot, lambda: viewer.window.remove_dock_widget(widget),
                             n_boot=5000)
    assert outcome.status == "cancelled" and outcome.results == {}
    assert [layer.name for layer in viewer.layers] == ["cells"]
    viewer.add_image(cells_image, name="later")  # a removed dock no longer follows the viewer
    assert widget.source.layer_combo.count() == 1


@pytest.mark.parametrize("how", ["replaced", "edited in place"])
def test_source_data_changed_mid_run_is_not_attached(viewer_widget, qtbot, cells_image,
                                                     notifications, how):
    viewer, widget = viewer_widget
    image = viewer.add_image(cells_image.copy(), name="cells")

    def change():
        if how == "replaced":
            image.data = np.flipud(cells_image).copy()  # same shape, other content
        else:
            image.data[:10] = 0
            image.refresh()

    outcome = _start_and_act(widget, qtbot, change)
    assert outcome.results == {} and "changed during the run" in outcome.message
    assert "changed during the run" in notifications[-1].message
    assert [layer.name for layer in viewer.layers] == ["cells"]
    assert widget.current_record() is None


def test_source_removed_mid_run_reports_it(viewer_widget, qtbot, cells_image, notifications):
    viewer, widget = viewer_widget
    image = viewer.add_image(cells_image, name="cells")
    viewer.add_points([[5, 5]], name="pts")
    stopped: list[bool] = []
    said: list[str] = []

    def remove() -> None:
        viewer.layers.remove(image)
        stopped.append(widget.run_panel.cancelled)
        said.append(widget.run_panel.status_label.text())

    outcome = _start_and_act(widget, qtbot, remove, n_boot=2000)
    assert stopped == [True]  # stopped at once, not run to its end for nothing
    assert said == ["'cells' was closed: its run stops at the next chunk."]
    assert outcome.status == "failed" and outcome.results == {}
    assert "was removed during the run" in outcome.message
    assert "removed" in widget.run_panel.status_label.text()
    assert "significant" not in widget.run_panel.status_label.text()  # no success summary
    assert [layer.name for layer in viewer.layers] == ["pts"]


def test_outputs_follow_a_rescaled_source(viewer_widget, run_and_wait, cells_image, qtbot):
    viewer, widget = viewer_widget
    image = viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    record = widget.current_record()
    result = record.results[()]
    image.scale = (2.0, 0.5)
    image.translate = (7.0, -4.0)
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.q_th_slider.setValue(0.5)
    ts, tt = result.token_scale, result.token_translate
    for kind in KINDS:
        layer = record.outputs[kind]
        k = layer.metadata[META_KEY]["cells_per_token"]
        for i, j in ((0, 0), (3, 5)):
            cell = (i * k + (k - 1) / 2, j * k + (k - 1) / 2)
            np.testing.assert_allclose(layer.data_to_world(cell), image.data_to_world(
                (tt[0] + i * ts[0], tt[1] + j * ts[1])), err_msg=kind)


def test_planes_not_computed_are_drawn_transparent(viewer_widget, run_and_wait, cells_image):
    """The NaN planes of a single-slice run leave the rendered canvas as it was."""
    viewer, widget = viewer_widget
    viewer.window.show()
    viewer.add_image(np.stack([cells_image] * 3), name="stack")
    viewer.dims.set_point(0, 1)
    run_and_wait(widget)
    viewer.reset_view()
    record = widget.current_record()
    viewer.dims.set_point(0, 0)  # a plane that was not computed
    for layer in record.outputs.values():
        layer.visible = False
    without = viewer.screenshot(canvas_only=True, flash=False)
    assert without[..., :3].max() > 0  # the image itself is drawn
    for kind in ("attention", "pvalue", "posterior", "regularized"):
        record.outputs[kind].visible = True
        record.outputs[kind].opacity = 1.0
        record.outputs[kind].colorbar.visible = False  # the colorbar is drawn on every plane
        record.outputs[kind].name_overlay.visible = False  # and so is its title
    with_maps = viewer.screenshot(canvas_only=True, flash=False)
    np.testing.assert_array_equal(with_maps, without)
    viewer.dims.set_point(0, 1)  # the computed plane does draw
    assert not np.array_equal(viewer.screenshot(canvas_only=True, flash=False), without)


def test_partly_failed_stack_shows_finished_planes_and_names_the_missing(
        viewer_widget, run_and_wait, cells_image, notifications):
    from napari.utils.notifications import NotificationSeverity

    viewer, widget = viewer_widget
    stack = np.stack([cells_image, np.full_like(cells_image, 7), cells_image[::-1]])
    viewer.add_image(stack, name="stack")
    widget.source.scope_combo.setCurrentText("all slices")
    outcome = run_and_wait(widget)
    assert outcome.status == "partial" and sorted(outcome.results) == [(0,), (2,)]
    assert "constant" in outcome.errors[(1,)]
    att = widget.current_record().outputs["attention"].data
    assert [not np.isnan(att[i]).all() for i in range(3)] == [True, False, True]
    warnings_ = [n.message for n in notifications if n.severity == NotificationSeverity.WARNING]
    assert any("Not computed: slice 1." in text for text in warnings_)  # not "(1,)"
    assert "Not computed: slice 1." in widget.run_panel.status_label.text()


def test_output_layers_carry_the_provenance_of_their_run(viewer_widget, run_and_wait, cells_image):
    from napari_attnreg.io.export import provenance

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells", metadata={"source_path": "/data/cells.tif"})
    run_and_wait(widget)
    record = widget.current_record()
    layer = record.outputs["regularized"]
    made = provenance(layer.metadata)
    assert made["source_image"] == "/data/cells.tif"
    assert made["package_version"] == record.any_result.metadata["package_version"]
    assert made["weights"] == record.any_result.metadata["weights"]
    assert made["n_boot"] == record.any_result.metadata["n_boot"] and made["seed"] is not None
    assert made["q_th"] == widget.thresholds()["q_th"]


UNITS_WARNING = "Inconsistent units across layers"


def _drawn(viewer, qtbot):
    """Let the canvas draw (napari checks the layers' units on a draw)."""
    viewer.window.show()
    qtbot.wait(150)


def test_outputs_take_the_units_of_the_source_and_warn_of_nothing(
        viewer_widget, run_and_wait, cells_image, notifications, qtbot):
    viewer, widget = viewer_widget
    image = viewer.add_image(cells_image, name="cells", scale=(0.25, 0.5), units=("µm", "µm"))
    _drawn(viewer, qtbot)
    run_and_wait(widget)
    _drawn(viewer, qtbot)
    record = widget.current_record()
    for kind in KINDS:
        assert record.outputs[kind].units == image.units, kind
    assert not [n for n in notifications if UNITS_WARNING in n.message]
    image.units = ("mm", "mm")  # the outputs follow the source's unit
    _drawn(viewer, qtbot)
    assert all(record.outputs[k].units == image.units for k in KINDS)
    assert str(record.outputs["regularized"].units[0]) == "millimeter"
    assert not [n for n in notifications if UNITS_WARNING in n.message]
    # the warning this test looks for is real: a layer in pixels beside them brings it
    viewer.add_image(cells_image, name="in pixels")
    _drawn(viewer, qtbot)
    assert [n for n in notifications if UNITS_WARNING in n.message]


def test_outputs_of_a_plain_array_stay_in_pixels(viewer_widget, run_and_wait, cells_image,
                                                 notifications, qtbot):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    _drawn(viewer, qtbot)
    outputs = widget.current_record().outputs
    assert {str(u) for k in KINDS for u in outputs[k].units} == {"pixel"}
    assert not [n for n in notifications if UNITS_WARNING in n.message]
