"""Presets through the whole pipeline: dispatch, overrides, recorded metadata, position-aware null."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch

from napari_attnreg import AttentionResult, regularize
from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.engine import RunConfig
from napari_attnreg.core.stats import directional as D
from napari_attnreg.core.stats import paper as S
from napari_attnreg.samples import demo_image

FAST = {"n_boot": 12, "chunk_size": 6, "device": "cpu", "keep_nulls": True}
DIRECTIONAL = {**FAST, "preset": "directional"}


def _recompute(res: AttentionResult, fn, **kw):
    null = torch.from_numpy(res.null_scores.reshape(res.null_scores.shape[0], -1))
    return fn(torch.from_numpy(res.attention.reshape(-1)).float(), null, **kw)


def test_default_is_stepdown_and_its_numbers_are_the_stepdown_statistics(tiny_backbone, blob_image):
    from napari_attnreg.core.stats.stepdown_maps import stepdown_statistics

    res = regularize(blob_image, tiny_backbone, **FAST)
    assert res.preset == "stepdown" and res.thresholds["rule"] == "forwardstop"
    assert res.thresholds["z_th"] is None and res.thresholds["q_th"] == 0.1
    assert res.metadata["method"] == "patch" and res.metadata["tail"] == "none"
    s = _recompute(res, stepdown_statistics)
    for name, field in (("step_p", "p"), ("adjusted_p", "q"), ("evidence", "posterior")):
        np.testing.assert_array_equal(res.maps[name].ravel(), getattr(s, field), err_msg=name)
    assert res.p_map == s.null_summary["p_map"] == res.p.ravel()[np.argmax(res.attention)]
    assert res.null_summary["lfdr_fit"] == "stepdown" and res.pi0 == 1.0
    # the patch null's blocks are half a patch (16 → 8) under this preset
    assert res.metadata["patch_block_size"] == 8


def test_directional_numbers_are_the_directional_statistics(tiny_backbone, blob_image):
    res = regularize(blob_image, tiny_backbone, **DIRECTIONAL)
    assert res.preset == "directional" and res.thresholds["rule"] == "q"
    assert res.thresholds["z_th"] is None and res.thresholds["q_th"] == 0.1
    s = _recompute(res, D.directional_statistics)
    assert list(res.maps) == ["z", "p", "q", "lfdr", "posterior"]  # its own maps, by name
    for name in ("p", "q", "lfdr", "posterior"):
        np.testing.assert_array_equal(res.maps[name].ravel(), getattr(s, name), err_msg=name)
    assert res.pi0 == s.pi0 and res.metadata["pi0_method"] == "bh"
    assert res.null_summary["lfdr_fit"] == "grenander"


def test_paper_preset_is_the_papers_procedure(tiny_backbone, blob_image):
    res = regularize(blob_image, tiny_backbone, preset="paper", **FAST)
    s = _recompute(res, S.compute_statistics)  # the paper's defaults
    for name in ("p", "q", "lfdr", "posterior", "z"):
        np.testing.assert_array_equal(getattr(res, name).ravel(), getattr(s, name), err_msg=name)
    assert res.thresholds == {"rule": "lfdr", "z_th": 0.0, "p_th": 0.3, "l_th": 0.3, "q_th": 0.1}
    md = res.metadata
    assert (md["preset"], md["p_method"], md["alternative"], md["pi0_method"]) == (
        "paper", "pooled", "two-sided", "reference")


def test_explicit_options_override_the_preset(tiny_backbone, blob_image):
    res = regularize(blob_image, tiny_backbone, preset="paper", pi0_method="smoother",
                     rule="p", p_th=0.05, **FAST)
    assert res.metadata["pi0_method"] == "smoother" and res.thresholds["rule"] == "p"
    assert res.thresholds["p_th"] == 0.05 and res.thresholds["l_th"] == 0.3
    res = regularize(blob_image, tiny_backbone, pi0_method=0.9, z_th=0.5, **DIRECTIONAL)
    assert res.pi0 == 0.9 and res.thresholds["z_th"] == 0.5


@pytest.mark.parametrize("options, match", [
    ({"preset": "directional", "alternative": "two-sided"}, "preset='paper'"),
    ({"preset": "directional", "p_method": "pooled"}, "preset='paper'"),
    ({"alternative": "two-sided"}, "step-down preset"),
    ({"pi0_method": "storey"}, "step-down preset"),
    ({"rule": "q"}, "not available under preset='stepdown'"),
    ({"preset": "directional", "rule": "forwardstop"}, "not available"),
    ({"preset": "paper", "tail": "gpd"}, "step-down"),
    ({"preset": "paper", "null_pool": "position"}, "directional"),
    ({"preset": "bayes"}, "preset="),
    ({"q_th": 1.5}, "q_th"),
    ({"null_pool": "row"}, "null_pool"),
])
def test_contradictory_options_are_clear_errors(options, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(**options).validate()


def test_thresholds_of_a_saved_result_survive_and_old_files_read_as_paper(tmp_path, tiny_backbone,
                                                                         blob_image):
    for options in (FAST, DIRECTIONAL):
        res = regularize(blob_image, tiny_backbone, **options)
        back = AttentionResult.load(res.save(tmp_path / "r.npz"))
        assert back.preset == res.preset and back.thresholds == res.thresholds
        assert back.p_map == res.p_map
        for rule, level in (("forwardstop", 0.5), ("fwer", 0.3)) if res.p_map else ():
            np.testing.assert_array_equal(back.significant(rule, q_th=level, p_th=level),
                                          res.significant(rule, q_th=level, p_th=level))
        np.testing.assert_array_equal(back.significant(), res.significant())
    # a file written before presets existed: paper statistics and paper thresholds
    old = AttentionResult(**{**{f: getattr(res, f) for f in (
        "attention", "maps", "pi0", "image_shape", "model_shape", "patch_size")},
        "thresholds": {"rule": "lfdr", "z_th": 0.0, "p_th": 0.3, "l_th": 0.3},
        "metadata": {}})
    assert old.preset == "paper" and old._thresholds()["q_th"] == 0.1
    old.significant("q")  # the new rule works on old results too


def test_q_rule_keeps_exactly_the_tokens_at_or_below_q_th(tiny_backbone, blob_image):
    res = regularize(blob_image, tiny_backbone, **DIRECTIONAL)
    for q_th in (0.0, 0.05, 0.5, 1.0):
        np.testing.assert_array_equal(res.significant("q", q_th=q_th), res.q <= q_th)
    np.testing.assert_array_equal(res.regularized("q", q_th=1.0), res.attention)


# ------------------------------------------------------------------- position-aware null


@pytest.fixture(scope="module")
def corner_biased_vit():
    """A 1-block random ViT whose position embedding makes the top-left patch attract the CLS
    query on any input: the corner token's key is aligned with the (input-independent) CLS
    query of that block."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1).eval()
    blk, dim = model.blocks[0], model.embed_dim
    with torch.no_grad():
        # sharper queries (random-init logits are tiny), then the corner key along the query
        blk.attn.qkv.weight[:dim] *= 5
        blk.attn.qkv.bias[:dim] *= 5
        cls = model.cls_token[0, 0] + model.pos_embed[0, 0]
        q = blk.attn.qkv(blk.norm1(cls))[:dim]
        w_k = blk.attn.qkv.weight[dim: 2 * dim]
        direction = (w_k.T @ q) / blk.norm1.weight
        direction -= direction.mean()  # survive the LayerNorm's centring
        model.pos_embed[0, 1] += 50 * direction / direction.norm()
    return load_backbone(model)


def test_position_null_does_not_flag_position_locked_attention(corner_biased_vit):
    rng = np.random.default_rng(1)
    noise = rng.normal(0.5, 0.1, size=(224, 224)).astype(np.float32)  # no object anywhere
    common = {"n_boot": 60, "device": "cpu", "seed": 3, "rule": "p", "p_th": 0.01,
              "preset": "directional"}
    pooled = regularize(noise, corner_biased_vit, **common)
    position = regularize(noise, corner_biased_vit, null_pool="position", **common)
    att = pooled.attention
    assert att[0, 0] > 20 * np.median(att)  # the bias is real, on noise input too
    assert pooled.significant()[0, 0] and pooled.p[0, 0] == pooled.p.min()
    assert not position.significant()[0, 0] and position.p[0, 0] > 0.05
    assert position.metadata["null_pool"] == "position"
    assert position.significant().mean() <= 0.05


# ------------------------------------------------------------------ the bundled demo image


@pytest.fixture(scope="module")
def demo_result():
    return regularize(demo_image(), "demo", device="cpu", n_boot=100, seed=0, preset="directional")


def test_demo_image_below_null_tokens_never_look_real(demo_result):
    res = demo_result
    null_median = float(np.interp(0.5, res.null_summary["quantile_levels"],
                                  res.null_summary["z_null_quantiles"]))
    below = res.z < null_median
    assert below.sum() > 100  # most of the field is empty background
    assert res.posterior[below].max() <= 0.5
    assert res.posterior[res.p >= 0.5].max(initial=0) <= 0.5
    assert not res.significant()[below].any()


def test_demo_image_significant_tokens_sit_on_the_planted_figures(demo_result):
    import tifffile

    from napari_attnreg.samples import DATA_DIR

    mask = tifffile.imread(DATA_DIR / "demo_cells_mask.tif") > 0
    sig = demo_result.significant()
    assert sig.any()
    covered = demo_result.token_coverage(mask)
    assert covered[sig].mean() > 0.25  # significant tokens lie on the decisive objects


def test_a_map_wide_posterior_is_explained_in_words():
    """Real fields are less dispersed than the white-noise null maps; when that lifts the
    posterior over most of a field, the result says so instead of leaving a bright layer."""
    from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image

    field = make_cell_image([0, 7, 1], size=512, scale=4 * TRAINING_SCALE, abnormal=True,
                            hard_negatives=False)
    res = regularize(field.image, "demo", device="cpu", n_boot=100, seed=0, preset="directional")
    assert np.mean(res.posterior >= 0.5) > 0.5  # this field shows the effect
    assert res.significant().sum() <= 3  # while the q rule stays sparse
    assert "broad_posterior" in [d.code for d in res.diagnostics]
    assert "posterior is ≥ 0.5" in res.summary()


def test_the_stepdown_default_is_quiet_on_that_field_where_it_counts():
    """The same field under the default: evidence is not map-wide, and no such warning."""
    from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image

    field = make_cell_image([0, 7, 1], size=512, scale=4 * TRAINING_SCALE, abnormal=True,
                            hard_negatives=False)
    res = regularize(field.image, "demo", device="cpu", n_boot=100, seed=0)
    assert np.mean(res.posterior >= 0.5) < 0.1
    assert "broad_posterior" not in [d.code for d in res.diagnostics]
    assert "p_map=" in res.summary() and res.p_map <= 0.05


def test_demo_image_stepdown_evidence_never_falls_as_attention_rises():
    res = regularize(demo_image(), "demo", device="cpu", n_boot=100, seed=0)
    order = np.argsort(-res.attention, axis=None, kind="stable")
    assert np.all(np.diff(res.posterior.ravel()[order]) <= 0)
    assert res.significant().any() and res.p_map < 0.05
