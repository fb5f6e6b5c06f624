"""What "significant" means, per procedure, and rules a preset does not define refused."""

from __future__ import annotations

import pytest

from napari_attnreg import regularize
from napari_attnreg.core.results.meaning import result_meaning, significance_meaning


def test_each_preset_says_what_a_patch_was_compared_with():
    stepdown = significance_meaning("stepdown", 200, "patch")
    assert "half-patch blocks shuffled" in stepdown and "B = 200" in stepdown
    assert "not a detection" in stepdown
    assert "8-px blocks" in significance_meaning("stepdown", 50, "patch", 8)
    directional = significance_meaning("directional", 100, "normal")
    assert "higher" in directional and "noise" in directional
    assert "above or below" in significance_meaning("paper", 100, "normal")
    with pytest.raises(ValueError, match="not supported"):
        significance_meaning("bogus")


@pytest.mark.parametrize("preset", ["stepdown", "directional", "paper"])
def test_the_claim_is_about_the_tested_map_not_attention(preset):
    cdam = {"map": "cdam", "map_label": "CDAM", "map_signed": True, "sign": "for",
            "target": "concept", "n_boot": 50, "method": "patch"}
    text = result_meaning(preset, cdam)
    assert text.startswith("Tested map: CDAM for concept. Significant = CDAM for concept ")
    assert "attention" not in text.split("Significant = ")[1].split(" on ")[0]
    plain = result_meaning(preset, {"n_boot": 50, "method": "patch"})
    assert plain.startswith("Significant = attention ")


def test_under_the_stepdown_a_pooled_null_rule_is_refused_with_the_preset_rules(
        tiny_backbone, blob_image):
    res = regularize(blob_image, tiny_backbone, n_boot=4, device="cpu")
    assert res.preset == "stepdown"
    for call in (lambda: res.significant("q"), lambda: res.regularized("lfdr")):
        with pytest.raises(ValueError, match="forwardstop, fwer, soft"):
            call()
    res.significant("fwer")  # its own rules work
    assert "half-patch" in result_meaning(res.preset, res.metadata)


def test_the_stepdown_inspector_shows_z_only_with_a_z_mask(tiny_backbone, blob_image):
    from napari_attnreg.core.results.patch_report import patch_report

    res = regularize(blob_image, tiny_backbone, n_boot=4, device="cpu")
    names = [name for name, _ in patch_report(res, 10, 10).values]
    assert "z" not in names and "evidence" in names
    masked = res.with_thresholds(z_th=0.0)
    assert "z" in [name for name, _ in patch_report(masked, 10, 10).values]


def test_an_outline_over_most_of_the_image_is_explained_not_recommended(tiny_backbone,
                                                                        monkeypatch):
    import numpy as np

    from napari_attnreg.core.results.display import diagnostics_lines
    from napari_attnreg.core.stats.diagnostics import diagnose

    gradient = np.tile(np.linspace(0, 255, 96), (96, 1)).astype(np.uint8)
    res = regularize(gradient, tiny_backbone, n_boot=4, device="cpu", preset="directional")
    monkeypatch.setattr(type(res), "significant",
                        lambda self, *a, **k: np.ones(self.grid_shape, bool))
    lines = diagnostics_lines(res)
    assert lines[0].startswith("⚠ The significant outline covers 100 %")
    assert "white-noise" in lines[0] and "step-down" in lines[0]
    assert not any("Trust the significance outline" in line for line in lines)
    # the broad-posterior warning itself never advises trusting the outline
    # (a map with some spread: a flat one is named flat_map instead, not by its symptoms)
    broad = [d for d in diagnose(np.linspace(1, 2, 64) / 96, pi0=0.5, lfdr_fit="test",
                                 posterior=np.ones(64), random_init=False, model_name="m")
             if d.code == "broad_posterior"]
    assert broad and "Trust" not in broad[0].message and "locates nothing" in broad[0].message
    assert broad_outline_absent_under_stepdown(tiny_backbone, gradient)


def broad_outline_absent_under_stepdown(tiny_backbone, image) -> bool:
    from napari_attnreg.core.results.meaning import broad_outline_warning

    return broad_outline_warning("stepdown", 0.9) is None and \
        broad_outline_warning("paper", 0.4) is None


def test_the_evidence_column_tooltip_names_its_csv_column():
    from napari_attnreg.core.results.display import ROI_COLUMN_HELP

    assert "mean_posterior" in ROI_COLUMN_HELP["mean_posterior"]
    assert "50 = typical" in ROI_COLUMN_HELP["mean_pct_raw"]  # percentile vs mean explained


def test_provenance_of_a_patch_null_run_says_what_the_null_was(tiny_backbone, blob_image):
    from napari_attnreg.core.results.meaning import null_record
    from napari_attnreg.io.export import provenance

    res = regularize(blob_image, tiny_backbone, n_boot=4, device="cpu")
    block = res.metadata["patch_block_size"]  # half the tiny model's patch, in model pixels
    assert provenance(res.metadata)["null"] == f"patch blocks of {block} px shuffled"
    res = regularize(blob_image, tiny_backbone, n_boot=4, device="cpu", block_size=2)
    assert provenance(res.metadata)["null"] == "patch blocks of 2 px shuffled"
    # the pooled-null presets keep their z null model there
    res = regularize(blob_image, tiny_backbone, n_boot=4, device="cpu", preset="directional")
    assert provenance(res.metadata)["null"] == "theoretical"
    assert null_record({"method": "pixel"}) == "pixels shuffled"
    assert null_record({}) is None
