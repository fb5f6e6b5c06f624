"""Maps through the statistics: signed values, zero ties, head families, sinks left out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_attnreg.core.run.maps import (
    families,
    family_evidence,
    floor_zeros,
    mark_untested,
    values_for_procedure,
)
from napari_attnreg.core.stats.stepdown import step_down
from napari_attnreg.core.stats.stepdown_maps import stepdown_statistics


def signed_maps(seed=0, b=60, t=30):
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(t, generator=gen)
    obs[:3] += 4.0  # a few tokens speak strongly for the target
    return obs, torch.randn(b, t, generator=gen)


def test_step_down_tests_the_positive_or_the_negative_part():
    obs, null = signed_maps()
    o_for, n_for = values_for_procedure(obs, null, signed=True, sign="for", shares=True)
    o_against, n_against = values_for_procedure(obs, null, signed=True, sign="against", shares=True)
    positive = obs > 0
    torch.testing.assert_close(o_for[positive], obs[positive])
    torch.testing.assert_close(o_against[~positive], -obs[~positive])
    assert float(o_for[~positive].max()) < 1e-5 * float(obs[positive].mean())
    assert bool((o_for > 0).all() and (n_for > 0).all() and (n_against > 0).all())


def test_zero_tokens_are_one_tie_group_that_never_looks_significant():
    obs, null = signed_maps()
    o, n = values_for_procedure(obs, null, signed=True, sign="for", shares=True)
    fam = step_down(o[None], n)
    order = fam.order[0]
    zero_steps = (obs[order] <= 0).numpy()
    # every null map has at least the zero tokens' uniform share left: p = 1 there
    np.testing.assert_array_equal(fam.step_p[0][zero_steps], 1.0)
    assert fam.adjusted_p[0][zero_steps].min() == 1.0


def test_pooled_procedures_get_the_z_of_the_signed_values():
    obs, null = signed_maps()
    o, n = values_for_procedure(obs, null, signed=True, sign="for", shares=False)
    log_null = n.double().log()
    z_logs = (o.double().log() - log_null.mean()) / log_null.std(unbiased=False)
    z_signed = (obs.double() - null.double().mean()) / null.double().std(unbiased=False)
    torch.testing.assert_close(z_logs, z_signed, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(o).all() and torch.isfinite(n).all()
    # ranks (the empirical p-values) are those of the signed values
    assert torch.equal(torch.argsort(o), torch.argsort(obs))


def test_positive_maps_are_passed_through_unchanged():
    maps = torch.rand(5, 16) + 0.01
    assert floor_zeros(maps) is maps
    with pytest.raises(ValueError, match="sign='sideways'"):
        values_for_procedure(maps[0], maps, signed=True, sign="sideways", shares=True)


def test_all_zero_map_is_flat():
    out = floor_zeros(torch.zeros(2, 4))
    assert torch.equal(out, torch.ones(2, 4))


def test_excluded_tokens_leave_the_family_and_are_not_tested():
    gen = torch.Generator().manual_seed(2)
    obs = torch.rand(20, generator=gen) + 0.05
    obs[7] = 5.0  # a sink
    null = torch.rand(50, 20, generator=gen) + 0.05
    fam = families(obs, null, per_family=False, excluded=(7,))
    stats = stepdown_statistics(fam.observed, fam.null, **fam.keywords)
    stats = mark_untested(stats, fam.excluded)
    keep = np.setdiff1d(np.arange(20), [7])
    alone = stepdown_statistics(obs[keep], null[:, keep])
    assert np.isnan(stats.p[7]) and np.isnan(stats.posterior[7])
    np.testing.assert_allclose(stats.p[keep], alone.p)
    np.testing.assert_allclose(stats.q[keep], alone.q)
    assert stats.null_summary["p_map"] == alone.null_summary["p_map"]


def test_head_families_give_per_head_evidence_and_their_union():
    gen = torch.Generator().manual_seed(3)
    heads, tokens, b = 3, 16, 80
    obs = torch.rand(heads, tokens, generator=gen) + 0.01
    obs[1, 5] = 3.0  # head 1 attends to one token far more than its nulls
    null = torch.rand(b, heads, tokens, generator=gen) + 0.01
    fam = families(obs, null.reshape(b, -1), per_family=True)
    stats = stepdown_statistics(fam.observed, fam.null, **fam.keywords)
    evidence = family_evidence(stats.null_summary, tokens)
    assert evidence.shape == (heads, tokens)
    for h in range(heads):
        alone = step_down(obs[h][None], null[:, h])
        assert stats.null_summary["stepdown_family_p"][h] == alone.family_p[0]
    # the union's evidence is each token's best head evidence
    np.testing.assert_allclose(stats.posterior, evidence.max(axis=0))
    assert evidence[1, 5] == evidence.max()


# ------------------------------------------------------------------ end to end
from napari_attnreg import regularize  # noqa: E402
from napari_attnreg.core.models.scorers import make_scorer, map_names  # noqa: E402
from napari_attnreg.core.run.options import MAPS  # noqa: E402


def tiny_vit(name: str, **kwargs):
    """A random-init timm ViT of 2 blocks unless told (as conftest's, built here so the
    module does not import a conftest by name)."""
    import timm

    from napari_attnreg.core.models.backbones import load_backbone

    torch.manual_seed(0)
    return load_backbone(timm.create_model(name, pretrained=False,
                                           depth=kwargs.pop("depth", 2), **kwargs))


FAST = {"n_boot": 12, "device": "cpu", "chunk_size": 6, "seed": 1}


@pytest.fixture(scope="module")
def classifier():
    """A tiny timm classifier (4 classes) taking 64 px images: a 4 × 4 grid."""
    from attention_reference import peaked

    bb = tiny_vit("vit_tiny_patch16_224", img_size=64, num_classes=4)
    peaked(bb.model)
    bb.input_size = (3, 64, 64)  # the loader reads timm's default config (224 px)
    return bb


@pytest.fixture(scope="module")
def field():
    rng = np.random.default_rng(0)
    image = rng.random((64, 64)).astype(np.float32)
    image[8:24, 40:56] += 2.0
    return image


def prepared(bb, image):
    from napari_attnreg.core.run.images import prepare_image

    return prepare_image(image, patch_size=bb.patch_size, mean=bb.mean, std=bb.std,
                         default_size=bb.input_size[1:]).tensor[None]


def test_option_choices_are_the_registered_maps():
    assert MAPS == map_names()


@pytest.mark.parametrize("name", ["attention", "rollout", "cdam", "gradcam"])
def test_each_map_runs_end_to_end_and_tests_its_own_map(name, classifier, field):
    result = regularize(field, classifier, map=name, **FAST)
    md = result.metadata
    assert md["map"] == name and md["map_label"]
    scorer = make_scorer(name).bind(classifier, prepared(classifier, field))
    with torch.inference_mode():
        expected = scorer.score(classifier, prepared(classifier, field)).reshape(4, 4)
    np.testing.assert_allclose(result.attention, expected.numpy(), rtol=1e-4, atol=1e-7)
    assert np.isfinite(result.posterior).all() and 0 < md["p_map"] <= 1
    assert np.isfinite(md["map_sanity_rho"])
    if scorer.needs.target:
        assert md["target"] == scorer.target.index  # "predicted" fixed on the observed image


def test_signed_map_under_paper_and_directional_uses_z_of_signed_values(classifier, field):
    for preset in ("paper", "directional"):
        result = regularize(field, classifier, map="cdam", target=2, preset=preset,
                            keep_nulls=True, **FAST)
        null = result.null_scores.reshape(FAST["n_boot"], -1).astype(np.float64)
        literal = (result.attention.ravel() - null.mean()) / null.std()
        np.testing.assert_allclose(result.z.ravel(), literal, rtol=1e-4, atol=1e-4)
        assert (result.attention < 0).any()  # the map really is signed


def test_sign_against_tests_the_negative_part(classifier, field):
    r_for = regularize(field, classifier, map="cdam", target=2, **FAST)
    r_against = regularize(field, classifier, map="cdam", target=2, sign="against", **FAST)
    np.testing.assert_array_equal(r_for.attention, r_against.attention)
    assert r_for.attention.min() < 0 < r_for.attention.max()
    # the evidence follows the part tested: the most positive token leads "for", the most
    # negative one "against"; tokens of the other sign are one tie group at the end
    assert r_for.posterior.ravel()[np.argmax(r_for.attention)] == r_for.posterior.max()
    assert r_against.posterior.ravel()[np.argmin(r_against.attention)] == r_against.posterior.max()
    assert r_for.posterior[r_for.attention <= 0].max() == r_for.posterior.min()
    with pytest.raises(ValueError, match="sign='against' applies to signed maps"):
        regularize(field, classifier, map="gradcam", sign="against", **FAST)


def test_heads_map_gives_per_head_evidence_and_their_union(classifier, field):
    result = regularize(field, classifier, map="heads", **FAST)
    evidence = np.asarray(result.metadata["family_evidence"])
    assert evidence.shape == (classifier.num_heads, 4, 4)
    np.testing.assert_allclose(result.posterior, evidence.max(axis=0))
    np.testing.assert_allclose(result.attention, result.head_attention.mean(0), rtol=1e-6)
    # the pooled presets test each head too (tests/test_maps_presets.py): per-head posteriors
    paper = regularize(field, classifier, map="heads", preset="paper", **FAST)
    assert np.asarray(paper.metadata["family_evidence"]).shape == evidence.shape


def test_a_per_head_runs_words_name_heads_not_tiles(classifier, field):
    # an untiled map="heads" run said "is anything here in any of 3 tiles?" and warned about
    # "a lone tile ... over 3 tiles": its step-down families are the heads
    from napari_attnreg.core.results.display import map_level_text
    from napari_attnreg.core.results.patch_report import patch_report

    result = regularize(field, classifier, map="heads", **{**FAST, "n_boot": 4})
    n = classifier.num_heads
    assert f"in any of {n} heads?" in map_level_text(result)
    warning = next(d.message for d in result.diagnostics if d.code == "p_resolution")
    assert f"a lone head needs to be significant over {n} heads" in warning
    assert "tile" not in warning
    report = "\n".join(patch_report(result, 1, 1).null_lines)
    assert "Step " in report and "tile" not in report


def test_excluded_sinks_are_not_tested(classifier, field, monkeypatch):
    from napari_attnreg.core.run import maps as maps_mod
    from napari_attnreg.core.stats.map_checks import SinkReport

    def one_sink(norms, share):  # the sink detection itself is tested in test_scorers
        return SinkReport((5,), (4, 4), np.full(16, 1.0), np.full(16, 1 / 16))

    monkeypatch.setattr(maps_mod, "sinks_from_tensors", one_sink)
    result = regularize(field, classifier, exclude_sinks=True, **FAST)
    assert np.isnan(result.posterior.ravel()[5]) and result.metadata["excluded_tokens"] == [5]
    assert not result.significant().ravel()[5]
    # the soft rule and map skip the untested token instead of refusing its NaN
    assert not result.significant("soft").ravel()[5]
    assert result.regularized("soft").ravel()[5] == 0
    kept = regularize(field, classifier, **FAST)
    assert np.isfinite(kept.posterior).all() and kept.metadata["sink_tokens"] == [5]


def test_class_map_on_a_model_without_head_says_what_to_do(field):
    transformers = pytest.importorskip("transformers")
    from napari_attnreg.core.models.backbones import load_backbone

    config = transformers.AutoConfig.for_model(
        "dinov2", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, patch_size=14, image_size=56)
    bb = load_backbone(transformers.AutoModel.from_config(config))
    with pytest.raises(ValueError, match=r'--concept FILE.*Concept from ROI.*target=<concept>.*map="attention"'):
        regularize(field, bb, map="cdam", **FAST)
    concept = np.random.default_rng(0).standard_normal(32)
    result = regularize(field, bb, map="gradcam", target=concept, **FAST)
    assert result.metadata["target"] == "concept" and len(result.metadata["concept"]) == 32


def test_tiled_class_map_needs_a_stated_target(classifier):
    image = np.random.default_rng(1).random((150, 140)).astype(np.float32)
    with pytest.raises(ValueError, match="needs its target stated"):
        regularize(image, classifier, map="cdam", tiled=True, **FAST)
    result = regularize(image, classifier, map="cdam", target=1, tiled=True, **FAST)
    assert result.metadata["map"] == "cdam" and result.attention.shape == result.grid_shape


@pytest.mark.parametrize("name", ["cdam", "rollout"])
def test_cli_map_and_concept(name, tmp_path, capsys):
    import csv

    from napari_attnreg.cli import main

    concept = tmp_path / "concept.npy"
    np.save(concept, np.random.default_rng(0).standard_normal(128).astype(np.float32))
    extra = ["--concept", str(concept)] if name == "cdam" else []
    out = tmp_path / "out"
    assert main(["demo", "--out", str(out), "--n-boot", "4", "--quiet", "--device", "cpu",
                 "--map", name, *extra]) == 0
    rows = list(csv.DictReader(open(out / "summary.csv")))
    assert rows[0]["map"] == name and rows[0]["status"] == "done"
    # the saved result opens in napari with layers named after its map
    from napari_attnreg._napari.io import read_result_layers

    saved = next(out.rglob("*.attnreg.npz"))
    label = {"cdam": "CDAM", "rollout": "attention rollout"}[name]
    names = [attrs["name"] for _, attrs, _ in read_result_layers(str(saved))]
    assert names and all(f" · {label} " in n for n in names), names


def test_resume_records_tell_concepts_apart_number_by_number():
    from napari_attnreg.batch.resume import run_signature
    from napari_attnreg.core.run.service import ModelSpec

    concept = np.ones(4000, dtype=np.float32)  # numpy's printout would elide the middle
    other = concept.copy()
    other[2000] = 2.0
    spec = ModelSpec()
    first = run_signature(spec, {"map": "cdam", "target": concept, "device": "cpu"})
    assert first["map"] == "cdam" and first["target"] == concept.tolist()
    assert first != run_signature(spec, {"map": "cdam", "target": other, "device": "cpu"})
    assert first == run_signature(spec, {"map": "cdam", "target": concept.copy(),
                                         "device": "cpu"})


@pytest.mark.parametrize(("name", "layer"), [("attention", -1), ("attention", 0),
                                             ("heads", -1), ("rollout", -1), ("cdam", -1)])
def test_the_map_checks_of_a_run_are_the_checks_computed_alone(name, layer, classifier, field,
                                                               monkeypatch):
    # in float32 a run hands the checks its observed map, last-block CLS row and what entered
    # the block instead of computing them again: the numbers must be exactly those of the
    # checks made alone
    from napari_attnreg.core.run import engine
    from napari_attnreg.core.run import maps as maps_mod
    from napari_attnreg.core.run.config import scorer_of
    from napari_attnreg.core.run.engine import RunConfig
    from napari_attnreg.core.stats.map_checks import attention_sinks, sanity_check

    calls = []
    real = maps_mod.map_checks

    def spy(scorer, backbone, image, **kwargs):
        calls.append({k: v is not None for k, v in kwargs.items() if k != "seed"})
        return real(scorer, backbone, image, **kwargs)

    monkeypatch.setattr(engine, "map_checks", spy)
    result = regularize(field, classifier, map=name, layer=layer, **FAST)
    assert calls == [{"original": True, "share": layer == -1, "amp": True, "entering": True}]
    x = prepared(classifier, field)
    scorer = scorer_of(RunConfig(map=name, layer=layer)).bind(classifier, x)
    alone = sanity_check(scorer, classifier, x[0], seed=FAST["seed"])
    sinks = attention_sinks(classifier, x[0])
    assert result.metadata["map_sanity_rho"] == alone.rho
    assert result.metadata["sink_tokens"] == list(sinks.tokens)


def test_the_map_checks_wait_until_the_null_chunks_are_queued(classifier, field, monkeypatch):
    # on a GPU the checks' host work overlaps the queued null chunks only if they come after
    from napari_attnreg.core.run import engine

    order = []
    real_call, real_check = engine._NullChunks.__call__, engine._check_map
    monkeypatch.setattr(engine._NullChunks, "__call__",
                        lambda self, start, size: (order.append("chunk"),
                                                   real_call(self, start, size))[1])
    monkeypatch.setattr(engine, "_check_map",
                        lambda *a: (order.append("checks"), real_check(*a))[1])
    regularize(field, classifier, **FAST)
    assert order == ["chunk", "chunk", "checks"]


@pytest.mark.parametrize("name", ["attention", "heads", "cdam"])
def test_a_first_chunk_queued_before_the_observed_pass_changes_nothing(name, classifier, field,
                                                                       monkeypatch):
    # on a GPU the first null chunk is queued before the observed pass (its launching then
    # overlaps the chunk); here the CPU is made to take that path: same result, same progress,
    # and a map with a target never takes it (its nulls are scored for the observed target)
    from napari_attnreg.core.run import engine

    def run():
        events = []
        result = regularize(field, classifier, map=name, progress=events.append, **FAST)
        return result, [(e.stage, e.done) for e in events]

    plain, plain_events = run()
    queued = []
    real = engine._NullChunks.__call__
    monkeypatch.setattr(engine, "_queues_ahead", lambda run: True)
    monkeypatch.setattr(engine, "_observed", lambda *a, real_obs=engine._observed: (
        queued.append("observed"), real_obs(*a))[1])
    monkeypatch.setattr(engine._NullChunks, "__call__", lambda self, start, size: (
        queued.append(start), real(self, start, size))[1])
    early, early_events = run()
    assert early_events == plain_events
    for key, values in plain.maps.items():
        np.testing.assert_array_equal(early.maps[key], values, err_msg=key)
    assert early.metadata["map_sanity_rho"] == plain.metadata["map_sanity_rho"]
    targeted = name == "cdam"
    assert queued[:2] == (["observed", 0] if targeted else [0, "observed"])
