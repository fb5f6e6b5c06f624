"""The explorer's preset, q rule, optional z mask, display legends, outline colour, diagnostics."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

from napari_attnreg.core.results.display import (
    MAPS_BY_KEY,
    SIGNIFICANT_COLOR,
    significance_caption,
)
from napari_attnreg.core.run import service as service_module
from napari_attnreg.core.run.options import option
from napari_attnreg.notebook import AttentionExplorer, render


@pytest.fixture
def explorer(blob_image, tiny_backbone):
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=12, device="cpu", view="image")
    yield ex
    ex.close()


def test_preset_control_resets_thresholds(explorer):
    c = explorer.controls
    assert explorer.preset == "stepdown" and c["preset"].value == "stepdown"
    assert (explorer.rule, explorer.q_th, explorer.method) == ("forwardstop", pytest.approx(0.1),
                                                               "patch")
    # only the step-down rules are offered for a step-down result
    assert [v for _, v in c["rule"].options] == ["forwardstop", "fwer", "soft"]
    c["preset"].value = "directional"
    assert explorer.method == "normal" and "q" in [v for _, v in c["rule"].options]
    # labels and tooltips are the core's option metadata
    assert c["preset"].tooltip == option("preset").help and "HIGHER" in c["preset"].tooltip
    assert c["preset"].description == option("preset").label
    assert (explorer.rule, explorer.q_th, explorer.z_th) == ("q", pytest.approx(0.1), None)
    assert not c["z_mask"].value and c["z_th"].disabled
    assert all(c[k].tooltip for k in ("rule", "q_th", "z_mask", "z_th"))
    c["q_th"].value = 0.3
    c["preset"].value = "paper"  # the control moves the state, and the thresholds follow
    assert explorer.preset == "paper"
    assert (explorer.rule, explorer.z_th, explorer.l_th, explorer.q_th) == (
        "lfdr", 0.0, pytest.approx(0.3), pytest.approx(0.1))
    assert c["z_mask"].value and not c["z_th"].disabled and c["rule"].value == "lfdr"
    c["z_mask"].value = False  # z mask off = z_th None, whatever the preset
    assert explorer.z_th is None and c["z_th"].disabled
    c["z_mask"].value = True
    c["z_th"].value = 1.5
    assert explorer.z_th == pytest.approx(1.5)
    explorer.z_th = None  # from code: the controls follow
    assert not c["z_mask"].value


def test_explicit_thresholds_win_over_the_preset(blob_image, tiny_backbone):
    ex = AttentionExplorer(blob_image, tiny_backbone, preset="paper", z_th=None, q_th=0.05,
                           view="image")
    assert (ex.preset, ex.rule, ex.z_th, ex.q_th) == ("paper", "lfdr", None, pytest.approx(0.05))
    assert not ex.controls["z_mask"].value
    ex.overlay = "p"  # the former name of the p-value overlay still works
    assert ex.overlay == "pvalue"
    ex.close()


def test_directional_run_shows_display_titles_legends_and_live_q(explorer, monkeypatch):
    explorer.preset = "directional"
    result = explorer.run(wait=True)
    assert result.preset == "directional" and result.metadata["alternative"] == "greater"
    assert explorer.display_panel.colorbar_label.value == "regularized (q ≤ 0.1)"
    assert MAPS_BY_KEY["regularized"].legend("directional") in explorer.display_panel.legend.value
    explorer.overlay = "pvalue"
    assert explorer.display_panel.colorbar_label.value == "−log10 p, above null"
    assert "one-sided" in explorer.display_panel.legend.value
    assert float(explorer.display_panel.colorbar_hi.value) == pytest.approx(
        MAPS_BY_KEY["pvalue"].limits(result)[1], rel=1e-2)
    explorer.overlay = "posterior"
    assert explorer.display_panel.colorbar_label.value == "P(above null)"
    # thresholds move live: the count follows, nothing is recomputed
    monkeypatch.setattr(service_module, "run_engine", lambda *a, **k: pytest.fail("recomputed"))
    before = explorer.summary_panel.summary.value
    explorer.controls["q_th"].value = 1.0
    assert explorer.summary_panel.summary.value != before
    summary = explorer.summary_panel.summary.value
    assert "168/168 patches significant (q ≤ 1), above the null" in summary
    assert significance_caption(result, explorer.thresholds()) in summary
    assert int(explorer.result.significant().sum()) == 168


def test_paper_run_uses_the_papers_names(explorer):
    explorer.preset = "paper"
    result = explorer.run(wait=True)
    assert result.preset == "paper"
    explorer.overlay = "pvalue"
    assert explorer.display_panel.colorbar_label.value == "−log10 p (two-sided)"
    assert "BELOW" in explorer.display_panel.legend.value
    assert "paper's two-sided test" in explorer.summary_panel.summary.value
    assert "π0 = " in explorer.summary_panel.summary.value
    dropdown = explorer.display_panel.controls["overlay"]
    assert dict((v, k) for k, v in dropdown.options)["posterior"] == "posterior 1 − lfdr (two-sided)"


def test_outline_is_drawn_in_the_significant_colour(explorer):
    assert render.hex_color(render.SIGNIFICANT_COLOR) == SIGNIFICANT_COLOR
    explorer.preset = "directional"  # the p rule
    explorer.run(wait=True)
    explorer.rule, explorer.p_th = "p", 0.5  # some patches in, some out
    sig = explorer.result.significant()
    assert 0 < sig.sum() < sig.size
    canvas = explorer.canvas
    expected = render.boundary(sig.ravel()[canvas.token_index], canvas.line_width())
    assert expected.any()
    np.testing.assert_array_equal(explorer.rendered[expected],
                                  np.tile(render.SIGNIFICANT_COLOR, (int(expected.sum()), 1)))
    # the legend names the outline colour
    assert SIGNIFICANT_COLOR in explorer.display_panel.legend.value


def test_diagnostics_of_a_random_model_are_shown(blob_image, tiny_backbone):
    model = replace(tiny_backbone, weights="random-init")
    model.domain = "synthetic test blobs"
    ex = AttentionExplorer(blob_image, model, n_boot=8, device="cpu", view="image")
    result = ex.run(wait=True)
    codes = {d.code for d in result.diagnostics}
    assert {"random_init", "uniform_attention", "model_domain"} <= codes
    shown = ex.summary_panel.diagnostics.value
    assert "random weights" in shown and "nearly uniform" in shown
    assert "(synthetic test blobs)" in shown and "Model domain: synthetic test blobs" in shown
    # random weights and uniform attention, plus (B = 8) a p resolution too coarse for q ≤ 0.1
    n_warnings = sum(d.severity == "warning" for d in result.diagnostics)
    assert n_warnings >= 2 and "p_resolution" in {d.code for d in result.diagnostics}
    assert ex.status.startswith("Done in") and f"{n_warnings} warning(s) below" in ex.status
    assert "b26a00" in ex.run_panel.status.value  # shown as a warning, not as a plain success
    ex.close()


def test_stepdown_run_shows_evidence_and_the_map_level_p(explorer):
    result = explorer.run(wait=True)
    assert result.preset == "stepdown" and result.p_map is not None
    explorer.overlay = "posterior"
    assert explorer.display_panel.colorbar_label.value == "evidence (1 − adjusted p)"
    explorer.overlay = "pvalue"
    assert explorer.display_panel.colorbar_label.value == "−log10 adjusted p (step-down)"
    summary = explorer.summary_panel.summary.value
    assert "is anything here?" in summary and "resolution 1/13" in summary
    assert "π0" not in summary  # a pooled-null quantity, not part of the step-down
    # the overlay choices carry the step-down's names; the chosen map stays chosen
    labels = dict((v, k) for k, v in explorer.display_panel.controls["overlay"].options)
    assert labels["posterior"] == "evidence (1 − adjusted p)"
    assert labels["pvalue"] == "−log10 adjusted p (step-down)"
    explorer.rule = "fwer"  # re-applied from the stored steps, nothing recomputed
    np.testing.assert_array_equal(explorer.result.significant(),
                                  result.significant("fwer", p_th=explorer.p_th))
    explorer.preset = "directional"
    explorer.run(wait=True)  # the shown preset changes: choices renamed, the choice kept
    dropdown = explorer.display_panel.controls["overlay"]
    assert dropdown.value == explorer.overlay == "pvalue"
    assert dict((v, k) for k, v in dropdown.options)["posterior"] == "P(above null)"
