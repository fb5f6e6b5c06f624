"""A slide run from the dock at a coarser level than its layer shows: the patch inspector
reports the patch the run analysed under the mouse (layer pixels are not analysed pixels),
and the saved result reopens with the tissue mask it was run with."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

H, W = 1024, 448  # level 0; level 1 is 512 x 224, three tiles of the tiny model's 224


def _aperio(w: int, h: int) -> str:
    return (f"Aperio Image Library v10.0.50\n{w}x{h} [0,0 {w}x{h}] (128x128) RAW/RGB"
            "|AppMag = 20|MPP = 0.5")


@pytest.fixture(scope="module")
def two_level_slide(tmp_path_factory):
    """An Aperio SVS of two levels: glass in the top half, stained tissue in the bottom half."""
    rng = np.random.default_rng(5)
    img = np.full((H, W, 3), 236, np.uint8)
    stain = (rng.random((H, W, 3)) * 90 + np.array([130, 40, 120])).astype(np.uint8)
    img[H // 2:] = stain[H // 2:]
    path = tmp_path_factory.mktemp("inspect") / "two levels.svs"
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(128, 128), description=_aperio(W, H), photometric="rgb",
                  metadata=None)
        tif.write(img[::8, ::8].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)
        tif.write(img[::2, ::2].copy(), tile=(128, 128), description=_aperio(W // 2, H // 2),
                  photometric="rgb", metadata=None)
    return path


def test_the_inspector_reports_the_analysed_patch_of_a_slide_run_at_level_1(
        two_level_slide, viewer_widget, run_and_wait):
    """Hovering the tissue in the slide's bottom half reports its patch (it found none: layer
    pixels were read as level-1 pixels, off the analysed image), and the glass above is
    'not tested'."""
    viewer, widget = viewer_widget
    [layer] = viewer.open(str(two_level_slide), plugin="napari-attnreg")
    widget.options.controls["tiled"].setChecked(True)
    widget.options.set("level", 1)
    run_and_wait(widget, timeout=120_000)
    record = widget.current_record()
    result = record.results[()]
    assert record.grid is not None and record.grid.factor == pytest.approx((2.0, 2.0))
    assert result.metadata["n_tissue_tiles"] < result.metadata["n_tiles_total"]
    sy, sx = result.token_scale
    for (row, col), tested in (((3 * H // 4, W // 2), True), ((H // 8, W // 3), False), ((H - 3, W - 3), True)):
        report = widget.inspector.inspect_world(layer.data_to_world((row, col)))
        assert report is not None, (row, col)
        # layer pixel r lies in level-1 pixel r // 2
        assert report.token == (int((row // 2) / sy), int((col // 2) / sx))
        assert report.tested is tested


def test_a_saved_tiled_result_reopens_with_its_tissue_mask_layer(
        two_level_slide, viewer_widget, run_and_wait, tmp_path, make_napari_viewer, qtbot):
    """Saved (the dock's Save results) and reopened in a new viewer over the slide, the result
    brings back the tissue mask layer the run showed, in the same place (a saved folder holds
    no mask layer: the tested area was no longer drawn)."""
    from napari_attnreg._napari.results_io import save_results
    from napari_attnreg._napari.widget import AttentionWidget

    viewer, widget = viewer_widget
    viewer.open(str(two_level_slide), plugin="napari-attnreg")
    widget.options.controls["tiled"].setChecked(True)
    widget.options.set("level", 1)
    run_and_wait(widget, timeout=120_000)
    tissue = viewer.layers["two levels tissue"]
    save_results(viewer, widget.current_record(), [], tmp_path / "saved")

    again = make_napari_viewer()
    dock = AttentionWidget(again)
    again.window.add_dock_widget(dock)
    again.open(str(two_level_slide), plugin="napari-attnreg")
    again.open(str(tmp_path / "saved"), plugin="napari-attnreg")
    qtbot.waitUntil(lambda: dock.current_record() is not None, timeout=10_000)
    [reopened] = [lay for lay in again.layers if lay.name == "two levels tissue"]
    np.testing.assert_array_equal(reopened.data, tissue.data)
    np.testing.assert_allclose(reopened.scale, tissue.scale)
    np.testing.assert_allclose(reopened.translate, tissue.translate)
    assert reopened.metadata["tissue"]["tiles"] == tissue.metadata["tissue"]["tiles"]


def test_the_tissue_mask_a_run_adds_is_not_taken_as_the_roi_layer(
        two_level_slide, viewer_widget, run_and_wait):
    """The tissue mask layer of a tiled run is no ROI layer: taken up as one, the ROI table
    showed the tissue as its only ROI, and the Shapes layer the analyst drew next was not
    chosen (the table never showed their ROIs)."""
    viewer, widget = viewer_widget
    viewer.open(str(two_level_slide), plugin="napari-attnreg")
    widget.options.controls["tiled"].setChecked(True)
    widget.options.set("level", 1)
    run_and_wait(widget, timeout=120_000)
    assert "two levels tissue" in [lay.name for lay in viewer.layers]
    assert widget.roi_panel.current_layer() is None
    drawn = viewer.add_shapes([np.array([[600, 40], [600, 300], [900, 300], [900, 40]]) * 0.5],
                              name="my ROIs", scale=(0.5, 0.5))
    assert widget.roi_panel.current_layer() is drawn
    assert [row["label"] for row in widget.roi_panel.rows] == [1]


def test_the_tissue_mask_lies_beneath_the_maps_and_the_outline(
        two_level_slide, viewer_widget, run_and_wait):
    """The tissue mask a run adds (and a rerun's replacement) lies between the slide and its
    output layers: on top, its fill tinted the maps and the significant outline."""
    viewer, widget = viewer_widget
    [slide] = viewer.open(str(two_level_slide), plugin="napari-attnreg")
    widget.options.controls["tiled"].setChecked(True)
    widget.options.set("level", 1)
    for _ in range(2):  # the rerun replaces the mask
        run_and_wait(widget, timeout=120_000)
        names = [lay.name for lay in viewer.layers]
        tissue = names.index("two levels tissue")
        outputs = [i for i, name in enumerate(names) if name.startswith("two levels · ")]
        assert names.index(slide.name) < tissue < min(outputs), names
        assert names.count("two levels tissue") == 1
        # the mask is not left the chosen layer (napari's new-layer buttons copy its pixels)
        assert viewer.layers.selection.active.name != "two levels tissue"


def test_a_slide_opened_after_its_saved_result_lies_beneath_the_result(
        two_level_slide, viewer_widget, run_and_wait, tmp_path, make_napari_viewer, qtbot):
    """A saved result reopened first, then its slide: the dock takes the result up and puts
    the slide beneath its maps, outline and tissue mask (napari added it on top, where the
    opaque slide hid all of them)."""
    from napari_attnreg._napari.results_io import save_results
    from napari_attnreg._napari.widget import AttentionWidget

    viewer, widget = viewer_widget
    viewer.open(str(two_level_slide), plugin="napari-attnreg")
    widget.options.controls["tiled"].setChecked(True)
    widget.options.set("level", 1)
    run_and_wait(widget, timeout=120_000)
    save_results(viewer, widget.current_record(), [], tmp_path / "saved")

    again = make_napari_viewer()
    dock = AttentionWidget(again)
    again.window.add_dock_widget(dock)
    again.open(str(tmp_path / "saved"), plugin="napari-attnreg")
    [slide] = again.open(str(two_level_slide), plugin="napari-attnreg")
    qtbot.waitUntil(lambda: dock.current_record() is not None, timeout=10_000)
    names = [lay.name for lay in again.layers]
    marks = [i for i, name in enumerate(names) if name.startswith("two levels ")]
    assert len(marks) == 7, names  # four maps, significant, its outline, the tissue mask
    assert names.index(slide.name) < min(marks), names


def test_the_tissue_mask_field_offers_no_significant_layers(
        two_level_slide, viewer_widget, run_and_wait):
    """The Tissue mask field's suggestions, and the error for a name it does not know, list
    the layers that can mark tissue (the run's tissue mask, a painted one), not the dock's
    significant layers and outline, which read as masks to use."""
    viewer, widget = viewer_widget
    viewer.open(str(two_level_slide), plugin="napari-attnreg")
    widget.options.controls["tiled"].setChecked(True)
    widget.options.set("level", 1)
    run_and_wait(widget, timeout=120_000)
    viewer.add_labels(np.zeros((8, 8), np.uint8), name="painted")
    offered = widget._mask_names.stringList()
    assert offered == ["auto", "none", "two levels tissue", "painted"]
    widget.options.controls["tissue_mask"].setText("no such layer")
    assert widget.run() is None
    text = widget.run_panel.status_label.text()
    assert "'two levels tissue', 'painted'" in text and "significant" not in text


def test_slide_level_and_resolution_are_greyed_out_for_an_image_that_is_no_slide(
        two_level_slide, viewer_widget):
    """*Slide level* and *Slide resolution* are enabled while a slide is the chosen image and
    greyed out for another image, which ignores them (they were enabled, doing nothing)."""
    viewer, widget = viewer_widget
    level, mpp = widget.options.controls["level"], widget.options.controls["mpp"]
    assert level.isEnabled() and mpp.isEnabled()  # no image yet: nothing to judge by
    plain = viewer.add_image(np.zeros((64, 64), np.uint8), name="plain")
    assert not level.isEnabled() and not mpp.isEnabled()
    [slide] = viewer.open(str(two_level_slide), plugin="napari-attnreg")
    assert level.isEnabled() and mpp.isEnabled()
    widget.set_layer(plain)
    assert not level.isEnabled()
    widget.options.controls["tiled"].toggle()  # the other options' greying keeps it
    assert not level.isEnabled()
    widget.set_layer(slide)
    assert level.isEnabled()
