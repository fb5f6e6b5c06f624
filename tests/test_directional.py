"""Directional statistics (p⁺, π0, q⁺, Grenander lfdr⁺, posterior⁺) against literal slow versions."""

from __future__ import annotations

import numpy as np
import pytest
import reference_impl as ref
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.stats import t as student_t

from napari_attnreg.core.stats import directional as D
from napari_attnreg.core.stats.rules import pi0_p_threshold

# ------------------------------------------------------------------ literal references


def literal_ecdf(p: np.ndarray, x: float) -> float:
    return float(np.mean(p <= x))


def literal_lcm_left_slope(p: np.ndarray) -> np.ndarray:
    """Left derivative of the least concave majorant of the ECDF, by brute force.

    The candidate points are the origin and (v, F(v)) for every distinct value v; a point is
    a vertex of the majorant when no chord between an earlier and a later point passes
    above it. The slope at v is that of the majorant segment (a, b] holding v.
    """
    values = np.unique(p)
    xs = np.concatenate(([0.0], values))
    fs = np.array([0.0] + [literal_ecdf(p, v) for v in values])
    on_hull = []
    for k in range(xs.size):
        above = False
        for i in range(k):
            for j in range(k + 1, xs.size):
                chord = fs[i] + (fs[j] - fs[i]) * (xs[k] - xs[i]) / (xs[j] - xs[i])
                if chord > fs[k] + 1e-12:
                    above = True
        if not above:
            on_hull.append(k)
    slopes = np.empty(p.size)
    for n, v in enumerate(p):
        right = next(k for k in on_hull if xs[k] >= v)
        left = max(k for k in on_hull if xs[k] < v)
        slopes[n] = (fs[right] - fs[left]) / (xs[right] - xs[left])
    return slopes


def literal_pooled_pplus(obs: np.ndarray, null: np.ndarray) -> np.ndarray:
    z_obs, z_null, _, _ = ref.z_scores(obs, null)
    return np.array([(1 + np.sum(z_null >= v)) / (1 + z_null.size) for v in z_obs.ravel()])


def softmax_maps(rng, shape, spread):
    logits = rng.normal(size=shape) * spread
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def maps():
    rng = np.random.default_rng(3)
    null = softmax_maps(rng, (40, 30), 1.0)
    obs = softmax_maps(rng, (30,), 1.0)
    obs[:4] *= 6.0  # a few tokens far above the null
    obs[4:8] /= 6.0  # and a few far below it
    return obs / obs.sum(), null


# ------------------------------------------------------------------ against the literal versions


def test_pooled_pplus_is_the_literal_count(maps):
    obs, null = maps
    p = D.pooled_pvalues(*_z(obs, null))
    np.testing.assert_allclose(p, literal_pooled_pplus(obs, null), rtol=0, atol=1e-12)
    assert p.min() > 0  # never 0, unlike the paper's pooled p


def _z(obs, null):
    from napari_attnreg.core.stats.paper import z_scores

    z_obs, z_null, _, _ = z_scores(torch.from_numpy(obs), torch.from_numpy(null))
    return z_obs, torch.sort(z_null.reshape(-1)).values


@pytest.mark.parametrize("seed", range(6))
def test_grenander_equals_the_literal_majorant(seed):
    rng = np.random.default_rng(seed)
    p = np.concatenate([rng.beta(0.3, 4, size=8), rng.uniform(size=25)])
    p[:3] = p[3]  # ties
    np.testing.assert_allclose(D.grenander_density(p), literal_lcm_left_slope(p), rtol=1e-10)


def test_grenander_of_a_plain_ecdf_by_hand():
    # points (0,0) (.1,.25) (.2,.5) (.5,.75) (1,1): slopes 2.5, 2.5, 0.833, 0.5
    p = np.array([0.1, 0.2, 0.5, 1.0])
    np.testing.assert_allclose(D.grenander_density(p), [2.5, 2.5, 0.25 / 0.3, 0.5])


LITERAL_PI0 = {
    "bh": lambda p: 1.0,
    "storey": lambda p: min(1.0, np.sum(p > 0.5) / (0.5 * p.size)),  # Storey (2002), λ = 0.5
    "smoother": lambda p: min(1.0, ref.pi0_smoother(p)),
}


@pytest.mark.parametrize("pi0_method", list(LITERAL_PI0))
def test_statistics_match_the_literal_pipeline(maps, pi0_method):
    obs, null = maps
    s = D.directional_statistics(torch.from_numpy(obs), torch.from_numpy(null),
                                 pi0_method=pi0_method)
    p = literal_pooled_pplus(obs, null)
    pi0 = LITERAL_PI0[pi0_method](p)
    lfdr = np.minimum(1.0, pi0 / literal_lcm_left_slope(p))
    np.testing.assert_allclose(s.p, p, atol=1e-12)
    assert s.pi0 == pytest.approx(pi0, abs=1e-9)
    np.testing.assert_allclose(s.q, ref.qvalues(p, pi0), atol=1e-12)
    np.testing.assert_allclose(s.lfdr, lfdr, atol=1e-9)
    np.testing.assert_allclose(s.posterior, 1 - lfdr, atol=1e-9)
    # the tokens planted below the null are never called above it
    assert np.all(s.posterior[4:8] == 0) and np.all(s.p[4:8] > 0.5)
    assert s.posterior[:4].min() > s.posterior[8:].max() - 1e-12


def test_position_pvalues_are_the_student_t_predictive_tail(maps):
    obs, null = maps
    p = D.position_pvalues(torch.from_numpy(obs), torch.from_numpy(null))
    log_null = np.log(null.astype(np.float64))
    b = null.shape[0]
    for t in range(obs.size):
        m, s = log_null[:, t].mean(), log_null[:, t].std(ddof=1)
        stat = (np.log(float(obs[t])) - m) / (s * np.sqrt(1 + 1 / b))
        assert p[t] == pytest.approx(1 - student_t.cdf(stat, b - 1), abs=1e-12)


def test_position_null_needs_three_nulls_and_varying_positions():
    with pytest.raises(ValueError, match="at least 3"):
        D.position_pvalues(torch.rand(5) + 0.1, torch.rand(2, 5) + 0.1)
    null = torch.rand(10, 5) + 0.1
    null[:, 2] = 0.3
    with pytest.raises(ValueError, match="same null attention"):
        D.position_pvalues(torch.rand(5) + 0.1, null)


# ------------------------------------------------------------------ properties


score_arrays = hnp.arrays(np.float64, st.integers(2, 40),
                          elements=st.floats(1e-6, 1.0, allow_nan=False))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obs=score_arrays, seed=st.integers(0, 2**16), n_boot=st.integers(3, 12),
       pool=st.sampled_from(D.NULL_POOLS))
def test_posterior_is_monotone_in_attention_and_everything_is_in_range(obs, seed, n_boot, pool):
    rng = np.random.default_rng(seed)
    null = rng.uniform(1e-4, 1.0, size=(n_boot, obs.size))
    s = D.directional_statistics(torch.from_numpy(obs), torch.from_numpy(null), null_pool=pool)
    for name in ("p", "q", "lfdr", "posterior"):
        arr = getattr(s, name)
        assert np.all(np.isfinite(arr)) and np.all((arr >= 0) & (arr <= 1)), name
    if pool == "pooled":  # a higher attention never gets a lower posterior (same position or not)
        order = np.argsort(obs, kind="stable")
        assert np.all(np.diff(s.posterior[order]) >= -1e-12)
        assert np.all(np.diff(s.p[order]) <= 1e-12)
    # and within one position, more attention never lowers the posterior either
    assert np.all(np.diff(D.directional_lfdr(np.sort(s.p), s.pi0)) >= -1e-12)


@settings(max_examples=60, deadline=None)
@given(p=hnp.arrays(np.float64, st.integers(1, 30), elements=st.floats(0, 1)),
       pi0=st.floats(0, 1), reps=st.integers(1, 20))
def test_pixel_grid_percentile_equals_numpy_on_the_repeated_array(p, pi0, reps):
    expected = np.percentile(np.repeat(p, reps), 100 * (1 - pi0))
    assert pi0_p_threshold(p, pi0, reps) == pytest.approx(expected, abs=1e-12)


def test_a_flat_map_among_peaked_null_maps_is_not_called_significant_by_default():
    """One map's tokens share the softmax normalisation: a flat map (no object) sits above
    the many tiny tokens of peaked null maps, so every p⁺ is below 0.5. Data-driven π0
    estimates then collapse to 0 and call everything significant; the default π0 = 1 does not.
    """
    rng = np.random.default_rng(0)
    t, b = 256, 40
    null = rng.uniform(0.2, 1.8, size=(b, t))
    null[np.arange(b), rng.integers(0, t, b)] = 40.0  # each null map has one strong token
    null /= null.sum(1, keepdims=True)
    obs = rng.uniform(1.05, 1.3, size=t)
    obs /= obs.sum()
    default = D.directional_statistics(torch.from_numpy(obs), torch.from_numpy(null))
    assert 0.1 < default.p.min() and default.p.max() < 0.5 and default.pi0 == 1.0
    assert (default.q <= 0.1).sum() == 0
    storey = D.directional_statistics(torch.from_numpy(obs), torch.from_numpy(null),
                                      pi0_method="storey")
    assert storey.pi0 < 0.1 and (storey.q <= 0.1).mean() > 0.9  # what the default avoids
