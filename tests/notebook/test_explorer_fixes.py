"""Defects analysts hit in the explorer (issues #8, #12), one regression test each."""

from __future__ import annotations

import asyncio
import csv
import gc
import html
import sys

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

import traitlets

from napari_attnreg import __version__
from napari_attnreg.core.results.display import ROI_COLUMN_HELP, ROI_COLUMNS
from napari_attnreg.core.run.images import prepare_image
from napari_attnreg.io.export import PROVENANCE_FIELDS
from napari_attnreg.notebook import AttentionExplorer


def _px(css: str) -> int:
    assert css.endswith("px"), css
    return int(css[:-2])


@pytest.fixture
def explorer(blob_image, tiny_backbone):
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=8, device="cpu", view="image")
    yield ex
    ex.close()


def test_threshold_sliders_are_wide_with_a_readout(explorer):
    for key in ("q_th", "p_th", "l_th", "z_th"):
        slider = explorer.controls[key]
        # what is left after the label and the readout (about 80 px) is the track
        track = _px(slider.layout.width) - _px(slider.style.description_width) - 80
        assert track >= 330, (key, slider.layout.width)
        assert slider.readout and not slider.continuous_update
        assert slider.tooltip
    lfdr = explorer.controls["l_th"]
    lfdr_track = _px(lfdr.layout.width) - _px(lfdr.style.description_width) - 80
    assert (lfdr.max - lfdr.min) / lfdr_track * 60 < 0.2  # was 0.30 → 0.00 over 60 px


def test_roi_table_has_human_headers_and_the_csv_carries_provenance(
        blob_image, tiny_backbone, tmp_path):
    roi = np.zeros(blob_image.shape, dtype=bool)
    roi[15:45, 5:35] = True
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=8, seed=5, device="cpu",
                           view="image", roi=roi, name="blobs.tif")
    ex.run(wait=True)
    ex.p_th = 0.2
    table = ex.roi_panel.table.value
    # the core's column labels (core.display.ROI_COLUMNS) with their help as header tooltips
    assert f">{ROI_COLUMNS['area_px']}</th>" in table
    assert f">{ROI_COLUMNS['fisher_p']}</th>" in table
    assert f"title='{html.escape(ROI_COLUMN_HELP['fisher_p'])}'" in table
    assert "area_px" not in table and "frac_significant" not in table
    # the attention enrichment with its interval leads (before the odds ratio), as in napari;
    # a step-down run of a random ViT has too few significant patches for the Fisher test
    ratio = table.index(f">{ROI_COLUMNS['attention_enrichment']}</th>")
    assert ratio < table.index(f">{ROI_COLUMNS['attention_enrichment_low']}</th>") \
        < table.index(f">{ROI_COLUMNS['odds_ratio']}</th>")
    assert "<td>too few significant patches</td>" in table
    with open(ex.export_roi_csv(tmp_path / "rois.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 1 and rows[0]["label"] == "1" and rows[0]["area_px"] == "900"
    row = rows[0]
    assert row["source_image"] == "blobs.tif" and row["model"] == "VisionTransformer"
    assert (row["preset"], row["rule"], row["n_boot"], row["seed"]) == ("stepdown", "forwardstop",
                                                                        "8", "5")
    assert float(row["p_th"]) == pytest.approx(0.2)  # the thresholds in force when exported
    low, high = float(row["attention_enrichment_low"]), float(row["attention_enrichment_high"])
    assert low < float(row["attention_enrichment"]) < high
    assert row["package_version"] == __version__
    assert set(PROVENANCE_FIELDS) <= set(row)  # the one provenance record (io.export)
    ex.close()


def test_slice_change_mid_run_keeps_the_result_with_its_plane(blob_image, tiny_backbone):
    stack = np.stack([blob_image, blob_image[::-1], blob_image[:, ::-1]])
    ex = AttentionExplorer(stack, tiny_backbone, n_boot=300, chunk_size=4, device="cpu",
                           view="image")
    ex.image_panel.sliders[0].value = 2

    async def scenario():
        assert ex.run() is None
        while ex.run_panel.progress.value == 0:
            await asyncio.sleep(0.01)
        ex.image_panel.sliders[0].value = 0  # the analyst looks at another plane mid-run
        return await ex.wait()

    result = asyncio.run(scenario())
    assert result is not None and result.metadata["slice"] == [2]
    # plane 0 is on screen: no overlay of plane 2 on it, and the status says where it went
    assert ex.slice_index == (0,) and ex._current_result() is None
    assert ex.canvas.result is None and ex.summary_panel.summary.value == ""
    assert "Done (plane (2,))" in ex.status and "looking at plane (0,)" in ex.status
    bare = ex.rendered.copy()
    ex.image_panel.sliders[0].value = 2  # back to the analysed plane: its overlay is shown
    assert ex._current_result() is result or ex._current_result().metadata["slice"] == [2]
    assert ex.canvas.result is not None and ex.summary_panel.summary.value
    assert ex.rendered.shape == bare.shape
    ex.close()


def test_nan_image_gets_the_cores_nan_message(blob_image, tiny_backbone):
    img = blob_image.astype(np.float32)
    img[3, 4] = np.nan
    with pytest.raises(ValueError) as core:
        prepare_image(img, patch_size=(16, 16), mean=(0.5,), std=(0.5,))
    ex = AttentionExplorer(img, tiny_backbone, view="image", device="cpu")
    assert ex.status == str(core.value)
    assert "NaN" in ex.status and "constant" not in ex.status
    assert ex.run(wait=True) is None and ex.result is None
    ex.close()


@pytest.mark.parametrize("shape", [(0, 0), (0, 64, 64), (64, 0)])
def test_empty_image_is_a_clear_message_not_an_index_error(shape, tiny_backbone):
    ex = AttentionExplorer(np.zeros(shape), tiny_backbone, view="image", device="cpu")
    assert "empty" in ex.status and str(shape) in ex.status
    assert ex.run(wait=True) is None and "No usable image" in ex.status
    with pytest.raises(ValueError, match="no usable image"):  # not AttributeError
        ex.add_roi(rectangle=(1, 1, 5, 5))
    with pytest.raises(ValueError, match="no usable image"):
        ex.set_roi(np.ones((4, 4), bool))
    ex.close()


def test_add_roi_after_a_rejected_image(tiny_backbone):
    ex = AttentionExplorer(np.zeros(5), tiny_backbone, view="image", device="cpu")
    assert "at least 2 axes" in ex.status
    assert ex.buttons["run"].disabled and "usable image" in ex.buttons["run"].tooltip
    with pytest.raises(ValueError, match="set_image"):
        ex.add_roi(rectangle=(1, 1, 5, 5))
    ex.clear_rois()  # clearing nothing is fine
    ex.set_image(np.ones((32, 32)) + np.eye(32))
    assert not ex.buttons["run"].disabled and ex.status.startswith("Ready")
    ex.close()


@pytest.mark.parametrize("value", [0, -5, 1.5, True])
def test_max_display_must_be_a_positive_whole_number(value, blob_image, tiny_backbone):
    with pytest.raises(ValueError, match="max_display must be a whole number"):
        AttentionExplorer(blob_image, tiny_backbone, view="image", max_display=value)


def test_unavailable_device_leaves_state_and_dropdown_consistent(explorer):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("cuda exists here")
    explorer.device = "cpu"
    with pytest.raises(traitlets.TraitError, match="not available on this machine"):
        explorer.device = "cuda"
    assert explorer.device == "cpu" and explorer.controls["device"].value == "cpu"
    assert "cuda" not in explorer.controls["device"].options
    with pytest.raises(traitlets.TraitError, match="not available"):
        AttentionExplorer(np.ones((32, 32)), "demo", device="cuda", view="image")


def test_failed_constructions_print_no_del_errors(blob_image, tiny_backbone, monkeypatch):
    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    bad = [dict(max_display=0), dict(view="3d"), dict(colormap="nope"), dict(bogus=1),
           dict(device="tpu")]
    for kwargs in bad:
        with pytest.raises((ValueError, TypeError, traitlets.TraitError)):
            AttentionExplorer(blob_image, tiny_backbone, **kwargs)
    gc.collect()
    assert [u.exc_value for u in unraisable] == []


def test_pixels_changed_in_place_mid_run_drop_the_result(blob_image, tiny_backbone):
    img = blob_image.copy()
    ex = AttentionExplorer(img, tiny_backbone, n_boot=300, chunk_size=4, device="cpu",
                           view="image")

    async def scenario():
        assert ex.run() is None
        while ex.run_panel.progress.value == 0:
            await asyncio.sleep(0.01)
        img[:] = img[::-1]  # the analyst's array is edited while the run computes
        return await ex.wait()

    assert asyncio.run(scenario()) is None
    assert "changed during the run" in ex.status and ex.canvas.result is None
    ex.close()


def test_model_picker_names_become_service_model_specs(tiny_backbone, tmp_path):
    from napari_attnreg.notebook.pipeline import model_spec

    assert model_spec("demo", arch=None, given=None).source == "demo"
    assert model_spec("uni", arch=None, given=None).source == "catalogue"
    weights = tmp_path / "w.safetensors"
    spec = model_spec(str(weights), arch="vit_small_patch16_224", given=None)
    assert (spec.source, spec.arch) == ("file", "vit_small_patch16_224")
    assert model_spec("vit_small_patch16_224", arch=None, given=None).source == "timm"
    spec = model_spec(tiny_backbone.name, arch=None, given=tiny_backbone)
    assert spec.source == "module" and spec.module is tiny_backbone


def test_the_image_column_never_shrinks_below_the_image(explorer):
    image_area, side = explorer.children[0].children
    # a flex row shrank the 560 px canvas (+ toolbar) and cut off its right edge
    assert image_area.layout.flex == "0 0 auto"
    assert _px(image_area.layout.min_width) >= 560 + 40
    assert _px(side.layout.min_width) >= 360  # the side panel's controls are 360 px wide


def test_a_stacks_sliders_wrap_within_the_image_column(blob_image):
    # two 360 px sliders side by side widened the image column past 1280 px in JupyterLab:
    # Run, the options and the exports went under the image
    stack = np.stack([np.stack([blob_image] * 3)] * 2)
    ex = AttentionExplorer(stack, "demo", view="image", width=560)
    image_area, _side = ex.children[0].children
    panel = ex.image_panel
    assert panel in image_area.children and len(panel.sliders) == 2
    assert panel.layout.flex_flow == "row wrap"
    assert _px(panel.layout.max_width) <= _px(image_area.layout.min_width)
    assert 2 * _px(panel.sliders[0].layout.width) > _px(panel.layout.max_width)  # two rows
    ex.close()


def test_the_export_buttons_fit_their_labels_and_the_side_panel(explorer):
    # "Export figure" at 120 px read "Export fig…" in JupyterLab
    for row in explorer.export_panel.children:
        box, button = row.children
        assert _px(button.layout.width) >= 8 * len(button.description) + 30  # icon + text
        assert _px(box.layout.width) + _px(button.layout.width) <= 360


def test_an_outcome_of_an_older_task_is_dropped(explorer):
    from napari_attnreg.core.run.service import Outcome

    first = explorer.run(wait=True)
    explorer.n_boot = 9
    second = explorer.run(wait=True)
    assert explorer.run_panel.task_id == 2 and explorer.result.metadata["n_boot"] == 9
    # a late outcome of task 1 (e.g. a worker that finished after a newer run began)
    runs = explorer.runs
    runs.pending = ((), runs.generation, runs.fingerprint(()))
    runs.finish(Outcome(task_id=1, results={(): first}))
    assert explorer.result.metadata["n_boot"] == 9 and explorer._current_result() is second


def test_every_control_has_a_tooltip(explorer):
    controls = {**explorer.controls, **explorer.buttons,
                **explorer.options_panel.advanced.controls}
    picker = controls.pop("model")
    missing = [name for name, c in controls.items() if not c.tooltip]
    assert missing == [] and picker.dropdown.tooltip and picker.other.tooltip


def test_another_image_after_a_result_with_rois_replaces_both(tiny_backbone):
    # a result with a region, then a larger image: the old regions' label image was drawn
    # on the new canvas and set_image raised an IndexError half-way
    rng = np.random.default_rng(0)
    ex = AttentionExplorer(rng.random((64, 64)), tiny_backbone, n_boot=8, device="cpu",
                           view="image")
    ex.run(wait=True)
    ex.add_roi(rectangle=(10, 10, 50, 50))
    ex.set_image(rng.random((96, 80)))
    assert ex.result is None and ex.roi_labels is None
    assert ex.rendered.shape[:2] == (96, 80)
    assert ex.run(wait=True) is not None
    assert ex.add_roi(rectangle=(5, 5, 40, 40)) == 1 and len(ex.roi_table()) == 1
    ex.close()


def test_a_saved_result_reopens_over_its_image_with_its_thresholds(blob_image, tiny_backbone,
                                                                     tmp_path):
    # the notebook had no way back to a saved result, and giving its path as the image
    # analysed the file's 16×16 attention array as if it were a picture
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=8, seed=1, device="cpu",
                           view="image", preset="paper")
    ex.run(wait=True)
    ex.rule, ex.q_th = "q", 0.4
    saved = ex.result
    path = ex.save(tmp_path / "blobs.attnreg.npz")
    ex.close()
    ex = AttentionExplorer(str(path), tiny_backbone, view="image")
    assert ex.image_panel.source is None and "result file, not an image" in ex.status
    ex.set_image(blob_image)
    reopened = ex.open_result(path)
    assert (ex.rule, ex.q_th, ex.state.shown_preset) == ("q", 0.4, "paper")
    np.testing.assert_array_equal(reopened.significant(), saved.significant())
    np.testing.assert_array_equal(ex.result.maps["q"], saved.maps["q"])
    ex.add_roi(rectangle=(10, 10, 60, 60))
    assert len(ex.roi_table()) == 1 and ex.export_figure(tmp_path / "f.png").exists()
    # another image's result: refused with both sizes, the result on screen stays
    other = AttentionExplorer(blob_image[:64], tiny_backbone, n_boot=8, device="cpu",
                              view="image")
    other_path = other.save(tmp_path / "top.npz") if other.run(wait=True) else None
    other.close()
    with pytest.raises(ValueError, match=r"64×80 image; the one on screen is 96×80"):
        ex.open_result(other_path)
    np.testing.assert_array_equal(ex.result.maps["q"], saved.maps["q"])
    assert len(ex.roi_table()) == 1
    ex.close()


def test_a_stacks_saved_result_reopens_on_the_plane_it_was_made_from(blob_image, tiny_backbone,
                                                                      tmp_path):
    # it was filed under the plane on screen: plane 2's map over plane 0's pixels, its
    # provenance saying plane (0,)
    stack = np.stack([blob_image, blob_image[::-1], blob_image[:, ::-1]])
    ex = AttentionExplorer(stack, tiny_backbone, n_boot=8, device="cpu", view="image")
    ex.slice_index = (2,)
    saved = ex.run(wait=True)
    path = ex.save(tmp_path / "plane2")
    ex.close()
    ex = AttentionExplorer(stack, tiny_backbone, view="image")
    ex.open_result(path)
    assert ex.slice_index == (2,) and ex.image_panel.sliders[0].value == 2
    assert list(ex.session) == [(2,)] and ex.provenance()["plane"] == [2]
    np.testing.assert_array_equal(ex.result.attention, saved.attention)
    ex.close()
    shorter = AttentionExplorer(stack[:2], tiny_backbone, view="image")  # has no plane 2
    with pytest.raises(ValueError, match=r"plane \(2,\), which this stack \(2 planes\)"):
        shorter.open_result(path)
    assert len(shorter.session) == 0 and shorter.slice_index == (0,)
    shorter.close()


def test_a_stack_result_made_elsewhere_reopens_on_its_plane(blob_image, tiny_backbone, tmp_path):
    # regularize_stack, napari and the command line record the pipeline's "plane" (the batch
    # as "0-2"), not the notebook's "slice": such a result opened on the plane on screen
    from napari_attnreg import regularize_stack

    stack = np.stack([blob_image, blob_image[::-1], blob_image[:, ::-1]])
    made = regularize_stack(stack, tiny_backbone, n_boot=8, device="cpu")[2]
    assert made.metadata["plane"] == [2] and "slice" not in made.metadata
    path = made.save(tmp_path / "from_stack.attnreg.npz")
    ex = AttentionExplorer(stack, tiny_backbone, view="image")
    ex.open_result(path)
    assert ex.slice_index == (2,) and ex.image_panel.sliders[0].value == 2
    np.testing.assert_array_equal(ex.result.attention, made.attention)
    ex.close()


@pytest.mark.parametrize(("recorded", "plane"), [([2], (2,)), ("1-2", (1, 2)), ("", None),
                                                 (None, None), ("x", None)])
def test_the_plane_a_result_records_is_read_in_every_front_ends_form(recorded, plane):
    from napari_attnreg.notebook.explorer import _plane_of

    assert _plane_of({} if recorded is None else {"plane": recorded}) == plane
    assert _plane_of({"slice": [0], "plane": [3]}) == (0,)


def test_a_plane_chosen_in_code_moves_its_sliders(blob_image, tiny_backbone):
    # explorer.slice_index = (1, 2) analysed and showed plane (1, 2) while both sliders still
    # read 0: the picture was labelled with another plane than it showed
    stack = np.stack([[blob_image, blob_image[::-1], blob_image[:, ::-1]]] * 2)
    ex = AttentionExplorer(stack, tiny_backbone, n_boot=4, device="cpu", view="image")
    sliders = ex.image_panel.sliders
    ex.slice_index = (1, 2)
    assert [s.value for s in sliders] == [1, 2] and ex.slice_index == (1, 2)
    assert ex.run(wait=True).metadata["slice"] == [1, 2]
    sliders[1].value = 0  # and the sliders still move the plane
    assert ex.slice_index == (1, 0) and ex._current_result() is None
    ex.slice_index = (5, 0)  # not in the stack: said in the status, the sliders stay
    assert "not in this stack" in ex.status and [s.value for s in sliders] == [1, 0]
    ex.close()


def test_exports_never_write_over_a_result_or_an_image_or_into_a_folder_name(
        blob_image, tiny_backbone, tmp_path):
    # the CSV box holding the saved result's name (cells.npz) replaced the result with the
    # table; a folder's path failed with "[Errno 21] Is a directory"
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=8, device="cpu", view="image")
    ex.run(wait=True)
    ex.add_roi(rectangle=(10, 10, 60, 60))
    saved = ex.save(tmp_path / "cells.npz")
    before = saved.read_bytes()
    ex.roi_panel.csv_path.value = str(saved)
    ex.roi_panel.export.click()
    assert saved.read_bytes() == before
    written = tmp_path / "cells.npz.csv"
    assert str(written) in ex.status and written.read_text().startswith("label,")
    ex.roi_panel.csv_path.value = str(tmp_path)
    ex.roi_panel.export.click()
    assert (tmp_path / "roi_table.csv").is_file() and "written to" in ex.status
    assert ex.export_roi_csv(tmp_path / "t.CSV") == tmp_path / "t.CSV"
    # the figure (PNG bytes) likewise never lands on the image file or the result
    image = tmp_path / "blobs.tif"
    image.write_bytes(b"the analyst's image")
    assert ex.export_figure(image) == tmp_path / "blobs.tif.png"
    assert image.read_bytes() == b"the analyst's image"
    assert ex.export_figure(tmp_path / "fig.PNG") == tmp_path / "fig.PNG"
    assert (tmp_path / "fig.PNG").read_bytes()[:4] == b"\x89PNG"
    ex.close()


def test_a_channels_first_array_without_channel_axis_is_told_how_to_merge(
        blob_image, tiny_backbone):
    # (3, H, W) fluorescence went to a plane slider without a word: each channel analysed
    # alone, where regularize() calls the same array ambiguous and asks for channel_axis
    channels = np.stack([blob_image, blob_image[::-1], blob_image[:, ::-1]])
    ex = AttentionExplorer(channels, tiny_backbone, view="image")
    assert "choose the plane" in ex.status and "give channel_axis=0" in ex.status
    ex.set_image(np.stack([channels] * 5))  # z, c, y, x
    assert "give channel_axis=1" in ex.status
    ex.set_image(np.stack([blob_image] * 6))  # six planes: a stack, nothing to add
    assert "choose the plane" in ex.status and "channel_axis" not in ex.status
    ex.set_image(channels, channel_axis=0)
    assert ex.status == "Ready: press Run." and not ex.image_panel.sliders
    ex.close()


@pytest.mark.parametrize("typed", [{"level": "1"}, {"mpp": "0.5"}])
def test_a_slide_level_for_an_array_is_refused_in_the_status_and_keeps_the_result(
        explorer, typed):
    # the run dropped it without a word (and ran at full resolution), where the command line
    # and regularize() refuse a level for pixels that are given
    first = explorer.run(wait=True)
    assert first is not None, explorer.status
    advanced = explorer.options_panel.advanced
    for name, text in typed.items():
        advanced.controls[name].value = text
    assert explorer.run(wait=True) is None
    assert "Slide level / Slide resolution" in explorer.status
    assert "Empty those boxes under Advanced options" in explorer.status
    assert isinstance(explorer.last_error, ValueError)
    assert explorer.session.latest.any_result is first and len(explorer.session) == 1
    for name in typed:
        advanced.controls[name].value = ""
    assert explorer.run(wait=True) is not None, explorer.status


def test_a_slide_level_for_an_image_file_of_one_resolution_is_refused(blob_image, tmp_path):
    import tifffile

    path = tmp_path / "field.tif"
    tifffile.imwrite(path, blob_image)
    ex = AttentionExplorer(str(path), "demo", n_boot=4, device="cpu", view="image", level=1)
    assert ex.run(wait=True) is None
    assert "neither a slide nor a pyramid" in ex.status and ex.result is None
    ex.close()


def test_the_name_given_for_one_image_does_not_label_the_next(blob_image, tiny_backbone,
                                                              tmp_path):
    # in a loop over files, every table after the first said it came from the first image
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=8, device="cpu", view="image",
                           name="first.tif")
    ex.run(wait=True)
    assert ex.provenance()["source_image"] == "first.tif"
    ex.set_image(blob_image[::-1].copy())
    ex.run(wait=True)
    assert ex.provenance()["source_image"] == "array (96, 80) uint16"
    ex.set_image(blob_image, name="third.tif")
    ex.run(wait=True)
    assert ex.provenance()["source_image"] == "third.tif"
    ex.set_image(np.zeros(3), name="broken")  # refused: the image and its name stay
    assert ex.provenance()["source_image"] == "third.tif"
    ex.close()
