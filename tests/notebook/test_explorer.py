"""AttentionExplorer without a browser: state ↔ controls, runs, live thresholds, cancel, ROIs.

The explorer renders everything into one uint8 array (``explorer.rendered``) and sends
exactly that to the view, so "what the user sees" is checked on pixels, not on internals.
"""

from __future__ import annotations

import asyncio
import csv

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run import service as service_module
from napari_attnreg.notebook import (
    AttentionExplorer,
    render,
)


@pytest.fixture
def explorer(blob_image, tiny_backbone):
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=12, device="cpu", view="image")
    yield ex
    ex.close()


def test_controls_and_state_are_linked(explorer):
    c = explorer.controls
    c["method"].value = "uniform"
    c["n_boot"].value = 7
    c["seed"].value = 3
    c["overlay"].value = "posterior"
    assert (explorer.method, explorer.n_boot, explorer.seed, explorer.overlay) == (
        "uniform", 7, 3, "posterior")
    explorer.p_th = 0.05  # setting state from code moves the slider
    assert c["p_th"].value == pytest.approx(0.05)
    assert "device" in c and "cpu" in c["device"].options
    assert explorer.buttons["cancel"].disabled and not explorer.buttons["run"].disabled
    with pytest.raises(Exception, match="p_th must be a finite number in"):
        explorer.p_th = 1.5
    with pytest.raises(ValueError, match="Unknown colormap"):
        explorer.colormap = "no-such-map"


def test_run_gives_result_status_timings_and_save(explorer, tmp_path):
    # the paper's lfdr rule keeps tokens even for this random model (the directional q rule
    # keeps none, so its regularized overlay would leave the image bare)
    explorer.preset = "paper"
    before = explorer.rendered.copy()
    result = explorer.run(wait=True)
    assert isinstance(result, AttentionResult)
    assert result.metadata["n_boot"] == 12 and result.grid_shape == (14, 12)
    assert explorer.status.startswith("Done in") and "nulls" in explorer.status
    assert explorer.run_panel.progress.value == 1.0
    # the overlay now covers the image, and the view was sent exactly the rendered pixels
    assert not np.array_equal(before, explorer.rendered)
    np.testing.assert_array_equal(explorer.canvas.view.displayed(), explorer.rendered)
    explorer.p_th = 0.2
    assert explorer.result.thresholds["p_th"] == pytest.approx(0.2)
    loaded = AttentionResult.load(explorer.save(tmp_path / "run.npz"))
    np.testing.assert_allclose(loaded.attention, explorer.result.attention)
    assert loaded.thresholds["p_th"] == pytest.approx(0.2)


def test_thresholds_rerender_without_recomputing(explorer, monkeypatch):
    explorer.preset = "directional"  # the p rule and its threshold
    explorer.run(wait=True)
    calls = []
    monkeypatch.setattr(service_module, "run_engine",
                        lambda *a, **k: calls.append(1) or iter(()))
    explorer.rule = "p"
    explorer.p_th = 1.0
    loose = explorer.rendered.copy()
    kept_loose = int(explorer.result.significant().sum())
    explorer.p_th = 0.0  # nothing survives: the regularized overlay disappears
    strict = explorer.rendered.copy()
    assert kept_loose > 0 and int(explorer.result.significant().sum()) == 0
    assert not np.array_equal(loose, strict)
    assert "0/168" in explorer.summary_panel.summary.value
    explorer.overlay = "attention"
    explorer.outline = False
    explorer.opacity = 0.0  # a transparent overlay shows the bare image
    np.testing.assert_array_equal(explorer.rendered, render.composite(explorer.image_panel.base))
    assert calls == []


def test_cancel_stops_a_background_run(blob_image, tiny_backbone):
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=4000, chunk_size=4, device="cpu",
                           view="image")
    ex.n_boot = 4
    previous = ex.run(wait=True)
    ex.n_boot = 4000
    seen: list[float] = []

    async def scenario():
        assert ex.run() is None  # returns at once: the run continues on the loop
        assert ex.running and not ex.buttons["cancel"].disabled
        while len(seen) < 3:
            await asyncio.sleep(0.01)
            if ex.run_panel.progress.value > 0:
                seen.append(ex.run_panel.progress.value)
        ex.buttons["cancel"].click()
        return await ex.wait()

    result = asyncio.run(scenario())
    assert not ex.running
    # the cancelled run is dropped; the previous result stays displayed and usable
    assert result is not None and result.metadata["n_boot"] == 4
    np.testing.assert_allclose(result.attention, previous.attention)
    assert ex.status.startswith("Cancelled") and "previous result is still shown" in ex.status
    assert ex.run_panel.progress.value < 0.5 and ex.run_panel.progress.bar_style == "warning"
    assert seen == sorted(seen)
    ex.close()


def test_bad_input_and_failed_model_keep_the_previous_result(explorer):
    explorer.run(wait=True)
    shown = explorer.rendered.copy()
    explorer.set_image(np.zeros(5))
    assert "at least 2 axes" in explorer.status  # the core's PlaneStack message
    np.testing.assert_array_equal(explorer.rendered, shown)

    explorer.model_name = "/nonexistent/weights.safetensors"
    assert explorer.run(wait=True) is None
    assert explorer.run_panel.status.value.count("c62828") == 1  # shown as an error
    assert "weights.safetensors" in explorer.status and "previous result is kept" in explorer.status
    assert explorer.result is not None
    np.testing.assert_array_equal(explorer.rendered, shown)

    explorer.n_boot = 12
    explorer.model_name = "VisionTransformer"  # the model object passed in is still usable
    assert explorer.run(wait=True) is not None


@pytest.mark.parametrize("kind", ["rgb8", "gray16", "float"])
def test_grayscale_rgb_and_16bit(kind, blob_image, tiny_backbone):
    if kind == "rgb8":
        img = np.stack([blob_image >> 8] * 3, axis=-1).astype(np.uint8)
    elif kind == "gray16":
        img = blob_image
    else:
        img = blob_image.astype(np.float32) / 7.0
    ex = AttentionExplorer(img, tiny_backbone, n_boot=4, device="cpu", view="image")
    assert ex.run(wait=True) is not None, ex.status
    assert ex.rendered.shape == (96, 80, 3) and ex.result.image_shape == (96, 80)
    ex.close()


def test_nd_stack_asks_for_a_slice(blob_image, tiny_backbone):
    stack = np.stack([blob_image, blob_image[::-1], blob_image[:, ::-1]])
    ex = AttentionExplorer(stack, tiny_backbone, n_boot=4, device="cpu", view="image")
    assert "choose the plane" in ex.status and len(ex.image_panel.sliders) == 1
    ex.image_panel.sliders[0].value = 2
    assert ex.slice_index == (2,)
    result = ex.run(wait=True)
    assert result.metadata["slice"] == [2] and result.image_shape == (96, 80)
    ex.image_panel.sliders[0].value = 0  # another plane: no overlay of plane 2 on it
    assert ex._current_result() is None and "press Run" in ex.status
    ex.close()



@pytest.mark.parametrize(("layout", "names"), [
    ({"imagej": True, "metadata": {"axes": "TZYX"}}, ["T", "Z"]),
    ({"ome": True, "metadata": {"axes": "ZTYX"}}, ["Z", "T"]),
    ({}, ["axis 0", "axis 1"])], ids=["imagej", "ome", "plain"])
def test_stack_sliders_are_named_as_the_file_names_its_axes(blob_image, tmp_path, layout,
                                                            names):
    # a hyperstack's sliders read "axis 0", "axis 1": which was time and which depth was
    # left to guess from the lengths
    tifffile = pytest.importorskip("tifffile")
    stack = np.stack([np.stack([blob_image] * 4)] * 3)  # (3, 4, H, W)
    path = tmp_path / "stack.tif"
    tifffile.imwrite(path, stack, **layout)
    ex = AttentionExplorer(str(path), "demo", view="image")
    sliders = ex.image_panel.sliders
    assert [s.description for s in sliders] == names
    assert [s.max for s in sliders] == [2, 3]
    if layout:
        assert "time (T)" in next(s.tooltip for s in sliders if s.description == "T")
    ex.close()
    ex = AttentionExplorer(stack, "demo", view="image")  # an array names no axis
    assert [s.description for s in ex.image_panel.sliders] == ["axis 0", "axis 1"]
    ex.close()

def test_roi_mask_table_and_csv(blob_image, tiny_backbone, tmp_path):
    roi = np.zeros(blob_image.shape, dtype=bool)
    roi[15:45, 5:35] = True
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=8, device="cpu", view="image",
                           roi=roi)
    assert "run the analysis" in ex.roi_panel.table.value
    ex.run(wait=True)
    label = ex.add_roi(rectangle=(60, 50, 85, 75))
    assert label == 2
    rows = ex.roi_table()
    assert [r["label"] for r in rows] == [1, 2] and rows[0]["area_px"] == 900
    assert ex.roi_panel.table.value.count("<tr>") == 3  # header + 2 ROIs
    assert "Mean evidence</th>" in ex.roi_panel.table.value  # the step-down's soft map
    path = ex.export_roi_csv(tmp_path / "rois.csv")
    with open(path, newline="") as fh:
        assert [row["label"] for row in csv.DictReader(fh)] == ["1", "2"]
    ex.clear_rois()
    with pytest.raises(ValueError, match="No ROI statistics"):
        ex.export_roi_csv(tmp_path / "none.csv")
    ex.close()


def test_drawing_a_rectangle_with_the_mouse_adds_an_roi(blob_image, tiny_backbone):
    pytest.importorskip("ipympl")
    from matplotlib.testing.widgets import click_and_drag

    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=4, device="cpu", view="ipympl")
    ex.draw_mode = "rectangle"
    click_and_drag(ex.canvas.view.rectangle, start=(10, 20), end=(40, 50))  # (x, y) data coords
    labels = ex.roi_labels
    assert labels is not None and labels.max() == 1
    rows, cols = np.nonzero(labels)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (20, 50, 10, 40)
    ex.draw_mode = "polygon"
    assert not ex.canvas.view.rectangle.get_active() and ex.canvas.view.polygon.get_active()
    ex.close()
