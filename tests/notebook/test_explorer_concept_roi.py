"""'Concept from ROI' in the explorer: the drawn regions become the target of a class map,
and the displays of the run name the map (signed colour bar centred at 0)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

from napari_attnreg import concept_from
from napari_attnreg.notebook import AttentionExplorer


@pytest.fixture
def explorer(blob_image, tiny_backbone):
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=8, device="cpu", view="image",
                           map="cdam")
    yield ex
    ex.close()


def test_a_drawn_rectangle_becomes_the_sessions_target(explorer, tiny_backbone, blob_image):
    explorer.add_roi(rectangle=(20, 10, 45, 35))
    explorer.concept_panel.button.click()
    mask = explorer.roi_labels > 0
    expected = concept_from(blob_image, tiny_backbone, mask)
    target = explorer.session.settings["target"]
    assert isinstance(target, np.ndarray) and target.shape == (tiny_backbone.embed_dim,)
    np.testing.assert_allclose(target, expected, rtol=1e-5, atol=1e-6)
    assert "target: concept from 1 region of the drawn ROI" in explorer.concept_panel.status.value
    # Run reads the concept from the advanced options (the text box shows what it is)
    options = explorer.options_panel.advanced
    assert options.controls["target"].value == "concept from 1 region of the drawn ROI"
    assert np.array_equal(options.values()["target"], expected)


def test_the_run_scores_the_concept_and_its_displays_name_the_map(explorer):
    explorer.add_roi(rectangle=(20, 10, 45, 35))
    explorer.add_roi(rectangle=(60, 45, 80, 70))
    explorer.concept_panel.button.click()
    assert "concept from 2 regions" in explorer.concept_panel.status.value
    explorer.overlay = "attention"
    result = explorer.run(wait=True)
    assert result is not None, explorer.status
    assert result.metadata["map"] == "cdam" and result.metadata["target"] == "concept"
    np.testing.assert_allclose(result.metadata["concept"], explorer.concept_panel.vector,
                               atol=1e-6)
    display = explorer.display_panel
    lo, hi = float(display.colorbar_lo.value), float(display.colorbar_hi.value)
    assert lo == pytest.approx(-hi) and hi > 0  # signed: centred at 0
    assert display.colorbar_label.value == "CDAM, concept (signed)"
    assert "red for it, blue against it" in display.legend.value
    assert "CDAM for concept" in explorer.summary_panel.summary.value
    assert "of the evidence for concept" in explorer.summary_panel.summary.value
    assert "Mean CDAM" in explorer.roi_panel.table.value
    assert "CDAM=" in explorer.canvas.describe_pixel(30, 20)


def test_without_a_region_or_with_a_map_that_reads_no_target(explorer):
    panel = explorer.concept_panel
    assert panel.build() is None
    assert "No region drawn" in panel.status.value and "target" not in explorer.session.settings
    explorer.options_panel.advanced.controls["map"].value = "rollout"
    explorer.add_roi(rectangle=(20, 10, 45, 35))
    assert panel.build() is None
    assert "class map (cdam or gradcam)" in panel.status.value
    assert panel.switch.layout.display is None  # 'Use CDAM' is offered
    panel.switch.click()
    assert explorer.options_panel.advanced.controls["map"].value == "cdam"
    assert panel.vector is not None


def test_typing_a_target_replaces_the_concept(explorer):
    explorer.add_roi(rectangle=(20, 10, 45, 35))
    explorer.concept_panel.button.click()
    explorer.options_panel.advanced.controls["target"].value = "predicted"
    assert explorer.concept_panel.vector is None
    assert "target" not in explorer.options_panel.advanced.values()


def test_the_concept_sees_the_channels_as_the_run_does(tiny_backbone, blob_image):
    two = np.stack([blob_image, blob_image[::-1]]).astype(np.float32)  # (C, H, W)
    ex = AttentionExplorer(two, tiny_backbone, n_boot=8, device="cpu", view="image",
                           channel_axis=0, map="cdam", merge="max")
    try:
        ex.add_roi(rectangle=(20, 10, 45, 35))
        vector = ex.concept_panel.build()
        mask = ex.roi_labels > 0
        np.testing.assert_allclose(
            vector, concept_from(two, tiny_backbone, mask, channel_axis=0, merge="max"),
            rtol=1e-5, atol=1e-6)
        assert not np.allclose(vector, concept_from(two, tiny_backbone, mask, channel_axis=0))
    finally:
        ex.close()


@pytest.mark.real_model
def test_concept_from_a_drawn_roi_on_the_real_article():
    """The real DINOv2 (no head): two outlined coins give a concept of its width, the same as
    the core's; skips without the article."""
    from skimage import data

    from napari_attnreg.testing import real_article

    try:
        backbone = real_article.load(device="cpu")
    except (real_article.ArticleUnavailable, ImportError) as err:
        pytest.skip(f"the real test article cannot be built here: {err}")
    coins = data.coins()
    ex = AttentionExplorer(coins, backbone, n_boot=8, device="cpu", view="image", map="cdam")
    try:
        ex.add_roi(rectangle=(107, 84, 145, 122))
        ex.add_roi(rectangle=(105, 185, 144, 227))
        vector = ex.concept_panel.build()
        assert vector is not None, ex.concept_panel.status.value
        assert vector.shape == (backbone.embed_dim,) == (384,)
        np.testing.assert_allclose(vector, concept_from(coins, backbone, ex.roi_labels),
                                   rtol=1e-5, atol=1e-6)
        assert "concept from 2 regions" in ex.concept_panel.status.value
    finally:
        ex.close()
