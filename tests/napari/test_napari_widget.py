"""End-to-end tests of the dock widget: run, re-run, cancel, thresholds, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg._napari.layers import KINDS, layer_name, token_grid
from napari_attnreg.core.run.api import regularize

pytestmark = pytest.mark.gui


def _outputs(viewer, name):
    return {kind: viewer.layers[layer_name(name, kind)] for kind in KINDS}


def test_run_adds_aligned_layers_matching_the_core(
    viewer_widget, run_and_wait, cells_image, tiny_backbone
):
    viewer, widget = viewer_widget
    image = viewer.add_image(cells_image, name="cells", scale=(0.5, 0.25), translate=(10.0, -3.0))
    outcome = run_and_wait(widget)
    assert outcome.ok
    layers = _outputs(viewer, "cells")
    result = widget.current_record().results[()]
    # the widget drives the core: the same options give the same maps
    direct = regularize(cells_image, tiny_backbone, n_boot=16, chunk_size=8, device="cpu", seed=0)
    np.testing.assert_allclose(result.attention, direct.attention)
    np.testing.assert_allclose(result.p, direct.p)
    for layer in layers.values():
        k = layer.metadata["attnreg"]["cells_per_token"]  # the significant outline: k×k per token
        assert k == (4 if layer is layers["significant"] else 1)
        assert layer.data.shape == (result.grid_shape[0] * k, result.grid_shape[1] * k)
        # pixel-edge corners coincide in world coordinates, whatever resize the model needed
        gh, gw = layer.data.shape
        h, w = cells_image.shape
        for tok, pix in (((-0.5, -0.5), (-0.5, -0.5)), ((gh - 0.5, gw - 0.5), (h - 0.5, w - 0.5))):
            np.testing.assert_allclose(layer.data_to_world(tok), image.data_to_world(pix))
        assert layer.metadata["attnreg"]["run"]["n_boot"] == 16
        assert layer.metadata["attnreg"]["source"] == "cells"
    # token (i, j) sits on the centre of its pixel footprint
    ts, tt = result.token_scale, result.token_translate
    for i, j in ((0, 0), (3, 5)):
        centre = (tt[0] + i * ts[0], tt[1] + j * ts[1])
        np.testing.assert_allclose(
            layers["attention"].data_to_world((i, j)), image.data_to_world(centre)
        )
    att = layers["attention"].data
    assert np.all(att > 0) and att.sum() < 1.0
    assert 0.0 <= layers["posterior"].data.min() and layers["posterior"].data.max() <= 1.0
    assert layers["pvalue"].data.min() >= 0.0
    np.testing.assert_allclose(layers["regularized"].data, result.regularized(), rtol=1e-6)
    # significant tokens are one editable class (label 1), not numbered regions
    np.testing.assert_array_equal(
        token_grid(layers["significant"].data), result.significant().astype(int)
    )
    np.testing.assert_array_equal(
        layers["significant"].data, np.kron(result.significant(), np.ones((4, 4), dtype=int))
    )
    assert (
        widget.run_panel.run_button.isEnabled() and not widget.run_panel.cancel_button.isEnabled()
    )


def test_rerun_updates_layers_in_place(viewer_widget, run_and_wait, cells_image):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    first = _outputs(viewer, "cells")
    before = first["attention"].data.copy()
    n_layers = len(viewer.layers)
    widget.options.controls["seed"].setValue(3)
    widget.options.controls["method"].setCurrentText("uniform")
    run_and_wait(widget)
    second = _outputs(viewer, "cells")
    assert len(viewer.layers) == n_layers
    assert all(second[k] is first[k] for k in KINDS)
    np.testing.assert_allclose(second["attention"].data, before)  # observed map is seed-free
    assert second["pvalue"].metadata["attnreg"]["run"]["method"] == "uniform"
    assert second["pvalue"].metadata["attnreg"]["run"]["seed"] == 3
    # renaming the input renames its outputs (the ones the analyst left alone)
    second["posterior"].name = "my posterior"
    viewer.layers["cells"].name = "field 1"
    assert viewer.layers["field 1 · attention"] is second["attention"]
    assert second["posterior"].name == "my posterior"
    assert second["attention"].metadata["attnreg"]["source"] == "field 1"


def test_an_output_layer_the_analyst_renamed_is_kept_by_a_rerun(
        viewer_widget, run_and_wait, cells_image, qtbot):
    """Renamed to keep a result ("uniform null"), an output layer was overwritten by the next
    run and given the dock's name back: the analyst's layer and maps were gone."""
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    widget.options.controls["method"].setCurrentText("uniform")
    run_and_wait(widget)
    first = _outputs(viewer, "cells")
    kept = first["pvalue"]
    kept.name = "cells · −log10 p, uniform null"
    before = kept.data.copy()
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):  # new thresholds: same maps
        widget.thresholds_panel.q_th_slider.setValue(0.3)
    first["regularized"].name = "cells · regularized, uniform null"
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.q_th_slider.setValue(0.2)
    assert first["regularized"].name == "cells · regularized, uniform null"  # name kept
    n_layers = len(viewer.layers)
    widget.options.controls["method"].setCurrentText("patch")
    run_and_wait(widget)
    assert kept in viewer.layers and kept.name == "cells · −log10 p, uniform null"
    np.testing.assert_array_equal(kept.data, before)
    assert first["regularized"].name == "cells · regularized, uniform null"
    second = _outputs(viewer, "cells")  # fresh layers for the new run's maps
    assert second["pvalue"] is not kept and second["attention"] is first["attention"]
    assert widget.current_record().outputs["pvalue"] is second["pvalue"]
    assert second["pvalue"].metadata["attnreg"]["run"]["method"] == "patch"
    assert len(viewer.layers) == n_layers + 2  # the two renamed ones stay beside them
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):  # the new run's, not theirs
        widget.thresholds_panel.q_th_slider.setValue(0.1)
    assert first["regularized"].name == "cells · regularized, uniform null"


def test_threshold_change_updates_layers_without_rerun(
    viewer_widget, run_and_wait, cells_image, qtbot
):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    result = widget.current_record().results[()]
    layers = _outputs(viewer, "cells")
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.rule_combo.setCurrentIndex(
            widget.thresholds_panel.rule_combo.findData("fwer")  # a rule of the step-down
        )
        widget.thresholds_panel.p_th_slider.setValue(0.05)
        widget.thresholds_panel.z_mask_check.setChecked(
            True
        )  # the default has no z mask
        widget.thresholds_panel.z_th_slider.setValue(-1.0)
    assert widget.worker is None
    assert widget.thresholds()["z_th"] == pytest.approx(-1.0)
    expected = result.regularized("fwer", p_th=0.05, z_th=-1.0)
    np.testing.assert_allclose(layers["regularized"].data, expected, rtol=1e-6)
    sig = result.significant("fwer", p_th=0.05, z_th=-1.0)
    np.testing.assert_array_equal(token_grid(layers["significant"].data) > 0, sig)
    assert layers["significant"].metadata["attnreg"]["thresholds"]["p_th"] == pytest.approx(0.05)
    # the threshold-free layers did not change
    np.testing.assert_allclose(layers["attention"].data, result.attention, rtol=1e-6)


def test_contrast_limits_the_analyst_sets_survive_threshold_moves_and_reruns(
    viewer_widget, run_and_wait, cells_image, qtbot
):
    """Contrast limits set in napari's layer controls stay: each threshold move set the
    regularized layer's back to the automatic ones (and a rerun the attention layer's),
    though a move does not change them. Limits the analyst left alone follow a rerun."""
    from napari_attnreg._napari.layers import contrast_limits

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    layers = _outputs(viewer, "cells")
    automatic = tuple(layers["attention"].contrast_limits)
    assert automatic[1] > 0.002
    layers["regularized"].contrast_limits = (0.0, 0.001)
    layers["attention"].contrast_limits = (0.0, 0.002)
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.q_th_slider.setValue(0.3)
    assert tuple(layers["regularized"].contrast_limits) == pytest.approx((0.0, 0.001))
    widget.options.controls["seed"].setValue(widget.options.controls["seed"].value() + 1)
    run_and_wait(widget)
    assert _outputs(viewer, "cells")["attention"] is layers["attention"]
    assert tuple(layers["attention"].contrast_limits) == pytest.approx((0.0, 0.002))
    assert tuple(layers["regularized"].contrast_limits) == pytest.approx((0.0, 0.001))
    assert tuple(layers["pvalue"].contrast_limits) == pytest.approx(
        contrast_limits(widget.current_record(), "pvalue"))  # left alone: the new run's


def test_cancel_mid_run_adds_nothing_and_keeps_layers(viewer_widget, qtbot, cells_image):
    from qtpy.QtCore import Qt

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    viewer.add_points([[5, 5]], name="my points")
    names = [layer.name for layer in viewer.layers]
    widget.options.controls["n_boot"].setValue(5000)
    widget.options.controls["chunk_size"].setValue(4)
    done: list[int] = []  # appended on the worker thread, so it is never behind the worker

    def record(item):
        if item.event is not None:
            done.append(item.event.done)

    with qtbot.waitSignal(widget.run_finished, timeout=60_000) as blocker:
        worker = widget.run()
        worker.yielded.connect(record, Qt.ConnectionType.DirectConnection)
        assert (
            not widget.run_panel.run_button.isEnabled()
            and widget.run_panel.cancel_button.isEnabled()
        )
        assert widget.run() is None  # a second run is refused while one runs
        qtbot.waitUntil(lambda: len(done) >= 3, timeout=30_000)
        done_at_cancel = done[-1]
        widget.cancel()
    outcome = blocker.args[0]
    assert outcome.status == "cancelled" and outcome.results == {}
    # it stops at the next chunk boundary: at most the chunk in flight is finished
    assert done[-1] - done_at_cancel <= 4
    assert [layer.name for layer in viewer.layers] == names
    assert widget.run_panel.run_button.isEnabled()


def test_a_cancelled_rerun_keeps_the_shown_result_s_summary(
        viewer_widget, run_and_wait, qtbot, cells_image):
    """Cancelling a rerun leaves the earlier result on screen, and the status line keeps its
    count under the note (it said only "Cancelled; nothing was added." over those maps)."""
    from qtpy.QtCore import Qt

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    widget.options.controls["n_boot"].setValue(5000)
    widget.options.controls["chunk_size"].setValue(4)
    done: list[int] = []
    with qtbot.waitSignal(widget.run_finished, timeout=60_000):
        worker = widget.run()
        worker.yielded.connect(lambda item: done.append(1), Qt.ConnectionType.DirectConnection)
        qtbot.waitUntil(lambda: len(done) >= 3, timeout=30_000)
        widget.cancel()
    text = widget.run_panel.status_label.text()
    assert text.startswith("Cancelled; nothing was added.")
    assert "patches significant" in text and "B=16" in text  # the earlier run's summary


def test_a_run_of_another_image_keeps_the_shown_result_s_summary(
        viewer_widget, run_and_wait, qtbot, cells_image):
    """A run of image B that ends while image A's result is shown says so above A's count
    (the note replaced A's summary, whose maps stay on screen)."""
    viewer, widget = viewer_widget
    first = viewer.add_image(cells_image, name="first")
    run_and_wait(widget)
    viewer.add_image(cells_image[::-1].copy(), name="second")
    with qtbot.waitSignal(widget.run_finished, timeout=60_000):
        assert widget.run() is not None
        widget.set_layer(first)
    text = widget.run_panel.status_label.text()
    assert text.startswith("Finished 'second'; choose it under Image")
    assert "patches significant" in text


def test_stale_result_of_cancelled_run_is_dropped(viewer_widget, qtbot, cells_image):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    n = len(viewer.layers)
    with qtbot.waitSignal(widget.run_finished, timeout=60_000) as blocker:
        widget.run()
        widget.cancel()  # before the first chunk: the observed map may already be done
    assert blocker.args[0].status == "cancelled"
    assert len(viewer.layers) == n


def test_activity_dock_quit_cancels_through_the_token(viewer_widget, qtbot, cells_image):
    """napari's activity-dock cancel calls worker.quit(): the generator must still end itself."""
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    widget.options.controls["n_boot"].setValue(5000)
    widget.options.controls["chunk_size"].setValue(4)
    with qtbot.waitSignal(widget.run_finished, timeout=60_000) as blocker:
        worker = widget.run()
        worker.quit()
    assert (
        blocker.args[0].status == "cancelled"
    )  # returned normally (not aborted) with a cancelled outcome
    assert len(viewer.layers) == 1


def test_bad_inputs_notify_and_leave_layers(
    viewer_widget, run_and_wait, notifications, cells_image, tmp_path
):
    from napari.utils.notifications import NotificationSeverity

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    before = {layer.name: layer.data.copy() for layer in viewer.layers}

    widget.set_layer(viewer.add_image(np.full((64, 64), 7.0), name="flat"))
    outcome = run_and_wait(widget)
    assert not outcome.ok and "constant" in outcome.message
    errors = [n for n in notifications if n.severity == NotificationSeverity.ERROR]
    assert errors and errors[-1].message == outcome.message

    widget.set_layer(viewer.layers["cells"])
    widget.model.source_combo.setCurrentIndex(widget.model.source_combo.findData("file"))
    widget.model.weights_edit.setText(str(tmp_path / "missing.safetensors"))
    widget.model.arch_edit.setText("vit_tiny_patch16_224")
    outcome = run_and_wait(widget)
    assert not outcome.ok and "missing.safetensors" in outcome.message
    assert notifications[-1].message == outcome.message

    widget.set_model(widget.model.custom_module)
    widget.options.controls["head"].setText("50")
    outcome = run_and_wait(widget)
    assert "Head 50 does not exist" in outcome.message

    assert [layer.name for layer in viewer.layers] == list(before) + ["flat"]
    for name, data in before.items():
        np.testing.assert_array_equal(viewer.layers[name].data, data)
    assert "flat · attention" not in viewer.layers


def test_a_crop_smaller_than_the_patch_grid_is_run_with_a_warning(
        make_napari_viewer, run_and_wait):
    """A 12x9 crop on the demo model (8-px patches at 128 px) fills a 16x12 patch grid with
    interpolated pixels: the run said nothing, and its patch map read as finer than the
    crop's own pixels. The dock's status line says it, and the crop layer is untouched."""
    from napari_attnreg._napari.widget import AttentionWidget

    viewer = make_napari_viewer()
    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget)
    assert widget.model_spec().source == "demo"
    widget.options.controls["n_boot"].setValue(8)
    widget.options.controls["device"].setCurrentText("cpu")
    crop = np.random.default_rng(0).integers(0, 255, (12, 9), dtype=np.uint8)
    layer = viewer.add_image(crop.copy(), name="crop")
    outcome = run_and_wait(widget)
    assert outcome.ok and widget.current_record().results[()].grid_shape == (16, 12)
    assert "This 12x9 image has fewer pixels than the model's 16x12 patch grid" in \
        widget.run_panel.status_label.text()
    np.testing.assert_array_equal(layer.data, crop)


def test_no_image_layer_notifies(viewer_widget, notifications):
    _viewer, widget = viewer_widget
    assert widget.run() is None
    assert "Add an image layer" in notifications[-1].message


def test_closing_the_last_image_says_to_add_one(viewer_widget, run_and_wait, cells_image):
    """With the only image closed after its run, the status line asks for an image (Run is
    disabled): it said "No result for this image yet: press Run", of no image."""
    viewer, widget = viewer_widget
    layer = viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    viewer.layers.remove(layer)
    text = widget.run_panel.status_label.text()
    assert "add an image layer" in text and "press Run" not in text
    assert not widget.run_panel.run_button.isEnabled()


def test_out_of_memory_shows_the_core_message(
    viewer_widget, run_and_wait, notifications, cells_image, monkeypatch
):
    from napari_attnreg.core.run import service
    message = (
        "Out of memory with a single null image per chunk; use a smaller target_size, "
        "a smaller model, or device='cpu'."
    )

    def oom(*args, **kwargs):
        raise MemoryError(message)
        yield  # a generator, like run_engine

    monkeypatch.setattr(service, "run_engine", oom)
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    outcome = run_and_wait(widget)
    assert outcome.status == "failed" and message in outcome.message
    assert outcome.message.startswith("Out of memory")  # the core's one rule for this error
    assert notifications[-1].message == outcome.message
    assert [layer.name for layer in viewer.layers] == ["cells"]


def test_outputs_follow_rotated_sheared_affine_image(viewer_widget, run_and_wait, cells_image):
    viewer, widget = viewer_widget
    affine = np.array([[1.0, 0.2, 5.0], [0.0, 0.8, -2.0], [0.0, 0.0, 1.0]])
    image = viewer.add_image(
        cells_image,
        name="tilted",
        scale=(0.7, 1.3),
        translate=(4.0, 9.0),
        rotate=25.0,
        shear=[0.3],
        affine=affine,
    )
    run_and_wait(widget)
    result = widget.current_record().results[()]
    ts, tt = result.token_scale, result.token_translate
    for name in ("tilted · attention", "tilted · significant"):
        layer = viewer.layers[name]
        k = layer.metadata["attnreg"]["cells_per_token"]
        for i, j in ((0, 0), (2, 7), (result.grid_shape[0] - 1, 1)):
            cell = (i * k + (k - 1) / 2, j * k + (k - 1) / 2)  # centre of the token's k×k cells
            np.testing.assert_allclose(
                layer.data_to_world(cell),
                image.data_to_world((tt[0] + i * ts[0], tt[1] + j * ts[1])),
                atol=1e-9,
            )
