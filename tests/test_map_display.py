"""Every display names the tested map; signed maps are drawn centred at 0, raw maps never
rescaled (core.results.display, the patch report, the napari colormap, the notebook render)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from napari_attnreg import concept_from, regularize
from napari_attnreg.core.results.display import (
    SIGNED_COLORMAP,
    MapInfo,
    describe_pixel,
    map_display,
    roi_header,
    run_caption,
)
from napari_attnreg.core.results.meaning import result_meaning
from napari_attnreg.core.results.patch_report import patch_report


@pytest.fixture(scope="module")
def cdam_result(tiny_backbone):
    rng = np.random.default_rng(0)
    image = rng.random((64, 64)).astype(np.float32)
    mask = np.zeros(image.shape, bool)
    mask[10:30, 10:30] = True
    concept = concept_from(image, tiny_backbone, mask)
    return regularize(image, tiny_backbone, map="cdam", target=concept, n_boot=8,
                      device="cpu")


def _as_map(result, **metadata):
    return replace(result, metadata={**result.metadata, **metadata})


def test_the_map_is_read_from_the_result(cdam_result):
    info = MapInfo.of(cdam_result)
    assert (info.name, info.signed, info.target) == ("cdam", True, "concept")
    assert info.caption() == "CDAM for concept"
    against = _as_map(cdam_result, sign="against")
    assert MapInfo.of(against).caption() == "CDAM against concept"
    gradcam = _as_map(cdam_result, map="gradcam", map_label="Grad-CAM", map_signed=False,
                      target=3)
    assert MapInfo.of(gradcam).caption() == "Grad-CAM for class 3"
    assert MapInfo.of({}).is_default and MapInfo.of({}).caption() == "attention"
    assert MapInfo.of({"map": "rollout", "map_label": "attention rollout"}).caption() == \
        "attention rollout"


def test_a_signed_map_is_diverging_and_centred_at_zero(cdam_result):
    raw = map_display("attention", cdam_result)
    assert raw.colormap == SIGNED_COLORMAP and raw.diverging
    lo, hi = raw.limits(cdam_result)
    assert lo == -hi and hi == pytest.approx(np.abs(cdam_result.attention).max())
    assert cdam_result.attention.min() < 0 < cdam_result.attention.max()  # truly signed
    assert map_display("regularized", cdam_result).limits(cdam_result) == (lo, hi)
    # the statistics maps keep their own colormaps and ranges
    pvalue = map_display("pvalue", cdam_result)
    assert pvalue.colormap == "viridis" and pvalue.limits(cdam_result)[0] == 0.0
    assert map_display("attention").colormap == "inferno"  # no result: the default map


def test_a_raw_class_map_is_never_rescaled(cdam_result):
    raw = np.linspace(0.0, 7.5, cdam_result.attention.size).reshape(cdam_result.grid_shape)
    gradcam = replace(_as_map(cdam_result, map="gradcam", map_label="Grad-CAM",
                              map_signed=False), attention=raw.astype(np.float32))
    view = map_display("attention", gradcam)
    assert view.limits(gradcam) == (0.0, pytest.approx(7.5))
    np.testing.assert_array_equal(view.values(gradcam), gradcam.attention)
    assert view.title(gradcam.preset) == "Grad-CAM, concept (raw)"
    assert "never rescaled" in view.legend(gradcam.preset)


def test_titles_legends_captions_and_lookups_name_the_map(cdam_result):
    preset = cdam_result.preset
    assert map_display("pvalue", cdam_result).title(preset).startswith("CDAM for concept: ")
    assert map_display("attention", cdam_result).title(preset) == "CDAM, concept (signed)"
    assert "red for it, blue against it" in map_display("attention", cdam_result).legend(preset)
    assert map_display("posterior", cdam_result).legend(preset).startswith(
        "Tested map: CDAM for concept.")
    assert " · CDAM for concept · " in run_caption(cdam_result)
    assert " CDAM=" in describe_pixel(cdam_result, 5, 5)
    assert roi_header("mean_attention", preset, MapInfo.of(cdam_result)) == "Mean CDAM"
    assert roi_header("mean_attention", preset) == "Mean attention"
    assert result_meaning(preset, cdam_result.metadata).startswith(
        "Tested map: CDAM for concept. ")
    report = patch_report(cdam_result, 5, 5)
    assert report.values[0] == ("map", "CDAM for concept") and report.values[1][0] == "CDAM"


def test_the_napari_overlay_of_a_signed_map_is_clear_at_zero():
    from napari_attnreg._napari.layers import overlay_colormap

    signed = overlay_colormap("attention", signed=True)
    alpha = np.asarray(signed.colors)[:, 3]
    assert "RdBu" in signed.name
    assert alpha[0] == 1.0 and alpha[-1] == 1.0 and alpha[len(alpha) // 2] < 0.05
    plain = np.asarray(overlay_colormap("attention").colors)[:, 3]
    assert plain[0] == 0.0 and plain[-1] == 1.0
    # the significance maps of a signed run keep their sequential colormap
    assert "RdBu" not in overlay_colormap("pvalue", signed=True).name


def test_the_notebook_render_fades_a_signed_map_at_zero():
    from napari_attnreg.notebook import render

    base = np.full((1, 3), 0.5)
    values = np.array([[-1.0, 0.0, 1.0]])
    lut = render.colormap_lut(SIGNED_COLORMAP)
    out = render.composite(base, values, lut=lut, vmin=-1, vmax=1, opacity=1.0, centre=0.0)
    assert tuple(out[0, 1]) == (128, 128, 128)  # 0: the image itself
    assert tuple(out[0, 0]) == tuple(lut[0]) and tuple(out[0, 2]) == tuple(lut[-1])


def test_the_publication_figure_draws_a_signed_map_centred_at_zero(cdam_result, tmp_path,
                                                                 monkeypatch):
    from napari_attnreg.core.results import figure

    drawn = {}
    original = figure._draw_side

    def spy(fig, left_height, mapped, view, result, outline, *rest):
        drawn.update(clim=mapped.get_clim(), cmap=mapped.get_cmap().name, title=view.title(
            result.preset, result.thresholds))
        return original(fig, left_height, mapped, view, result, outline, *rest)

    monkeypatch.setattr(figure, "_draw_side", spy)
    image = np.zeros(cdam_result.image_shape, np.float32)
    figure.publication_figure(cdam_result, image, tmp_path / "cdam.png", map_key="attention")
    lo, hi = drawn["clim"]
    assert lo == -hi and hi > 0 and drawn["cmap"] == SIGNED_COLORMAP
    assert drawn["title"] == "CDAM, concept (signed)"
