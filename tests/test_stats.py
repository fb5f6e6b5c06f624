"""Token-level statistics against the slow pixel-level reference (docs/method.md)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import reference_impl as ref
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.interpolate import make_smoothing_spline
from statsmodels.stats.multitest import multipletests

from napari_attnreg.core.stats import paper as S

GH, GW, B = 6, 5, 40


def softmax_maps(rng: np.random.Generator, shape: tuple[int, ...], spread: float) -> np.ndarray:
    logits = rng.normal(size=shape) * spread
    e = np.exp(logits - logits.max(axis=(-2, -1), keepdims=True))
    return (e / e.sum(axis=(-2, -1), keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def maps() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    null = softmax_maps(rng, (B, GH, GW), 1.0)
    obs = softmax_maps(rng, (GH, GW), 1.8)
    return obs, null


def token_stats(obs: np.ndarray, null_maps: np.ndarray, **kw) -> S.TokenStatistics:
    return S.compute_statistics(
        torch.from_numpy(obs).reshape(-1),
        torch.from_numpy(null_maps).reshape(null_maps.shape[0], -1),
        **kw,
    )


def to_pixels(token_values: np.ndarray, shape: tuple[int, int], s: int) -> np.ndarray:
    return ref.upsample(np.asarray(token_values).reshape(shape), s).ravel()


# ------------------------------------------------------------ token level = pixel level


@pytest.mark.parametrize("null", S.NULL_MODELS)
@pytest.mark.parametrize("pi0_method", ["reference", "smoother", 0.7])
@pytest.mark.parametrize("alternative", S.ALTERNATIVES)
def test_pooled_token_level_equals_pixel_level(maps, alternative, pi0_method, null):
    obs, nul = maps
    s = 4
    r = ref.reference_statistics(obs, nul, s, p_method="pooled", alternative=alternative,
                                 pi0_method=pi0_method, null=null)
    t = token_stats(obs, nul, p_method="pooled", alternative=alternative,
                    pi0_method=pi0_method, null=null)
    def px(a):
        return to_pixels(a, (GH, GW), s)

    np.testing.assert_allclose(px(t.p), r["p"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(px(t.z), r["z"], rtol=0, atol=1e-6)
    assert t.pi0 == pytest.approx(r["pi0"], abs=1e-10)
    np.testing.assert_allclose(px(t.lfdr), r["lfdr"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(px(t.posterior), r["posterior"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(px(t.q), r["q"], rtol=0, atol=1e-12)
    assert t.mu0 == pytest.approx(r["mu0"], rel=1e-12)
    assert t.sigma0 == pytest.approx(r["sigma0"], rel=1e-12)


def test_token_level_equals_pixel_level_at_patch_8(maps):
    obs, nul = maps
    nul = nul[:8]  # 8 x 1920 null pixels keeps the literal loops quick
    r = ref.reference_statistics(obs, nul, 8)
    t = token_stats(obs, nul)
    np.testing.assert_allclose(to_pixels(t.p, (GH, GW), 8), r["p"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(to_pixels(t.lfdr, (GH, GW), 8), r["lfdr"], rtol=0, atol=1e-6)
    assert t.pi0 == r["pi0"]


def test_pi0_varies_in_the_equality_fixture(maps):
    # Guard against a vacuous equality test: the fixture must give 0 < π0 < 1
    # and some lfdr below 1, else a constant would pass the comparisons.
    obs, nul = maps
    t = token_stats(obs, nul)
    assert 0.2 < t.pi0 < 1.0
    assert t.lfdr.min() < 0.5 < t.lfdr.max()
    assert t.p.min() == 0.0  # the largest observed token, as the method notes


@pytest.mark.parametrize("alternative", S.ALTERNATIVES)
def test_null_pvalues_match_literal_formula(maps, alternative):
    obs, nul = maps
    t = token_stats(obs, nul, p_method="null", alternative=alternative)
    r1 = ref.reference_statistics(obs, nul, 1, p_method="null", alternative=alternative)
    np.testing.assert_allclose(t.p, r1["p"], rtol=0, atol=1e-12)
    assert np.all(t.p > 0)
    # The +1 is per token (the unit of inference), so the pixel version differs by
    # exactly the s² replication of the counts: p_px = (1 + s² c) / (1 + s² B T).
    s, n = 4, nul.size
    counts = np.rint(t.p * (1 + n) - 1)
    r4 = ref.reference_statistics(obs, nul, s, p_method="null", alternative=alternative)
    expected_px = (1 + s * s * counts) / (1 + s * s * n)
    np.testing.assert_allclose(r4["p"], to_pixels(expected_px, (GH, GW), s), rtol=0, atol=1e-12)
    assert np.max(np.abs(to_pixels(t.p, (GH, GW), s) - r4["p"])) < 1 / (1 + n)


@pytest.mark.parametrize("p_method", S.P_METHODS)
def test_bootstrap_pi0_matches_r_closed_form_with_tokens_as_units(maps, p_method):
    obs, nul = maps
    t = token_stats(obs, nul, p_method=p_method, pi0_method="bootstrap")
    r1 = ref.reference_statistics(obs, nul, 1, p_method=p_method, pi0_method="bootstrap")
    assert t.pi0 == r1["pi0"]
    np.testing.assert_allclose(t.lfdr, r1["lfdr"], rtol=0, atol=1e-6)
    if p_method == "pooled":
        # Its variance term counts tests; at pixel level that must be one per token.
        s = 4
        r4 = ref.reference_statistics(obs, nul, s, p_method=p_method)
        one_pixel_per_token = r4["p"].reshape(GH * s, GW * s)[::s, ::s].ravel()
        assert t.pi0 == ref.pi0_bootstrap(one_pixel_per_token)


# ------------------------------------------------------------ pieces


def test_pvalues_by_hand():
    z_obs = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64)
    z_null = torch.tensor([[-1.0, 0.5], [1.0, 3.0]], dtype=torch.float64)
    # pooled two-sided pool |.|: {0, 1, 2, 1, 0.5, 1, 3}, m0 = 7
    p = S.empirical_pvalues(z_obs, z_null)
    np.testing.assert_array_equal(p, [6 / 7, 2 / 7, 1 / 7])  # 1 - #{<=}/m0
    # pooled greater pool: {0, 1, -2, -1, 0.5, 1, 3}
    p = S.empirical_pvalues(z_obs, z_null, alternative="greater")
    np.testing.assert_array_equal(p, [4 / 7, 1 / 7, 6 / 7])
    # null two-sided: #{|z_null| >= a} for a = 0, 1, 2 -> 4, 3, 1
    p = S.empirical_pvalues(z_obs, z_null, p_method="null")
    np.testing.assert_array_equal(p, [5 / 5, 4 / 5, 2 / 5])
    # null greater: #{z_null >= z} for z = 0, 1, -2 -> 3, 2, 4
    p = S.empirical_pvalues(z_obs, z_null, p_method="null", alternative="greater")
    np.testing.assert_array_equal(p, [4 / 5, 3 / 5, 5 / 5])


def test_z_scores_use_population_std_of_pooled_log_null():
    null = torch.tensor([[1.0, 2.0], [4.0, 8.0]])
    obs = torch.tensor([2.0, 16.0])
    z_obs, z_null, mu0, sigma0 = S.z_scores(obs, null)
    logs = np.log([1.0, 2.0, 4.0, 8.0])
    assert mu0 == pytest.approx(logs.mean())
    assert sigma0 == pytest.approx(logs.std(ddof=0))
    np.testing.assert_allclose(z_obs.numpy(), (np.log([2.0, 16.0]) - mu0) / sigma0)
    assert z_obs.dtype == torch.float64 and z_null.shape == (2, 2)


def test_pi0_reference_formula():
    p = np.concatenate([[0.95, 0.9, 0.99, 0.89], np.linspace(0, 0.88, 96)])  # 3 above 0.89
    assert S.estimate_pi0(p, "reference") == pytest.approx(3 / (0.11 * 100))
    assert S.estimate_pi0(np.full(10, 0.95), "reference") == 1.0


def test_smoother_has_three_degrees_of_freedom_and_matches_reinsch():
    lam = S._smoother_lam(tuple(S.PI0_LAMBDAS), 3.0)
    smoother = make_smoothing_spline(S.PI0_LAMBDAS, np.eye(19), lam=lam)(S.PI0_LAMBDAS)
    assert np.trace(smoother) == pytest.approx(3.0, abs=1e-9)
    rng = np.random.default_rng(3)
    for _ in range(5):
        p = np.concatenate([rng.uniform(size=300), rng.beta(0.3, 4, size=200)])
        assert S.estimate_pi0(p, "smoother") == pytest.approx(ref.pi0_smoother(p), abs=1e-9)
    # Uniform p-values: every π0(λ) ≈ 1, so the estimate is ≈ 1.
    assert S.estimate_pi0(rng.uniform(size=5000), "smoother") == pytest.approx(1.0, abs=0.1)


def test_bootstrap_pi0_matches_r_transcription():
    rng = np.random.default_rng(4)
    for n_alt in (0, 50, 300):
        p = np.concatenate([rng.uniform(size=400), rng.beta(0.2, 5, size=n_alt)])
        assert S.estimate_pi0(p, "bootstrap") == ref.pi0_bootstrap(p)


def test_fixed_pi0_and_bad_pi0():
    assert S.estimate_pi0(np.array([0.1, 0.5]), 0.25) == 0.25
    for bad in (-0.1, 1.5, "storey-smoother", True):
        with pytest.raises(ValueError):
            S.estimate_pi0(np.array([0.1, 0.5]), bad)


def test_storey_lambda_half_by_hand():
    p = np.array([0.01, 0.2, 0.5, 0.51, 0.7, 0.9, 0.95, 1.0])
    assert S.estimate_pi0(p, "storey") == 1.0  # 5 / (0.5 * 8) = 1.25, capped
    assert S.estimate_pi0(p[:6], "storey") == pytest.approx(min(1.0, 3 / 3.0))
    assert S.estimate_pi0(np.array([0.1, 0.2, 0.6, 0.9]), "storey") == pytest.approx(1.0)
    assert S.estimate_pi0(np.array([0.1, 0.2, 0.3, 0.9]), "storey") == pytest.approx(0.5)


def test_pi0_zero_warns_and_gives_lfdr_zero():
    with pytest.warns(S.StatisticsWarning, match="pi0"):
        assert S.estimate_pi0(np.full(20, 0.5), "reference") == 0.0
    z = np.linspace(-2, 3, 40)
    np.testing.assert_array_equal(S.local_fdr(z, 0.0), 0.0)


def test_qvalues_match_reference_and_bh():
    rng = np.random.default_rng(5)
    p = np.round(rng.uniform(size=200) ** 2, 2)  # rounding makes many ties
    np.testing.assert_allclose(S.qvalues(p, 0.6), ref.qvalues(p, 0.6), rtol=0, atol=1e-15)
    # With π0 = 1 Storey's q-value is the Benjamini–Hochberg adjusted p-value.
    bh = multipletests(p, method="fdr_bh")[1]
    np.testing.assert_allclose(S.qvalues(p, 1.0), bh, rtol=0, atol=1e-15)


def test_local_fdr_is_statsmodels_lindsey():
    from statsmodels.stats.multitest import local_fdr

    rng = np.random.default_rng(6)
    z = np.concatenate([rng.normal(size=300), rng.normal(3, 1, size=60)])
    np.testing.assert_array_equal(S.local_fdr(z, 0.8), local_fdr(z, null_proportion=0.8))


# ------------------------------------------------------------ degenerate input


def test_constant_null_is_a_clear_error():
    with pytest.raises(ValueError, match="sigma0 == 0"):
        S.compute_statistics(torch.rand(16) + 0.1, torch.full((5, 16), 1 / 16))


@pytest.mark.parametrize(
    "obs, null, match",
    [
        (torch.rand(4), torch.rand(3, 5), "same tokens"),
        (torch.rand(4), torch.rand(4), r"\(B, T\)"),
        (torch.tensor([0.1, float("nan")]), torch.rand(3, 2), "NaN"),
        (torch.tensor([0.1, -0.2]), torch.rand(3, 2), "negative"),
        (torch.rand(0), torch.rand(3, 0), "empty"),
    ],
)
def test_bad_input_raises(obs, null, match):
    with pytest.raises(ValueError, match=match):
        S.compute_statistics(obs, null)


@pytest.mark.parametrize("kw", [{"p_method": "x"}, {"alternative": "less"}, {"null": "x"},
                                {"pi0_method": "x"}])
def test_bad_options_raise(kw):
    with pytest.raises(ValueError, match="use one of"):
        S.compute_statistics(torch.rand(8) + 0.1, torch.rand(3, 8) + 0.1, **kw)


def test_underflowed_zeros_are_clamped_with_warning():
    g = torch.Generator().manual_seed(0)
    obs = torch.softmax(2 * torch.randn(64, generator=g), 0)
    obs[[0, 3]] = 0.0
    null = torch.softmax(torch.randn(10, 64, generator=g), 1)
    with pytest.warns(S.StatisticsWarning, match="zeros"):
        st_ = S.compute_statistics(obs, null)
    assert np.all(np.isfinite(st_.z)) and st_.p[0] == st_.p[3]


def test_constant_observed_z_gives_lfdr_pi0_with_warning():
    with pytest.warns(S.StatisticsWarning, match="equal"):
        lfdr = S.local_fdr(np.full(12, 0.7), 0.4)
    np.testing.assert_array_equal(lfdr, 0.4)


def test_lindsey_failure_falls_back_with_warning(monkeypatch):
    calls = []

    def broken(z, null_proportion, null_pdf, deg):
        calls.append(deg)
        if deg == 7:
            return np.full(z.shape, np.nan)
        raise np.linalg.LinAlgError("singular")

    monkeypatch.setattr(S._smt, "local_fdr", broken)
    z = np.linspace(-3, 3, 50)
    with pytest.warns(S.StatisticsWarning, match="gaussian fallback"):
        lfdr = S.local_fdr(z, 0.9)
    assert calls == [7, 2]
    assert np.all((lfdr >= 0) & (lfdr <= 1)) and lfdr.min() < lfdr.max()


def test_empirical_null_falls_back_when_no_central_z():
    z = np.concatenate([np.linspace(2, 5, 30), np.linspace(-5, -2, 30)])
    with pytest.warns(S.StatisticsWarning, match="theoretical"):
        lfdr = S.local_fdr(z, 1.0, null="empirical")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_allclose(lfdr, S.local_fdr(z, 1.0))


def test_empirical_null_recentres_a_shifted_null():
    rng = np.random.default_rng(7)
    z = rng.normal(0.8, 1.4, size=2000)  # all null, but not N(0, 1)
    theo = S.local_fdr(z, 1.0)
    emp = S.local_fdr(z, 1.0, null="empirical")
    # The theoretical null calls the shifted/wide tail "non-null"; the empirical one does not.
    assert np.mean(theo < 0.2) > 0.05
    assert np.mean(emp < 0.2) < 0.01


# ------------------------------------------------------------ summary, devices, dtypes


def test_null_summary(maps):
    obs, nul = maps
    t = token_stats(obs, nul)
    z_null = (np.log(nul.reshape(B, -1).astype(np.float64)) - t.mu0) / t.sigma0
    summ = t.null_summary
    np.testing.assert_allclose(summ["z_null_mean"], z_null.mean(0), atol=1e-12)
    np.testing.assert_allclose(summ["z_null_std"], z_null.std(0), atol=1e-12)
    np.testing.assert_allclose(summ["z_null_quantiles"],
                               np.quantile(z_null, summ["quantile_levels"]), atol=1e-12)
    counts, _ = np.histogram(z_null, bins=summ["hist_edges"])
    np.testing.assert_array_equal(summ["hist_counts"], counts)
    assert summ["hist_counts"].sum() == z_null.size and (summ["B"], summ["T"]) == (B, GH * GW)
    assert summ["lfdr_fit"] == "lindsey-deg7" and summ["empirical_null"] is None


def test_accepts_numpy_maps_low_precision_and_grid_shapes(maps):
    obs, nul = maps
    flat = token_stats(obs, nul)
    grid = S.compute_statistics(obs, nul)  # numpy, (gh, gw) and (B, gh, gw)
    np.testing.assert_array_equal(flat.p, grid.p)
    half = S.compute_statistics(torch.from_numpy(obs).half(), torch.from_numpy(nul).half())
    assert half.p.dtype == np.float64 and np.all(np.isfinite(half.lfdr))


def test_compute_dtype():
    assert S.compute_dtype("cpu") == torch.float64
    assert S.compute_dtype("mps") == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(maps):
    obs, nul = maps
    cpu = token_stats(obs, nul)
    gpu = S.compute_statistics(torch.from_numpy(obs).cuda(), torch.from_numpy(nul).cuda())
    np.testing.assert_allclose(gpu.p, cpu.p, atol=1e-12)
    np.testing.assert_allclose(gpu.lfdr, cpu.lfdr, atol=1e-6)


# ------------------------------------------------------------ properties


@st.composite
def attention_inputs(draw):
    t = draw(st.integers(1, 30))
    b = draw(st.integers(1, 6))
    # A few distinct levels make ties likely; exact zeros are excluded (clamped elsewhere).
    levels = draw(st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=6))
    idx = st.integers(0, len(levels) - 1)
    obs = [levels[i] for i in draw(st.lists(idx, min_size=t, max_size=t))]
    null = [levels[i] for i in draw(st.lists(idx, min_size=b * t, max_size=b * t))]
    null_arr = np.array(null, dtype=np.float32).reshape(b, t)
    # σ0 > 0 needs two distinct null values; force them rather than filtering.
    if np.unique(null_arr).size < 2 and null_arr.size > 1:
        null_arr.flat[0] = null_arr.flat[0] * 0.5
    return np.array(obs, dtype=np.float32), null_arr


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    attention_inputs(),
    st.sampled_from(S.P_METHODS),
    st.sampled_from(S.ALTERNATIVES),
    st.sampled_from(["reference", "smoother", "bootstrap", 0.5]),
    st.sampled_from(S.NULL_MODELS),
)
def test_properties(inputs, p_method, alternative, pi0_method, null):
    obs, nul = inputs
    if nul.size == 1:  # one null value: σ0 = 0 by construction
        with pytest.raises(ValueError, match="sigma0"):
            S.compute_statistics(torch.from_numpy(obs), torch.from_numpy(nul))
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", S.StatisticsWarning)
        t = S.compute_statistics(torch.from_numpy(obs), torch.from_numpy(nul), p_method=p_method,
                                 alternative=alternative, pi0_method=pi0_method, null=null)
    for name in ("z", "p", "lfdr", "posterior", "q"):
        arr = getattr(t, name)
        assert arr.shape == (obs.size,) and np.all(np.isfinite(arr)), name
    for arr in (t.p, t.lfdr, t.posterior, t.q):
        assert np.all((arr >= 0) & (arr <= 1))
    assert 0 <= t.pi0 <= 1
    np.testing.assert_allclose(t.posterior, 1 - t.lfdr)
    order = np.argsort(t.p, kind="stable")
    assert np.all(np.diff(t.q[order]) >= 0)  # q monotone in p
    stat = np.abs(t.z) if alternative == "two-sided" else t.z
    by_stat = np.argsort(stat, kind="stable")
    assert np.all(np.diff(t.p[by_stat]) <= 1e-15)  # larger |z| (or z) -> smaller p
    if p_method == "null":
        assert np.all(t.p > 0)


def test_poorly_determined_lindsey_fit_is_reported(monkeypatch):
    from statsmodels.tools.sm_exceptions import ConvergenceWarning

    def unconverged(z, null_proportion, null_pdf, deg):
        warnings.warn("IRLS did not converge", ConvergenceWarning, stacklevel=2)
        return np.full(z.shape, 0.5)

    monkeypatch.setattr(S._smt, "local_fdr", unconverged)
    with pytest.warns(S.StatisticsWarning, match="poorly determined.*did not converge"):
        lfdr = S.local_fdr(np.linspace(-3, 3, 10), 0.9)
    np.testing.assert_array_equal(lfdr, 0.5)  # still used: the paper's reference would use it
