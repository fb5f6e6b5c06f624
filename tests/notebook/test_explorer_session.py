"""Results on two planes: the explorer shows the plane on screen's thresholds and count (#16)."""

from __future__ import annotations

import csv

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

from napari_attnreg.core.results.display import significance_caption
from napari_attnreg.notebook import AttentionExplorer


@pytest.fixture
def two_planes(blob_image, tiny_backbone):
    """Directional results on plane 0 (q ≤ 1: every patch) and plane 1 (q ≤ 0.1), 1 shown."""
    stack = np.stack([blob_image, blob_image[::-1]])
    roi = np.zeros(blob_image.shape, dtype=bool)
    roi[15:45, 5:35] = True
    ex = AttentionExplorer(stack, tiny_backbone, preset="directional", n_boot=8, device="cpu",
                           view="image", roi=roi, name="stack.tif")
    assert ex.run(wait=True) is not None
    ex.controls["q_th"].value = 1.0  # the slider, as the analyst moves it
    ex.image_panel.sliders[0].value = 1
    # no result here yet: the thresholds are the next run's, not plane 0's, and no count
    assert ex.q_th == pytest.approx(0.1) and ex.controls["q_th"].value == pytest.approx(0.1)
    assert ex.summary_panel.summary.value == "" and ex.canvas.result is None
    assert ex.run(wait=True) is not None
    yield ex
    ex.close()


def _shown(ex):
    return ex.session.shown()


def test_the_plane_on_screen_shows_its_own_thresholds_and_count(two_planes):
    ex = two_planes
    first, second = ex.session[(0,)], ex.session[(1,)]
    assert ex.session.selected is second and ex.q_th == pytest.approx(0.1)
    assert significance_caption(_shown(ex)) in ex.summary_panel.summary.value
    ex.image_panel.sliders[0].value = 0
    assert ex.session.selected is first
    assert ex.q_th == pytest.approx(1.0) and ex.controls["q_th"].value == pytest.approx(1.0)
    n = first.any_result.attention.size
    assert f"{n}/{n} patches significant (q ≤ 1)" in ex.summary_panel.summary.value
    sig = first.any_result.significant(q_th=1.0)
    np.testing.assert_array_equal(ex.canvas.result.significant(), sig)
    assert ex.display_panel.colorbar_label.value == "regularized (q ≤ 1)"


def test_a_threshold_move_changes_only_the_plane_on_screen(two_planes):
    ex = two_planes
    ex.controls["q_th"].value = 0.5
    assert ex.session.thresholds((1,)).q_th == pytest.approx(0.5)
    assert ex.session.thresholds((0,)).q_th == pytest.approx(1.0)  # plane 0 keeps its own
    assert "(q ≤ 0.5)" in ex.summary_panel.summary.value
    assert ex.result.thresholds["q_th"] == pytest.approx(0.5)  # the latest: plane 1
    ex.image_panel.sliders[0].value = 0
    assert ex.result.thresholds["q_th"] == pytest.approx(0.5)  # still plane 1's, not 1.0
    ex.q_th = 0.8  # from code: plane 0 only
    assert ex.session.thresholds((0,)).q_th == pytest.approx(0.8)
    assert ex.session.thresholds((1,)).q_th == pytest.approx(0.5)


def test_roi_csv_uses_the_thresholds_of_the_plane_on_screen(two_planes, tmp_path):
    ex = two_planes
    ex.image_panel.sliders[0].value = 0
    with open(ex.export_roi_csv(tmp_path / "p0.csv"), newline="") as fh:
        row = next(csv.DictReader(fh))
    # the file's name and a plane column, as napari's table writes them (it said
    # "stack.tif plane (0,)", a name no other front end wrote)
    assert float(row["q_th"]) == pytest.approx(1.0) and row["source_image"] == "stack.tif"
    assert row["plane"] == "[0]" and list(row)[0] == "plane"
    assert float(row["frac_significant"]) == pytest.approx(1.0)
    ex.image_panel.sliders[0].value = 1
    with open(ex.export_roi_csv(tmp_path / "p1.csv"), newline="") as fh:
        row = next(csv.DictReader(fh))
    assert float(row["q_th"]) == pytest.approx(0.1) and row["source_image"] == "stack.tif"
    assert row["plane"] == "[1]"


def test_a_new_preset_leaves_the_shown_result_alone_until_the_next_run(two_planes):
    ex = two_planes
    ex.q_th = 0.3
    ex.preset = "paper"
    # the directional result on screen keeps its rule and q; the next run starts at the paper's
    assert (ex.rule, ex.q_th) == ("q", pytest.approx(0.3))
    assert ex.state.shown_preset == "directional"  # whose rules the dropdown offers
    assert ex.session.run_thresholds().rule == "lfdr"
    result = ex.run(wait=True)
    assert result.preset == "paper" and (ex.rule, ex.z_th) == ("lfdr", 0.0)
    assert ex.controls["rule"].value == "lfdr"


def test_settings_set_in_code_reach_the_controls(two_planes):
    ex = two_planes
    ex.session.update_settings(n_boot=5)
    assert ex.n_boot == 5 and ex.controls["n_boot"].value == 5
    ex.seed = 4
    assert ex.session.settings["seed"] == 4


def test_the_rules_offered_are_those_of_the_result_shown(blob_image, tiny_backbone):
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=8, device="cpu", view="image")
    assert ex.run(wait=True).preset == "stepdown"
    ex.preset = "directional"  # for the next run
    assert [v for _, v in ex.controls["rule"].options] == ["forwardstop", "fwer", "soft"]
    assert ex.rule == ex.controls["rule"].value == "forwardstop"
    ex.close()


def test_an_opened_result_shows_its_preset_and_a_new_choice_is_for_the_next_run(
        blob_image, tiny_backbone, tmp_path):
    # after open_result the Statistics dropdown kept the next run's step-down while the
    # thresholds offered the file's directional rules: the two controls contradicted
    made = AttentionExplorer(blob_image, tiny_backbone, preset="directional", n_boot=8,
                             device="cpu", view="image")
    made.run(wait=True)
    path = made.save(tmp_path / "directional")
    made.close()
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=8, device="cpu", view="image")
    assert ex.preset == "stepdown"
    ex.open_result(path)
    assert ex.preset == ex.state.shown_preset == "directional"
    assert ex.controls["preset"].value == "directional"
    assert "Statistics set to directional" in ex.status
    ex.controls["q_th"].value = 0.3
    ex.controls["preset"].value = "paper"  # the analyst picks another for the next run
    assert "paper applies to the next run" in ex.status and "keeps its directional" in ex.status
    assert (ex.state.shown_preset, ex.rule, ex.q_th) == ("directional", "q", pytest.approx(0.3))
    assert ex.run(wait=True).preset == "paper"
    ex.close()
