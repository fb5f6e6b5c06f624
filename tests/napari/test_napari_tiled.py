"""Tiled runs from the dock widget: native token grid, layers on the image, progress, cancel."""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg._napari.layers import KINDS, layer_name
from napari_attnreg.core.run.engine import RunConfig
from napari_attnreg.core.run.tiling import work_shape

pytestmark = pytest.mark.gui

PATCH = (8, 8)  # the bundled demo model: patch 8, 128 px input


def _field(shape: tuple[int, int]) -> np.ndarray:
    """A large uint16 field of bright blobs on noise."""
    rng = np.random.default_rng(2)
    yy, xx = np.mgrid[0:shape[0], 0:shape[1]]
    img = 300 + 40 * rng.standard_normal(shape)
    for cy, cx in rng.uniform(0, 1, (12, 2)) * np.asarray(shape):
        img += 2500 * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 80)
    return np.clip(img, 0, 65535).astype(np.uint16)


@pytest.fixture
def demo_widget(make_napari_viewer):
    """(viewer, widget) on the bundled demo model, CPU, a small B."""
    from napari_attnreg._napari.widget import AttentionWidget

    viewer = make_napari_viewer()
    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Attention Regularization")
    assert widget.model_spec().source == "demo"
    widget.options.controls["n_boot"].setValue(8)
    widget.options.controls["device"].setCurrentText("cpu")
    return viewer, widget


def test_tiling_controls_follow_the_checkbox_and_the_core(demo_widget):
    from napari_attnreg._napari.option_controls import value_of
    from napari_attnreg.core.run.options import option

    _viewer, widget = demo_widget
    defaults = RunConfig()
    controls = widget.options.controls
    tiled, overlap, scale = controls["tiled"], controls["tile_overlap"], controls["tile_scale"]
    assert tiled.text() == option("tiled").label and tiled.toolTip() == option("tiled").help
    assert tiled.isChecked() == defaults.tiled
    assert value_of(overlap, option("tile_overlap")) == defaults.tile_overlap  # None: a quarter
    assert scale.value() == pytest.approx(defaults.tile_scale)
    for control, name in ((scale, "tile_scale"), (overlap, "tile_overlap")):
        opt = option(name)  # ranges and help from the core's option metadata
        empty = 1 if opt.allow_none else 0  # one step below the minimum stands for "empty"
        assert (control.minimum() + empty, control.maximum()) == (opt.minimum, opt.maximum)
        assert control.toolTip() == opt.help
    assert not overlap.isEnabled() and controls["target_size"].isEnabled()
    scale.setValue(2.0)
    config = widget.run_config()
    assert not config.tiled and config.tile_scale == defaults.tile_scale  # nothing stale when off
    tiled.setChecked(True)
    assert overlap.isEnabled() and scale.isEnabled()
    assert not controls["target_size"].isEnabled()
    overlap.setValue(16)
    config = widget.run_config()
    assert config.tiled and config.tile_overlap == 16 and config.tile_scale == 2.0


@pytest.mark.parametrize(("shape", "overlap", "scale"), [
    ((600, 400), 0, 1.0),
    ((1000, 700), 0, 1.0),  # 700 px is not whole patches: tokens are 8 x 7.95 image pixels
    ((1000, 700), 16, 2.0),
])
def test_tiled_run_gives_native_grid_aligned_with_the_image(demo_widget, run_and_wait, shape,
                                                            overlap, scale):
    viewer, widget = demo_widget
    image = viewer.add_image(_field(shape), name="field", scale=(0.5, 0.25), translate=(10.0, -3.0))
    widget.options.controls["tiled"].setChecked(True)
    widget.options.controls["tile_overlap"].setValue(overlap)
    widget.options.controls["tile_scale"].setValue(scale)
    outcome = run_and_wait(widget, timeout=240_000)
    assert outcome.ok
    result = widget.current_record().results[()]
    md = result.metadata
    assert md["tiled"] is True and md["null_scope"] == "image"
    assert (md["tile_overlap"], md["tile_scale"]) == (overlap, scale)
    work = work_shape(shape, PATCH, scale)
    assert result.grid_shape == (work[0] // PATCH[0], work[1] // PATCH[1])
    if shape == (600, 400):
        assert result.grid_shape == (75, 50)  # one token per 8x8 pixels of the image itself
    assert md["forward_passes"] == md["n_tiles"] + 8 and md["n_tiles"] > 1
    assert result.image_shape == shape
    h, w = shape
    for kind in KINDS:
        layer = viewer.layers[layer_name("field", kind)]
        assert layer.metadata["attnreg"]["run"]["tiled"] is True
        gh, gw = layer.data.shape
        # the layer's world extent is the image's: pixel-edge corners coincide
        for tok, pix in (((-0.5, -0.5), (-0.5, -0.5)), ((gh - 0.5, gw - 0.5), (h - 0.5, w - 0.5)),
                         ((-0.5, gw - 0.5), (-0.5, w - 0.5))):
            np.testing.assert_allclose(layer.data_to_world(tok), image.data_to_world(pix),
                                       atol=1e-9)
    assert "tiled" in widget.run_panel.status_label.text()


def test_cancel_during_a_tiled_run_adds_nothing(demo_widget, qtbot):
    from qtpy.QtCore import Qt

    viewer, widget = demo_widget
    viewer.add_image(_field((600, 400)), name="field")
    names = [layer.name for layer in viewer.layers]
    widget.options.controls["tiled"].setChecked(True)
    widget.options.controls["tile_overlap"].setValue(0)  # side by side: 20 tiles
    widget.options.controls["n_boot"].setValue(2000)
    widget.options.controls["chunk_size"].setValue(2)
    events: list = []  # appended on the worker thread, so it is never behind the worker

    def record(item):
        if item.event is not None:
            events.append(item.event)

    with qtbot.waitSignal(widget.run_finished, timeout=120_000) as blocker:
        worker = widget.run()
        worker.yielded.connect(record, Qt.ConnectionType.DirectConnection)
        assert widget.run_panel.cancel_button.isEnabled()
        # progress moves per chunk through the tiles and then the nulls
        qtbot.waitUntil(lambda: any(e.stage == "nulls" for e in events), timeout=120_000)
        done_at_cancel = events[-1].done
        widget.cancel()
    outcome = blocker.args[0]
    assert outcome.status == "cancelled" and outcome.results == {}
    stages = [e.stage for e in events]
    assert stages.count("observed") >= 10  # 20 tiles in chunks of 2
    assert all(e.total == 20 + 2000 for e in events)  # n_tiles + B forward passes
    fractions = [e.fraction for e in events]
    assert fractions == sorted(fractions) and fractions[-1] < 0.5
    assert events[-1].done - done_at_cancel <= 2  # stopped at the next chunk boundary
    assert [layer.name for layer in viewer.layers] == names
    assert widget.run_panel.run_button.isEnabled() and widget.current_record() is None


def test_a_labels_layer_painted_as_the_tissue_mask_is_no_roi_layer(demo_widget, run_and_wait):
    """A Labels layer the analyst paints is taken up as the ROI layer when added; named as a
    tiled run's Tissue mask it is the tissue, not ROIs (the ROI table showed the tissue as its
    one ROI, and the Shapes layer drawn next was not chosen). Chosen by hand, it stays."""
    viewer, widget = demo_widget
    image = viewer.add_image(_field((256, 256)), name="field")
    tissue = viewer.add_labels(np.zeros((256, 256), np.uint8), name="tissue")
    tissue.data[20:230, 10:200] = 1
    roi = widget.roi_panel
    assert roi.current_layer() is tissue  # taken up: nothing told it what the layer is for
    widget.set_layer(image)
    widget.options.controls["tiled"].setChecked(True)
    widget.options.controls["tissue_mask"].setText("tissue")
    run_and_wait(widget)
    assert widget.current_record().results[()].metadata["tissue_mask"] == "Labels layer 'tissue'"
    assert roi.current_layer() is None and roi.rows == []
    assert "'tissue' is the run's tissue mask" in roi.status.text()
    drawn = viewer.add_shapes([np.array([[30, 30], [30, 90], [90, 90], [90, 30]])],
                              name="my ROIs")
    assert roi.current_layer() is drawn and [row["label"] for row in roi.rows] == [1]
    roi.layer_combo.setCurrentIndex(roi.layer_combo.findText("tissue"))  # by hand
    run_and_wait(widget)
    assert roi.current_layer() is tissue and [row["label"] for row in roi.rows] == [1]



def _tissue_layers(viewer):
    return [lay for lay in viewer.layers
            if isinstance(lay.metadata, dict) and "tissue" in lay.metadata]


def _masks(viewer):
    """The Labels layers other than the runs' significant labels."""
    from napari.layers import Labels

    return [lay for lay in viewer.layers if isinstance(lay, Labels) and " · " not in lay.name]


def _run_with_mask_file(widget, run_and_wait, tmp_path):
    """A tiled run on a mask file: the run shows the mask it used as 'field tissue'."""
    mask = np.zeros((256, 256), np.uint8)
    mask[10:240, 30:220] = 1
    np.save(tmp_path / "mask.npy", mask)
    widget.options.controls["tiled"].setChecked(True)
    widget.options.controls["tissue_mask"].setText(str(tmp_path / "mask.npy"))
    run_and_wait(widget)


def test_a_painted_tissue_mask_is_the_mask_shown_and_stays_as_painted(
        demo_widget, run_and_wait, tmp_path):
    """A tiled run whose Tissue mask is the analyst's painted Labels layer added its own
    'field tissue' layer (the same mask at coarse pixels) above it: two masks over the image."""
    viewer, widget = demo_widget
    image = viewer.add_image(_field((256, 256)), name="field")
    _run_with_mask_file(widget, run_and_wait, tmp_path)
    (file_mask,) = _tissue_layers(viewer)
    assert file_mask.name == "field tissue"
    painted = viewer.add_labels(np.zeros((256, 256), np.uint8), name="painted")
    painted.data[20:230, 10:200] = 1
    before = painted.data.copy()
    widget.set_layer(image)
    widget.options.controls["tissue_mask"].setText("painted")
    run_and_wait(widget)
    assert widget.current_record().results[()].metadata["tissue_mask"] == \
        "Labels layer 'painted'"
    assert _tissue_layers(viewer) == []  # the file's mask went: this run did not use it
    assert _masks(viewer) == [painted]
    np.testing.assert_array_equal(painted.data, before)
    assert painted.name == "painted" and painted.visible
    run_and_wait(widget)  # a re-run on the same painted mask adds nothing either
    assert _masks(viewer) == [painted]


def test_an_earlier_runs_tissue_layer_named_as_the_mask_is_kept(
        demo_widget, run_and_wait, tmp_path):
    """Named as the next run's Tissue mask, the mask layer an earlier run added was removed
    by that run as an old mask (the analyst's chosen mask gone, no mask shown)."""
    viewer, widget = demo_widget
    viewer.add_image(_field((256, 256)), name="field")
    _run_with_mask_file(widget, run_and_wait, tmp_path)
    (file_mask,) = _tissue_layers(viewer)
    before = file_mask.data.copy()
    widget.options.controls["tissue_mask"].setText(file_mask.name)
    outcome = run_and_wait(widget)
    assert outcome.ok
    assert _masks(viewer) == [file_mask]
    np.testing.assert_array_equal(file_mask.data, before)
