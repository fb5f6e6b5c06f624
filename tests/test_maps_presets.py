"""Every preset with every map: heads and attention sinks under the pooled-null presets.

Under the paper and directional presets each head (or the one map with its sinks left out)
is tested alone against its own null columns; q is taken over every head's tokens together,
the local fdr per head; each token reports the head that gives it the most attention.
"""

from __future__ import annotations

import csv
from dataclasses import replace

import numpy as np
import pytest
import reference_impl as ref
import torch
from attention_reference import peaked

from napari_attnreg import regularize
from napari_attnreg.core.run.options import MAPS, OPTIONS, applicable_options
from napari_attnreg.core.stats.directional import directional_statistics
from napari_attnreg.core.stats.map_checks import attention_sinks
from napari_attnreg.core.stats.paper import compute_statistics
from napari_attnreg.core.stats.pooled_families import family_statistics
from napari_attnreg.core.stats.procedures import get_procedure, procedure_names
from napari_attnreg.core.stats.rules import regularized_maps

FAST = {"n_boot": 12, "device": "cpu", "chunk_size": 6, "seed": 1}
SINK = 6  # row 1, column 2 of the 4 × 4 grid


def tiny_classifier():
    """A tiny timm classifier (4 classes, 4 heads) on 64 px images: a 4 × 4 grid, with
    unit-scale weights so its maps are far from uniform."""
    import timm

    from napari_attnreg.core.models.backbones import load_backbone

    torch.manual_seed(0)
    bb = load_backbone(timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2,
                                         img_size=64, num_classes=4))
    peaked(bb.model)
    bb.input_size = (3, 64, 64)  # the loader reads timm's default config (224 px)
    return bb


@pytest.fixture(scope="module")
def classifier():
    return tiny_classifier()


@pytest.fixture(scope="module")
def field():
    rng = np.random.default_rng(0)
    image = rng.random((64, 64)).astype(np.float32)
    image[8:24, 40:56] += 2.0
    return image


def prepared(bb, image):
    from napari_attnreg.core.run.images import prepare_image

    return prepare_image(image, patch_size=bb.patch_size, mean=bb.mean, std=bb.std,
                         default_size=bb.input_size[1:]).tensor


def with_sink(bb, image):
    """A copy of ``bb`` whose patch :data:`SINK` is high-norm and draws the CLS attention
    of every head of the last block (a register-less ViT's attention sink)."""
    from napari_attnreg.core.models.base import copy_module

    model = copy_module(bb.model, lambda t: t.clone())
    npt = bb.num_prefix_tokens
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        model.pos_embed[0, npt + SINK] += 40.0 * torch.randn(model.embed_dim, generator=gen)
        seen = {}
        block = model.blocks[-1]
        hook = block.norm1.register_forward_hook(lambda m, i, o: seen.__setitem__("h", o))
        model.forward_features(prepared(bb, image)[None])
        hook.remove()
        w = seen["h"][0, npt + SINK]
        width = model.embed_dim
        u = torch.ones(width) / width ** 0.5
        qkv = block.attn.qkv
        qkv.weight[:width] = 0
        qkv.bias[:width] = 30 * u  # every head's CLS query points along u ...
        qkv.weight[width:2 * width] = torch.outer(u, w / w.norm() ** 2)  # ... keys: u·(w·h)
        qkv.bias[width:2 * width] = 0
    return replace(bb, model=model)


def target_of(name):
    return {"target": 2} if name in ("cdam", "gradcam") else {}


# ------------------------------------------------------------------ every preset, every map
@pytest.mark.parametrize("preset", procedure_names())
@pytest.mark.parametrize("name", MAPS)
def test_every_preset_runs_every_map(preset, name, classifier, field):
    result = regularize(field, classifier, map=name, preset=preset, **target_of(name), **FAST)
    assert result.metadata["map"] == name and result.preset == preset
    for values in result.maps.values():
        assert values.shape == (4, 4) and np.isfinite(values).all()
    assert ((result.p >= 0) & (result.p <= 1)).all() and 0 <= result.pi0 <= 1
    assert result.significant().shape == (4, 4)
    if name == "heads":
        evidence = np.asarray(result.metadata["family_evidence"])
        assert evidence.shape == (classifier.num_heads, 4, 4) and np.isfinite(evidence).all()
        np.testing.assert_allclose(result.attention, result.head_attention.mean(0), rtol=1e-6)


# ------------------------------------------------------------------ heads, pooled presets
def literal_paper(obs, null):
    """The paper's statistics of one map, literally (tests/reference_impl.py, token grid)."""
    z, z_null, _, _ = ref.z_scores(obs, null)
    p = ref.pvalues(z, z_null, "pooled", "two-sided")
    pi0 = ref.pi0_reference(p)
    return {"z": z, "p": p, "pi0": pi0, "lfdr": ref.lfdr(z, pi0, "theoretical")}


def run_heads(preset, bb, image):
    result = regularize(image, bb, map="heads", preset=preset, keep_nulls=True, **FAST)
    heads = result.head_attention.reshape(bb.num_heads, -1)
    null = result.null_scores.reshape(FAST["n_boot"], bb.num_heads, -1).astype(np.float64)
    return result, heads, null, heads.argmax(axis=0)


def test_heads_under_paper_is_each_head_alone_with_q_over_all_heads(classifier, field):
    result, heads, null, owner = run_heads("paper", classifier, field)
    each = [literal_paper(heads[h], null[:, h]) for h in range(len(heads))]
    p_all = np.stack([e["p"] for e in each])
    pi0_all = ref.pi0_reference(p_all.ravel())
    q_all = ref.qvalues(p_all.ravel(), pi0_all).reshape(p_all.shape)
    tokens = np.arange(heads.shape[1])
    for key, stacked in (("z", np.stack([e["z"] for e in each])), ("p", p_all),
                         ("lfdr", np.stack([e["lfdr"] for e in each])), ("q", q_all)):
        np.testing.assert_allclose(getattr(result, key).ravel(), stacked[owner, tokens],
                                   rtol=1e-9, atol=1e-12, err_msg=key)
    assert result.pi0 == pytest.approx(pi0_all)
    # the heads disagree about their tokens, so owning matters (the test would see it)
    assert len(set(owner.tolist())) > 1
    evidence = np.asarray(result.metadata["family_evidence"]).reshape(len(heads), -1)
    np.testing.assert_allclose(evidence, 1 - np.stack([e["lfdr"] for e in each]), atol=1e-12)


def test_heads_under_directional_take_bh_over_all_heads(classifier, field):
    result, heads, null, owner = run_heads("directional", classifier, field)
    p_all = np.empty_like(heads)
    for h in range(len(heads)):
        log_null = np.log(null[:, h])
        z = (np.log(heads[h]) - log_null.mean()) / log_null.std()
        z_null = (log_null - log_null.mean()) / log_null.std()
        p_all[h] = [(1 + np.sum(z_null >= v)) / (1 + z_null.size) for v in z]
    q_all = ref.qvalues(p_all.ravel(), 1.0).reshape(p_all.shape)  # BH over all heads' tokens
    tokens = np.arange(heads.shape[1])
    np.testing.assert_allclose(result.p.ravel(), p_all[owner, tokens], rtol=1e-12)
    np.testing.assert_allclose(result.q.ravel(), q_all[owner, tokens], rtol=1e-12)
    alone = [directional_statistics(torch.from_numpy(heads[h]), torch.from_numpy(null[:, h]))
             for h in range(len(heads))]
    np.testing.assert_allclose(result.posterior.ravel(),
                               np.stack([s.posterior for s in alone])[owner, tokens], atol=1e-12)


def test_one_family_with_tokens_left_out_is_the_procedure_on_the_kept_tokens():
    gen = torch.Generator().manual_seed(4)
    obs = torch.rand(25, generator=gen, dtype=torch.float64) + 0.02
    obs[3] = 4.0
    null = torch.rand(40, 25, generator=gen, dtype=torch.float64) + 0.02
    keep = np.setdiff1d(np.arange(25), [3])
    family_of, local = np.zeros(25, int), np.zeros(25, int)
    local[keep] = np.arange(keep.size)
    stats = family_statistics(compute_statistics, obs, null[:, keep], families=obs[keep][None],
                              owner=(family_of, local), family_tokens=keep[None],
                              pi0_method="reference")
    alone = compute_statistics(obs[keep], null[:, keep])
    for key in ("z", "p", "q", "lfdr", "posterior"):
        np.testing.assert_array_equal(getattr(stats, key)[keep], getattr(alone, key), key)
        assert np.isnan(getattr(stats, key)[3]) == (key != "z")
    assert stats.pi0 == alone.pi0
    assert stats.z[3] == pytest.approx((np.log(4.0) - alone.mu0) / alone.sigma0)


# ------------------------------------------------------------------ sinks, pooled presets
@pytest.fixture(scope="module")
def sinky(classifier, field):
    bb = with_sink(classifier, field)
    assert attention_sinks(bb, prepared(bb, field)).tokens == (SINK,)
    return bb


@pytest.mark.parametrize("preset", ["paper", "directional"])
@pytest.mark.parametrize("name", ["attention", "heads"])
def test_sinks_left_out_are_not_tested_under_pooled_presets(preset, name, sinky, field):
    result = regularize(field, sinky, map=name, preset=preset, exclude_sinks=True,
                        keep_nulls=True, **FAST)
    assert result.metadata["excluded_tokens"] == [SINK]
    for values in (result.p, result.q, result.lfdr, result.posterior):
        assert np.isnan(values.ravel()[SINK])
        assert np.isfinite(np.delete(values.ravel(), SINK)).all()
    assert np.isfinite(result.z).all()
    for rule in get_procedure(preset).rules:  # no rule keeps a token it did not test
        assert not result.significant(rule, z_th=None).ravel()[SINK]
    maps = regularized_maps(result.attention, result.z, result.p, result.lfdr, result.posterior, result.pi0,
                            q=result.q)
    assert all(m.ravel()[SINK] == 0 and np.isfinite(m).all() for m in maps.values())
    if name == "attention":  # the rest is the procedure on the kept tokens alone
        keep = np.setdiff1d(np.arange(16), [SINK])
        null = result.null_scores.reshape(FAST["n_boot"], -1)
        proc = get_procedure(preset)
        options = {**proc.defaults, "tail": "none"}
        alone = proc.statistics(torch.from_numpy(result.attention.ravel()[keep]),
                                torch.from_numpy(null[:, keep]), options)
        np.testing.assert_allclose(result.p.ravel()[keep], alone.p, rtol=1e-6)
        np.testing.assert_allclose(result.q.ravel()[keep], alone.q, rtol=1e-6)
    else:
        evidence = np.asarray(result.metadata["family_evidence"]).reshape(sinky.num_heads, -1)
        assert np.isnan(evidence[:, SINK]).all()
    kept = regularize(field, sinky, map=name, preset=preset, **FAST)
    assert np.isfinite(kept.p).all() and kept.metadata["sink_tokens"] == [SINK]


def test_tiled_runs_keep_refusing_heads_and_sinks(classifier):
    image = np.random.default_rng(1).random((150, 140)).astype(np.float32)
    for preset in procedure_names():
        with pytest.raises(ValueError, match="tiles are the families"):
            regularize(image, classifier, map="heads", preset=preset, tiled=True, **FAST)
        with pytest.raises(ValueError, match="tiles are the families"):
            regularize(image, classifier, exclude_sinks=True, preset=preset, tiled=True, **FAST)


def test_tiled_pooled_presets_pool_every_tile(classifier):
    # the tiles are families of the step-down only: the paper preset pools the whole image
    image = np.random.default_rng(2).random((150, 140)).astype(np.float32)
    result = regularize(image, classifier, preset="paper", tiled=True, keep_nulls=True, **FAST)
    assert "family_posterior" not in result.null_summary
    assert np.isfinite(result.p).all()


# ------------------------------------------------------------------ front ends
def test_option_metadata_offers_heads_and_sinks_under_every_preset():
    for preset in procedure_names():
        offered = applicable_options({"preset": preset})
        assert {"map", "exclude_sinks"} <= offered
        assert "heads" in OPTIONS["map"].choices
    assert "step-down" not in OPTIONS["exclude_sinks"].help.lower().split(":")[0]


def test_cli_runs_heads_under_the_paper_preset_on_the_demo(tmp_path):
    from napari_attnreg.cli import main
    from napari_attnreg.samples import DATA_DIR, DEMO_IMAGE

    out = tmp_path / "out"
    assert main(["run", str(DATA_DIR / DEMO_IMAGE), "--model", "demo", "--map", "heads",
                 "--preset", "paper", "--n-boot", "4", "--quiet", "--device", "cpu",
                 "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "summary.csv")))
    assert rows[0]["map"] == "heads" and rows[0]["status"] == "done"
    assert rows[0]["preset"] == "paper"


def test_rules_skip_untested_tokens_and_keep_the_rest_as_before():
    from napari_attnreg.core.stats import rules as R

    rng = np.random.default_rng(3)
    a = rng.random(12) + 0.01
    z, p = rng.normal(size=12), rng.random(12) * 0.2
    lfdr = rng.random(12) * 0.2
    p_nan, lfdr_nan, post_nan = p.copy(), lfdr.copy(), 1 - lfdr
    p_nan[4] = lfdr_nan[4] = post_nan[4] = np.nan
    keep = np.arange(12) != 4
    for rule in ("base", "q", "p", "lfdr", "pi0", "soft"):
        mask = R.significance_mask(rule, z, p_nan, lfdr_nan, 0.5, z_th=None, p_th=0.3,
                                   l_th=0.3, q_th=0.5, posterior=post_nan)
        alone = R.significance_mask(rule, z[keep], p[keep], lfdr[keep], 0.5, z_th=None,
                                    p_th=0.3, l_th=0.3, q_th=0.5, posterior=1 - lfdr[keep])
        assert not mask[4] and np.array_equal(mask[keep], alone), rule
    soft = R.regularized_map("soft", a, z, p_nan, lfdr_nan, post_nan, 0.5)
    assert soft[4] == 0 and np.array_equal(soft[keep], a[keep] * (1 - lfdr[keep]))


def test_patch_report_names_the_head_shown_and_the_tokens_left_out(classifier, sinky, field):
    from napari_attnreg.core.results.patch_report import patch_report

    result = regularize(field, classifier, map="heads", preset="paper", **FAST)
    head = int(np.argmax(result.head_attention[:, 1, 2]))
    text = patch_report(result, 16 + 8, 32 + 8).text()
    assert f"Head {head} of {classifier.num_heads} that gives this patch the most" in text
    left_out = regularize(field, sinky, preset="directional", exclude_sinks=True, **FAST)
    assert "Not tested" in patch_report(left_out, 16 + 8, 32 + 8).text()  # token 6 = (1, 2)
