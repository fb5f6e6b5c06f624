"""The batched generalized Pareto tail (core/stats/tail.py): estimator, goodness of fit, reuse."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import napari_attnreg.core.stats.stepdown as sd
from napari_attnreg.core.stats import tail


def _gpd(shape: float, size, seed: int, scale: float = 1.0) -> np.ndarray:
    return stats.genpareto.rvs(shape, scale=scale, size=size, random_state=np.random.default_rng(seed))


@pytest.mark.parametrize("shape", [-0.3, 0.0, 0.2, 0.4])
def test_pwm_recovers_known_parameters_on_large_samples(shape):
    sample = torch.from_numpy(np.sort(_gpd(shape, 400_000, seed=1, scale=2.0)))[None]
    est_shape, est_scale = tail.pwm_fit(sample)
    assert float(est_shape[0]) == pytest.approx(shape, abs=0.02)
    assert float(est_scale[0]) == pytest.approx(2.0, rel=0.02)


def test_batched_fit_equals_the_per_row_loop():
    rng = np.random.default_rng(3)
    rows = np.stack([np.sort(rng.gamma(2.0, 1.0, 201))[::-1][:21] for _ in range(40)])
    tops = torch.from_numpy(rows.copy())
    batched = tail.fit_tails(tops)
    for i in range(len(rows)):
        one = tail.fit_tails(tops[i:i + 1])
        for name in ("threshold", "estimated_shape", "shape", "scale", "accepted"):
            assert torch.equal(getattr(one, name)[0], getattr(batched, name)[i]), name


def test_a_negative_shape_is_replaced_by_the_exponential_of_the_same_rows():
    excess = torch.from_numpy(np.sort(_gpd(-0.4, (1, 500), seed=4), axis=1))
    shape, scale = tail.pwm_fit(excess)
    assert float(shape[0]) < 0
    used_shape, used_scale = tail.used_tail(excess, shape, scale)
    assert float(used_shape[0]) == 0.0
    assert float(used_scale[0]) == pytest.approx(float(excess.mean()))


def test_the_goodness_of_fit_test_is_calibrated_for_the_tail_used():
    # bounded tails, where the exponential is what is tested: critical values simulated for
    # the raw fit reject it far more often than 5 % (every step-1 fit of a phantom mosaic)
    rng = np.random.default_rng(5)
    for shape in (-0.3, -0.1, 0.0, 0.3):
        tops = torch.from_numpy(np.sort(_gpd(shape, (2000, 101), seed=int(rng.integers(1e6))),
                                        axis=1)[:, ::-1].copy())
        rejected = 1.0 - float(tail.fit_tails(tops).accepted.double().mean())
        assert rejected < 0.08, (shape, rejected)


def _families(n_fam: int, n_boot: int, n_tok: int, seed: int, planted: float = 0.0):
    rng = np.random.default_rng(seed)
    null = np.exp(rng.normal(0, 0.5, (n_boot, n_tok)))
    obs = np.exp(rng.normal(0, 0.5, (n_fam, n_tok)))
    obs[:, 0] *= planted or 1.0
    return torch.from_numpy(obs), torch.from_numpy(null)


def test_the_shared_first_step_is_fitted_once(monkeypatch):
    obs, null = _families(30, 200, 36, seed=6, planted=8.0)
    counts = sd.step_down(obs, null).step_p * 201 - 1  # exceeding null maps, per step
    needed = np.logical_and.accumulate(counts < tail.MIN_EXCEEDING, axis=1)
    needed[:, tail.MAX_TAIL_STEPS:] = False
    assert needed[:, 0].sum() > 20  # most families need their first step approximated
    rows = []
    real = tail.fit_tails
    monkeypatch.setattr(tail, "fit_tails", lambda tops: rows.append(len(tops)) or real(tops))
    shared = sd.step_down(obs, null, tail="gpd")
    assert rows == [1 + needed[:, 1:].sum()] and shared.tail.fits == rows[0]
    # the same null given to each family separately: the same p-values, a fit per family
    rows.clear()
    separate = sd.step_down(obs, null.expand(30, -1, -1), tail="gpd")
    assert rows == [needed.sum()]
    np.testing.assert_allclose(separate.step_p, shared.step_p, rtol=1e-12)
    np.testing.assert_array_equal(separate.tail_used, shared.tail_used)


def test_pure_noise_family_p_values_stay_uniform():
    # every family's observed map is one more draw from its own null: p_map must be uniform
    rng = np.random.default_rng(7)
    n_fam, n_boot, n_tok = 400, 200, 25
    maps = np.exp(rng.standard_t(4, (n_fam, n_boot + 1, n_tok)) * 0.6)
    fam = sd.step_down(torch.from_numpy(maps[:, 0]), torch.from_numpy(maps[:, 1:]), tail="gpd")
    assert fam.tail.steps > 0  # the tail was used on some families
    p = fam.family_p
    assert stats.kstest(p, "uniform").pvalue > 0.01
    assert np.mean(p <= 0.01) < 0.03


@pytest.mark.parametrize("n_tok", [9, 36])
def test_tails_kept_in_the_counting_pass_equal_a_second_pass(monkeypatch, n_tok):
    obs, null = _families(12, 150, n_tok, seed=8, planted=6.0)
    one_pass = sd.step_down(obs, null, tail="gpd")
    monkeypatch.setattr(sd, "_running_top", lambda *args: None)
    two_pass = sd.step_down(obs, null, tail="gpd")
    assert one_pass.tail.steps > 0
    np.testing.assert_array_equal(one_pass.step_p, two_pass.step_p)
    np.testing.assert_array_equal(one_pass.tail_used, two_pass.tail_used)


@pytest.mark.parametrize("shared", [True, False])
def test_the_second_pass_covers_only_the_families_it_needs(monkeypatch, shared):
    # a few planted families out of many: the tails of the others are never wanted
    obs, null = _families(40, 150, 16, seed=9)
    obs[:5, 0] *= 8.0
    if not shared:  # one null per family
        null = null[None].repeat(40, 1, 1) * torch.linspace(0.9, 1.1, 40)[:, None, None]
    one_pass = sd.step_down(obs, null, tail="gpd")
    monkeypatch.setattr(sd, "_running_top", lambda *args: None)
    passed = []
    real = sd._null_step_blocks
    monkeypatch.setattr(sd, "_null_step_blocks", lambda null, order, *a, **k: passed.append(
        order.shape[0]) or real(null, order, *a, **k))
    two_pass = sd.step_down(obs, null, tail="gpd")
    assert one_pass.tail.steps > 0
    assert passed[0] == 40 and 0 < passed[1] < 40  # the counting pass, then the tails' pass
    np.testing.assert_array_equal(one_pass.step_p, two_pass.step_p)
    np.testing.assert_array_equal(one_pass.tail_used, two_pass.tail_used)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_tiled_run_fits_the_shared_first_step_once(monkeypatch):
    from napari_attnreg import regularize
    from napari_attnreg.core.models.backbones import load_backbone
    from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image

    calls = []
    real = sd.tail_pvalues

    def spy(step_p, counts, statistic, n_boot, null_tops, *, shared_first=False):
        def tops(wanted, k):
            calls.append((counts.copy(), wanted))
            return null_tops(wanted, k)
        return real(step_p, counts, statistic, n_boot, tops, shared_first=shared_first)

    monkeypatch.setattr(sd, "tail_pvalues", spy)
    image = make_cell_image(2, size=(384, 384), scale=TRAINING_SCALE, abnormal=True).image
    result = regularize(image, load_backbone("demo"), n_boot=100, device="cpu", tiled=True)
    assert result.metadata["tail"] == "gpd" and len(calls) == 1
    counts, (families, steps) = calls[0]
    assert (counts[:, 0] < tail.MIN_EXCEEDING).sum() > 1  # several tiles needed step 1 ...
    assert (steps == 0).sum() == 1  # ... and its null sample was fitted once
    assert result.metadata["tail_fit"]["fits"] == len(steps)


def test_the_record_says_when_the_first_step_kept_its_count():
    rng = np.random.default_rng(8)
    null = rng.gamma(2.0, 1.0, (200, 1))
    step_p = np.full((3, 1), 1 / 201)
    counts = np.zeros((3, 1), dtype=np.int64)
    observed = np.full((3, 1), null.max() * 1.2)

    def tops(wanted, k):
        return torch.from_numpy(np.sort(null[:, 0])[::-1][:k].copy())[None].repeat(
            len(wanted[0]), 1)

    _p, used, fit = tail.tail_pvalues(step_p, counts, observed, 200, tops, shared_first=True)
    assert (fit.first_wanted, fit.first_rejected, fit.null_maps) == (3, 0, 200) and used.all()
    with pytest.MonkeyPatch.context() as mp:  # a test that refuses every fit
        mp.setattr(tail, "ad_critical_values", lambda shape, n: np.full(np.shape(shape), -1.0))
        p, used, fit = tail.tail_pvalues(step_p, counts, observed, 200, tops, shared_first=True)
    assert (fit.first_wanted, fit.first_rejected, fit.fits) == (3, 3, 1) and not used.any()
    np.testing.assert_array_equal(p, step_p)  # the counts stay


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_tiled_run_whose_shared_fit_is_refused_says_so(monkeypatch):
    from napari_attnreg import regularize
    from napari_attnreg.core.models.backbones import load_backbone
    from napari_attnreg.core.run import passes
    from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image

    image = make_cell_image(2, size=(384, 384), scale=TRAINING_SCALE, abnormal=True).image
    opts = {"n_boot": 100, "device": "cpu", "tiled": True}
    bb = load_backbone("demo")
    kept = regularize(image, bb, **opts)
    assert kept.metadata["tail_fit"]["first_rejected"] == 0
    assert "tail_rejected" not in {d["code"] for d in kept.metadata["diagnostics"]}
    monkeypatch.setattr(tail, "ad_critical_values",
                        lambda shape, n: np.full(np.shape(shape), -1.0))
    levels = []
    real = passes._step_level
    monkeypatch.setattr(passes, "_step_level", lambda *a: levels.append(real(*a)) or levels[-1])
    refused = regularize(image, bb, **opts)
    fit = refused.metadata["tail_fit"]
    assert fit["first_wanted"] > 1 and fit["first_rejected"] == fit["first_wanted"]
    found = {d["code"]: d for d in refused.metadata["diagnostics"]}
    assert found["tail_rejected"]["severity"] == "info"
    assert f"{fit['first_wanted']} of the {fit['first_wanted']} tiles" in found[
        "tail_rejected"]["message"]
    assert "1/(B + 1) = 0.0099" in found["tail_rejected"]["message"]
    # what the run can reach is the count's 1/(B + 1), not the tail's floor
    assert levels[-1][0] == pytest.approx(1 / 101) and levels[-1][3:] == (True, True)
    assert refused.p_map >= kept.p_map
