"""The soft rule tests nothing: the status must not call its outline "significant".

Under ``rule="soft"`` every patch is weighed by its evidence (posterior under the pooled
presets, 1 − adjusted p under step-down) and the outline marks evidence ≥ 0.5; the status
line used to print "k/n patches significant (attention × posterior)", a count of tests that
were never made, named after a map step-down results do not have.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from napari_attnreg import regularize
from napari_attnreg.core.results.display import rule_text, significance_caption


@functools.cache
def _run(preset: str):
    image = np.random.default_rng(0).random((128, 128)).astype(np.float32)
    return regularize(image, "demo", preset=preset, n_boot=8, seed=0, device="cpu")


@pytest.mark.parametrize("preset", ["stepdown", "directional", "paper"])
def test_the_soft_caption_counts_evidence_not_significance(preset):
    result = _run(preset)
    soft = result.with_thresholds(rule="soft")
    z_th = soft.thresholds_used["z_th"]  # the paper preset keeps its z mask
    outline = np.nan_to_num(soft.evidence) >= 0.5
    if z_th is not None:
        outline &= soft.z >= z_th
    kept = int(outline.sum())
    assert int(soft.significant().sum()) == kept  # what the outline marks
    caption = significance_caption(result, {"rule": "soft"})
    also = "" if z_th is None else f" and z ≥ {z_th:g}"
    assert caption.startswith(f"{kept}/256 patches with evidence ≥ 0.5{also} "
                              "(attention × evidence)")
    assert "significant" not in caption.split(",")[0]
    # the tested rules still count significant patches
    assert "patches significant (" in significance_caption(result)


def test_rule_text_names_the_evidence_every_procedure_has():
    assert rule_text({"rule": "soft", "z_th": 1.0}) == "attention × evidence"
