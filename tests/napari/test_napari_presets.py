"""Presets, the directional maps' names and legends, the outline, colorbars and diagnostics."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from napari_attnreg._napari.layers import CONTINUOUS_KINDS, KINDS, layer_name, token_grid
from napari_attnreg.core.results.display import (
    MAPS_BY_KEY,
    SIGNIFICANT_COLOR,
    significance_caption,
)
from napari_attnreg.core.stats.presets import PRESET_DEFAULTS

pytestmark = pytest.mark.gui


def _rgba(hex_color: str) -> np.ndarray:
    return np.array([int(hex_color[i : i + 2], 16) / 255 for i in (1, 3, 5)] + [1.0])


STATISTICS_OPTIONS = ("p_method", "alternative", "pi0_method", "null", "null_pool")


def _statistics_options(widget):
    """The statistics options the widget's run would use, after the preset filled them."""
    resolved = widget.run_config().resolved()
    return {k: getattr(resolved, k) for k in STATISTICS_OPTIONS}


def _preset_options(preset):
    return {k: PRESET_DEFAULTS[preset][k] for k in STATISTICS_OPTIONS}


def _outputs(viewer, name, preset):
    return {kind: viewer.layers[layer_name(name, kind, preset)] for kind in KINDS}


def _use(widget, preset):
    widget.options.controls["preset"].setCurrentIndex(
        widget.options.controls["preset"].findData(preset))


def test_default_run_is_stepdown_with_evidence_and_the_map_level_p(
    viewer_widget, run_and_wait, cells_image
):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    assert widget.preset() == "stepdown"
    assert widget.thresholds_panel.rule_combo.currentData() == "forwardstop"
    offered = [widget.thresholds_panel.rule_combo.itemData(i)
               for i in range(widget.thresholds_panel.rule_combo.count())
               if widget.thresholds_panel.rule_combo.model().item(i).isEnabled()]
    assert offered == ["forwardstop", "fwer", "soft"]
    assert widget.options.controls["method"].currentData() == "patch"
    run_and_wait(widget)
    result = widget.current_record().results[()]
    assert result.preset == "stepdown" and result.p_map is not None
    layers = _outputs(viewer, "cells", "stepdown")
    assert layers["pvalue"].name == "cells · −log10 adjusted p (step-down)"
    assert layers["posterior"].name == "cells · evidence (1 − adjusted p)"
    np.testing.assert_allclose(layers["posterior"].data, result.posterior, rtol=1e-6)
    np.testing.assert_allclose(layers["pvalue"].data,
                               -np.log10(np.maximum(result.q, 1 / (100 * 17))), rtol=1e-5)
    assert layers["posterior"].metadata["attnreg"]["legend"] == MAPS_BY_KEY["posterior"].legend(
        "stepdown")
    status = widget.run_panel.status_label.text()
    assert "step-down" in status and "is anything here?" in status and "1/17" in status


def test_directional_run_with_outline_and_colorbars(
    viewer_widget, run_and_wait, cells_image
):
    from napari.layers import Image, Labels

    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    _use(widget, "directional")
    assert widget.preset() == "directional"
    assert widget.thresholds_panel.rule_combo.currentData() == "q" and widget.thresholds()[
        "q_th"
    ] == pytest.approx(0.1)
    assert (
        widget.thresholds()["z_th"] is None and not widget.thresholds_panel.z_mask_check.isChecked()
    )
    assert _statistics_options(widget) == _preset_options("directional")
    run_and_wait(widget)
    result = widget.current_record().results[()]
    assert result.preset == "directional"
    assert "cells · −log10 p, above null" in viewer.layers
    assert "cells · P(above null)" in viewer.layers
    layers = _outputs(viewer, "cells", "directional")
    for kind in CONTINUOUS_KINDS:
        layer = layers[kind]
        assert isinstance(layer, Image) and layer.colorbar.visible
        assert layer.metadata["attnreg"]["legend"] == MAPS_BY_KEY[kind].legend("directional")
    assert "above" in layers["pvalue"].metadata["attnreg"]["legend"]
    # −log10 p⁺ and posterior⁺ are what the layers show
    np.testing.assert_allclose(layers["pvalue"].data, -np.log10(result.p), rtol=1e-5)
    np.testing.assert_allclose(layers["posterior"].data, result.posterior, rtol=1e-6)
    sig = layers["significant"]
    # the labels hold the patches (to paint); the thin outline layer above them draws them
    assert isinstance(sig, Labels) and not sig.visible
    outline = viewer.layers["cells · significant outline"]
    assert outline.current_edge_color.startswith(SIGNIFICANT_COLOR.lower())
    np.testing.assert_allclose(
        sig.colormap.map(np.array([1]))[0], _rgba(SIGNIFICANT_COLOR), atol=1e-6
    )
    np.testing.assert_allclose(sig.colormap.map(np.array([0]))[0][3], 0.0)  # background clear
    assert set(np.unique(sig.data)) <= {0, 1}
    caption = significance_caption(result, widget.thresholds())
    assert "above the null" in caption
    assert caption in widget.run_panel.status_label.text()
    assert caption in viewer.status


def test_preset_switch_resets_thresholds_and_renames_layers(
    viewer_widget, run_and_wait, cells_image, qtbot
):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    _use(widget, "directional")
    run_and_wait(widget)
    first = _outputs(viewer, "cells", "directional")
    n_layers = len(viewer.layers)
    widget.thresholds_panel.q_th_slider.setValue(0.3)
    widget.options.controls["preset"].setCurrentIndex(
        widget.options.controls["preset"].findData("paper")
    )
    paper = PRESET_DEFAULTS["paper"]
    # the panel keeps showing the directional result's own thresholds (the move went to it) …
    qtbot.waitUntil(lambda: widget.thresholds()["q_th"] == pytest.approx(0.3), timeout=5000)
    assert widget.thresholds()["rule"] == "q" and not widget.thresholds_panel.z_mask_check.isChecked()
    # … while the next run starts from the paper's
    t = widget.run_config()
    assert t.rule == paper["rule"] == "lfdr"
    assert (t.z_th, t.l_th, t.q_th) == pytest.approx((paper["z_th"], paper["l_th"], 0.1))
    assert widget.options.controls["p_method"].isEnabled()  # the paper's options are editable
    assert _statistics_options(widget) == _preset_options("paper")
    assert widget.options.controls["preset"].toolTip() and "BELOW" in widget.options.controls[
        "preset"
    ].itemData(widget.options.controls["preset"].findData("paper"), 3)  # Qt.ToolTipRole
    run_and_wait(widget)
    result = widget.current_record().results[()]
    assert result.preset == "paper" and result.metadata["p_method"] == "pooled"
    second = _outputs(viewer, "cells", "paper")
    assert second["pvalue"].name == "cells · −log10 p (two-sided)"
    assert second["posterior"].name == "cells · posterior 1 − lfdr (two-sided)"
    assert all(second[k] is first[k] for k in KINDS) and len(viewer.layers) == n_layers
    assert "cells · −log10 p, above null" not in viewer.layers
    assert "two-sided" in widget.run_panel.status_label.text()
    # the paper's result shows the paper's thresholds
    assert widget.thresholds()["rule"] == "lfdr" and widget.thresholds_panel.z_mask_check.isChecked()
    # and back: the directional preset fixes the one-sided options again
    widget.options.controls["preset"].setCurrentIndex(
        widget.options.controls["preset"].findData("directional")
    )
    assert (
        not widget.options.controls["p_method"].isEnabled() and widget.run_config().rule == "q"
    )
    assert widget.thresholds()["rule"] == "lfdr"  # still the paper result's
    assert _statistics_options(widget) == _preset_options("directional")
    assert widget.run_config().resolved().alternative == "greater"


def test_q_threshold_move_updates_layers_and_status(
    viewer_widget, run_and_wait, cells_image, qtbot
):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    _use(widget, "directional")
    run_and_wait(widget)
    result = widget.current_record().results[()]
    before = widget.run_panel.status_label.text()
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.q_th_slider.setValue(1.0)  # every patch has q ≤ 1
    assert widget.worker is None
    sig = token_grid(viewer.layers["cells · significant"].data)
    np.testing.assert_array_equal(sig == 1, result.significant("q", q_th=1.0))
    assert int((sig == 1).sum()) == sig.size
    after = widget.run_panel.status_label.text()
    assert after != before and f"{sig.size}/{sig.size} patches significant (q ≤ 1)" in after
    assert viewer.layers["cells · regularized"].metadata["attnreg"]["thresholds"]["q_th"] == 1.0
    # the z mask box: off = no z mask, on = z ≥ the slider's value
    with qtbot.waitSignal(widget.outputs_updated, timeout=5000):
        widget.thresholds_panel.z_mask_check.setChecked(True)
        widget.thresholds_panel.z_th_slider.setValue(1.0)
    np.testing.assert_array_equal(
        token_grid(viewer.layers["cells · significant"].data) == 1,
        result.significant("q", q_th=1.0, z_th=1.0),
    )
    assert "z ≥ 1" in widget.run_panel.status_label.text()


def test_diagnostics_of_a_random_model_reach_status_and_notification(
    viewer_widget, run_and_wait, cells_image, tiny_backbone, notifications
):
    from napari.utils.notifications import NotificationSeverity

    viewer, widget = viewer_widget
    random_model = replace(tiny_backbone, weights="random-init")
    random_model.domain = "synthetic test blobs"  # as a model catalogue entry would declare
    widget.set_model(random_model, name="tiny random")
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    result = widget.current_record().results[()]
    codes = {d.code for d in result.diagnostics}
    assert {"random_init", "uniform_attention", "model_domain"} <= codes
    text = widget.run_panel.status_label.text()
    assert "random weights" in text and "nearly uniform" in text
    assert "(synthetic test blobs)" in text and "Model domain: synthetic test blobs" in text
    warnings_ = [n for n in notifications if n.severity == NotificationSeverity.WARNING]
    assert warnings_ and "random weights" in warnings_[-1].message
    assert "nearly uniform" in warnings_[-1].message
    assert "Model domain" not in warnings_[-1].message  # information, not a warning


def test_a_greyed_rule_chosen_in_code_is_refused_and_said(
    viewer_widget, run_and_wait, cells_image, qtbot
):
    """Clicks and keys skip the rules a preset greys out, ``setCurrentIndex`` does not: the
    rule went through and raised inside the debounced slot (a step-down result has no 'q')."""
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    combo = widget.thresholds_panel.rule_combo
    before = widget.thresholds()
    regularized = viewer.layers[layer_name("cells", "regularized", "stepdown")].data.copy()
    greyed = combo.findData("q")
    assert not combo.model().item(greyed).isEnabled()
    combo.setCurrentIndex(greyed)
    qtbot.wait(4 * 40)  # past the panel's debounce: a slot that raises fails the test
    assert combo.currentData() == before["rule"] == "forwardstop"
    assert widget.thresholds() == before
    status = widget.run_panel.status_label.text()
    assert "does not apply to step-down results" in status and "ForwardStop" in status
    assert "patches significant" in status  # the result's summary stays under the note
    np.testing.assert_array_equal(
        viewer.layers[layer_name("cells", "regularized", "stepdown")].data, regularized)
    combo.setCurrentIndex(combo.findData("fwer"))  # an offered rule still applies
    qtbot.waitUntil(lambda: widget.thresholds()["rule"] == "fwer", timeout=2000)
