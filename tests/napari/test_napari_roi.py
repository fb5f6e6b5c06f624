"""ROI table against the core's roi_table, CSV export, live updates."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from napari_attnreg.core.stats.roi import ROI_COLUMNS, roi_table

pytestmark = pytest.mark.gui


def _core_rows(result, labels, t):
    """The core's table at thresholds ``t`` (roi_table takes no q_th: q_th must be the run's)."""
    assert t["q_th"] == pytest.approx(result.thresholds["q_th"])
    return roi_table(result, labels, **{k: t[k] for k in ("rule", "p_th", "l_th", "z_th")})


def _assert_rows_equal(rows, expected):
    assert len(rows) == len(expected)
    for row, exp in zip(rows, expected):
        for key in ROI_COLUMNS:
            if isinstance(exp[key], str):
                assert row[key] == exp[key], key
            else:
                np.testing.assert_allclose(row[key], exp[key], equal_nan=True, err_msg=key)


def test_shapes_roi_table_matches_core_and_exports(
    viewer_widget, run_and_wait, cells_image, qtbot, tmp_path
):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    shapes = viewer.add_shapes(
        [
            np.array([[15, 10], [15, 45], [50, 45], [50, 10]]),  # over the first blob
            np.array([[80, 70], [15, 15]]),
        ],  # ellipse: centre, radii
        shape_type=["rectangle", "ellipse"],
        name="rois",
    )
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.roi_panel.set_layer(shapes)
    rows = blocker.args[0]
    result = widget.current_record().results[()]
    labels = shapes.to_labels(labels_shape=cells_image.shape)
    t = widget.current_record().thresholds
    _assert_rows_equal(rows, _core_rows(result, labels, t))
    assert [r["label"] for r in rows] == [1, 2]
    assert widget.roi_panel.table.rowCount() == 2
    # the attention enrichment with its interval leads, and the too-small test is flagged
    headers = [widget.roi_panel.table.horizontalHeaderItem(c).text()
               for c in range(widget.roi_panel.table.columnCount())]
    ratio = headers.index("Attention in/out")
    assert headers[ratio + 1:ratio + 3] == ["in/out 95% low", "in/out 95% high"]
    assert ratio < headers.index("Odds ratio")
    low, high = rows[0]["attention_enrichment_low"], rows[0]["attention_enrichment_high"]
    assert low < rows[0]["attention_enrichment"] < high
    assert widget.roi_panel.table.item(0, ratio).text() == f"{rows[0]['attention_enrichment']:.3g}"
    note = headers.index("Enrichment test")
    assert widget.roi_panel.table.item(0, note).text() == "too few significant patches"

    # thresholds move → the table follows without a new run
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.thresholds_panel.rule_combo.setCurrentIndex(
            widget.thresholds_panel.rule_combo.findData("fwer")  # a rule of the step-down
        )
        widget.thresholds_panel.p_th_slider.setValue(0.5)
    _assert_rows_equal(blocker.args[0],
                       _core_rows(result, labels, {**t, "rule": "fwer", "p_th": 0.5}))

    # editing the ROIs updates the table too
    shapes.add_rectangles(np.array([[80, 5], [110, 30]]))
    qtbot.waitUntil(lambda: len(widget.roi_panel.rows) == 3, timeout=5000)
    assert [r["label"] for r in widget.roi_panel.rows] == [1, 2, 3]
    assert widget.roi_panel.table.rowCount() == 3

    path = widget.roi_panel.export_csv(tmp_path / "rois.csv")
    with open(path, newline="", encoding="utf-8") as fh:
        read = list(csv.DictReader(fh))
    assert len(read) == 3 and set(ROI_COLUMNS) <= set(read[0])
    assert float(read[0]["mean_attention"]) == pytest.approx(
        widget.roi_panel.rows[0]["mean_attention"]
    )
    # what made the table travels with every row
    record = widget.current_record()
    for row in read:
        assert row["source_image"] == "cells" and row["preset"] == record.preset
        assert row["n_boot"] == "16" and row["seed"] == "0" and row["rule"] == "fwer"
        assert float(row["p_th"]) == pytest.approx(0.5) and row["run_id"] == record.run_id
        assert row["model"] and row["package_version"]


def test_odds_ratio_without_significant_tokens_and_small_roi_warning(
    viewer_widget, run_and_wait, cells_image, qtbot, tmp_path
):
    """An ROI with no significant token has odds ratio 0 (no 0.5-corrected 33.8)."""
    from napari_attnreg._napari.roi_panel import table_columns
    from napari_attnreg.core.results.display import ROI_COLUMNS as HEADERS

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    presets = widget.options.controls["preset"]  # the q rule and its slider
    presets.setCurrentIndex(presets.findData("directional"))
    run_and_wait(widget)
    column = table_columns().index("odds_ratio")
    shapes = viewer.add_shapes(
        [np.array([[10, 10], [60, 60]]), np.array([[70, 70], [72, 72]])],
        shape_type="rectangle",
        name="rois",
    )
    with qtbot.waitSignal(widget.thresholds_panel.changed, timeout=5000):  # nothing significant
        widget.thresholds_panel.rule_combo.setCurrentIndex(
            widget.thresholds_panel.rule_combo.findData("p")
        )
        widget.thresholds_panel.p_th_slider.setValue(0.0)
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.roi_panel.set_layer(shapes)
    rows = blocker.args[0]
    assert [r["frac_significant"] for r in rows] == [0.0, 0.0]
    table = widget.roi_panel.table
    assert table.horizontalHeaderItem(column).text() == HEADERS["odds_ratio"]
    assert "0 when no patch inside" in table.horizontalHeaderItem(column).toolTip()
    # what any result supports leads: evidence, then attention, before the enrichment test
    assert table_columns()[2:6] == ["area_um2", "n_tokens", "mean_posterior", "mean_attention"]
    if sum(int(r.significant().sum()) for r in widget.current_record().results.values()) < 5:
        assert "too few for the enrichment test" in widget.roi_panel.status.text()
    soft = table_columns().index("mean_posterior")  # the directional soft map's own name
    assert table.horizontalHeaderItem(soft).text() == "Mean P(above null)"
    # nothing significant anywhere: the odds ratio is undefined, shown as such (never 33.8)
    assert all(np.isnan(r["odds_ratio"]) for r in rows)
    assert [table.item(r, column).text() for r in range(2)] == ["–", "–"]
    path = widget.roi_panel.export_csv(tmp_path / "rois.csv")
    with open(path, newline="", encoding="utf-8") as fh:
        assert all(np.isnan(float(r["odds_ratio"])) for r in csv.DictReader(fh))
    # the 3×3-pixel ROI is smaller than one patch: said so, with the run that resolves it
    status = widget.roi_panel.status.text()
    assert "⚠ 1 of 2 ROIs (ROI 2) smaller than one patch" in status and "ROI 1" not in status
    assert "native-resolution tiles" in status

    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.thresholds_panel.p_th_slider.setValue(1.0)  # every token significant
    assert all(r["frac_significant"] == 1.0 for r in blocker.args[0])
    # significant patches outside, none inside the ROI: 0, not a corrected 33.8
    t = widget.current_record().results[()]
    threshold = float(np.median(t.p))
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.thresholds_panel.p_th_slider.setValue(threshold)
    for r, row in enumerate(blocker.args[0]):
        if row["frac_significant"] == 0.0:
            assert row["odds_ratio"] == 0.0 and table.item(r, column).text() == "0"


def test_labels_roi_on_a_scaled_image(viewer_widget, run_and_wait, cells_image, qtbot):
    """A Labels ROI painted in world space lands on the image's own pixel grid."""
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells", scale=(2.0, 2.0))
    run_and_wait(widget)
    roi_world = np.zeros((240, 200), dtype=np.int32)  # a scale-1 Labels layer over the image
    roi_world[40:100, 20:90] = 4
    roi = viewer.add_labels(roi_world, name="painted")
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.roi_panel.set_layer(roi)
    rows = blocker.args[0]
    on_image = np.zeros(cells_image.shape, dtype=np.int64)
    on_image[20:50, 10:45] = 4
    result = widget.current_record().results[()]
    t = widget.current_record().thresholds
    _assert_rows_equal(rows, _core_rows(result, on_image, t))
    assert rows[0]["label"] == 4 and rows[0]["area_px"] == 30 * 35


def test_significant_layer_can_serve_as_roi(viewer_widget, run_and_wait, cells_image, qtbot):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    # the paper's lfdr rule finds regions even with this random model (the q rule finds none)
    widget.options.controls["preset"].setCurrentIndex(
        widget.options.controls["preset"].findData("paper")
    )
    run_and_wait(widget)
    sig_layer = viewer.layers["cells · significant"]
    if sig_layer.data.max() == 0:
        pytest.skip("no significant region with this tiny random model")
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.roi_panel.set_layer(sig_layer)
    rows = blocker.args[0]
    assert len(rows) == len(np.unique(sig_layer.data[sig_layer.data > 0]))
    # regions made of significant tokens are fully significant under the same thresholds
    assert all(r["frac_significant"] == pytest.approx(1.0) for r in rows)


def test_moving_or_rotating_the_roi_layer_measures_the_regions_where_they_now_lie(
        viewer_widget, run_and_wait, cells_image, qtbot):
    """The table listened to edits of the shapes only: translating or flipping the ROI
    layer (aligning it to the image) left the numbers of where the regions had been, and a
    rotation, which cannot be measured, went unmentioned."""
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    shapes = viewer.add_shapes([np.array([[15, 10], [15, 45], [50, 45], [50, 10]])],
                               shape_type="rectangle", name="rois")
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.roi_panel.set_layer(shapes)
    assert blocker.args[0][0]["area_px"] == 36 * 36
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        shapes.translate = (0, 80)  # now half off the image's right edge (columns 90-125)
    assert blocker.args[0][0]["area_px"] == 36 * 10
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        shapes.translate = (0, 0)
        shapes.scale = (1, -1)  # flipped: wholly left of the image
    assert blocker.args[0] == []  # "0 ROI row(s)", and no word of why
    assert "ROI 1 of 'rois' covers no pixel of the analysed image" in \
        widget.roi_panel.status.text()
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        shapes.scale = (1, 1)
        shapes.rotate = 20
    assert blocker.args[0] == [] and "rotated" in widget.roi_panel.status.text()


def test_roi_areas_in_square_micrometres_on_a_calibrated_image(
        viewer_widget, run_and_wait, cells_image, qtbot, tmp_path):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells", scale=(0.5, 0.4), translate=(10, 20),
                     units="µm")
    run_and_wait(widget)
    # world (µm): rows 17.5-35 and columns 24-38 are pixels 15-50 and 10-45 of the image
    shapes = viewer.add_shapes([np.array([[17.5, 24], [17.5, 38], [35, 38], [35, 24]])],
                               shape_type="rectangle", name="rois")
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.roi_panel.set_layer(shapes)
    (row,) = blocker.args[0]
    assert row["area_px"] == 36 * 36
    assert row["area_um2"] == pytest.approx(36 * 36 * 0.5 * 0.4)
    headers = [widget.roi_panel.table.horizontalHeaderItem(c).text()
               for c in range(widget.roi_panel.table.columnCount())]
    assert headers[:3] == ["ROI", "Area (px)", "Area (µm²)"]
    with open(widget.roi_panel.export_csv(tmp_path / "rois.csv"), newline="") as fh:
        assert float(next(csv.DictReader(fh))["area_um2"]) == pytest.approx(259.2)


def test_a_pixel_size_set_after_the_run_gives_the_areas_in_square_micrometres(
        viewer_widget, run_and_wait, cells_image, qtbot):
    """The areas came from the pixel size recorded at the run: an analyst who set the image
    layer's scale afterwards (it had none when opened) kept an empty µm² column."""
    viewer, widget = viewer_widget
    image = viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    shapes = viewer.add_shapes([np.array([[15, 10], [15, 45], [50, 45], [50, 10]])],
                               shape_type="rectangle", name="rois")
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.roi_panel.set_layer(shapes)
    assert np.isnan(blocker.args[0][0]["area_um2"])  # pixels: no physical size
    image.units = "µm"
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        image.scale = (0.5, 0.5)
        shapes.scale = (0.5, 0.5)  # the regions stay over the same pixels
    (row,) = blocker.args[0]
    assert row["area_px"] == 36 * 36 and row["area_um2"] == pytest.approx(36 * 36 * 0.25)


def test_painted_labels_go_to_qupath_geojson_pixel_for_pixel(
        viewer_widget, run_and_wait, cells_image, qtbot, tmp_path):
    import json

    from napari_attnreg.io.geojson import read_geojson_rois

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    painted = np.zeros(cells_image.shape, np.int32)
    painted[20:50, 10:40] = 3
    painted[30:35, 20:25] = 0  # a hole
    painted[70:80, 60:90] = 5
    labels = viewer.add_labels(painted, name="painted")
    with qtbot.waitSignal(widget.roi_panel.rows_changed, timeout=5000) as blocker:
        widget.roi_panel.set_layer(labels)
    rows = blocker.args[0]
    out = widget.roi_panel.export_geojson(tmp_path / "painted.geojson")
    features = json.loads(out.read_text(encoding="utf-8"))["features"]
    assert [f["properties"]["name"] for f in features] == ["ROI 3", "ROI 5"]
    assert [f["properties"]["measurements"]["area_px"] for f in features] == \
        [r["area_px"] for r in rows] == [900 - 25, 300]
    back = read_geojson_rois(out, cells_image.shape)
    np.testing.assert_array_equal(back > 0, painted > 0)  # the same pixels, in place


def test_table_numbers_read_as_numbers_not_exponents():
    """An ROI of 9470 µm² read "9.47e+03" in the table."""
    from napari_attnreg._napari.roi_panel import _fmt

    assert _fmt(9470.4) == "9470" and _fmt(2.5e6) == "2500000"
    assert _fmt(0.001234) == "0.00123" and _fmt(930.0) == "930" and _fmt(float("nan")) == "–"
