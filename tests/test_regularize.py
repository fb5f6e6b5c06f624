"""Regularized attention maps (docs/method.md)."""

from __future__ import annotations

import numpy as np
import pytest
import reference_impl as ref
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from napari_attnreg.core.stats import rules as R
from napari_attnreg.core.stats.presets import RULES_BY_PRESET

A = np.array([[0.40, 0.20, 0.10], [0.15, 0.10, 0.05]])
Z = np.array([[2.5, 1.0, -0.5], [0.0, 0.3, -2.0]])
P = np.array([[0.01, 0.20, 0.60], [0.35, 0.90, 0.05]])
LFDR = np.array([[0.02, 0.40, 0.90], [0.25, 1.00, 0.10]])
POST = 1.0 - LFDR


def test_maps_by_hand():
    maps = R.regularized_maps(A, Z, P, LFDR, POST, 0.5, z_th=0.0, p_th=0.1, l_th=0.3)
    assert set(maps) == set(RULES_BY_PRESET["paper"])  # the step-down rules need its steps
    np.testing.assert_array_equal(maps["base"], [[0.40, 0.20, 0], [0.15, 0.10, 0]])
    np.testing.assert_array_equal(maps["p"], [[0.40, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(maps["lfdr"], [[0.40, 0, 0], [0.15, 0, 0]])
    # percentile(p, 50) of {0.01, 0.05, 0.2, 0.35, 0.6, 0.9} = 0.275: keep p <= 0.275 and z >= 0
    assert R.pi0_p_threshold(P, 0.5) == pytest.approx(0.275)
    np.testing.assert_array_equal(maps["pi0"], [[0.40, 0.20, 0], [0, 0, 0]])
    np.testing.assert_allclose(maps["soft"], A * POST)


def test_default_thresholds_are_documented_values():
    assert (R.DEFAULT_Z_TH, R.DEFAULT_P_TH, R.DEFAULT_L_TH) == (0.0, 0.3, 0.3)
    a = R.regularized_map("p", A, Z, P, LFDR, POST, 0.5)
    np.testing.assert_array_equal(a, R.regularized_maps(A, Z, P, LFDR, POST, 0.5)["p"])


def test_pi0_rule_extremes():
    # π0 = 0: nothing is null, every token with z >= z_th is kept.
    np.testing.assert_array_equal(R.regularized_map("pi0", A, Z, P, LFDR, POST, 0.0),
                                  R.regularized_map("base", A, Z, P, LFDR, POST, 0.0))
    # π0 = 1: only the smallest p-value survives (the 0th percentile).
    kept = R.significance_mask("pi0", np.ones_like(Z), P, LFDR, 1.0)
    np.testing.assert_array_equal(kept, P == P.min())


def test_pi0_rule_drops_the_pi0_fraction_with_largest_p():
    rng = np.random.default_rng(0)
    p = rng.permutation(np.arange(1, 101) / 100.0)
    for pi0 in (0.1, 0.37, 0.5, 0.9):
        kept = R.significance_mask("pi0", np.ones(100), p, np.zeros(100), pi0)
        # literal: the kept tokens are the smallest-p ones, about (1 - π0)·T of them
        assert set(np.flatnonzero(kept)) == set(np.argsort(p)[: kept.sum()])
        assert abs(kept.sum() - (1 - pi0) * 100) <= 1


def test_significance_masks_by_hand():
    kw = {"z_th": 0.5, "p_th": 0.3, "l_th": 0.3}
    np.testing.assert_array_equal(R.significance_mask("base", Z, P, LFDR, 0.5, **kw),
                                  [[True, True, False], [False, False, False]])
    np.testing.assert_array_equal(R.significance_mask("soft", Z, P, LFDR, 0.5, **kw),
                                  [[True, True, False], [False, False, False]])
    np.testing.assert_array_equal(R.significance_mask("lfdr", Z, P, LFDR, 0.5, **kw),
                                  [[True, False, False], [False, False, False]])
    # an explicit posterior overrides 1 - lfdr
    post = np.zeros_like(Z)
    assert not R.significance_mask("soft", Z, P, LFDR, 0.5, posterior=post, **kw).any()


def test_elementwise_rules_commute_with_pixel_upsampling():
    # Every rule but "pi0" acts token by token, so regularizing the upsampled
    # statistics equals upsampling the token-level result.
    s = 4
    for rule in ("base", "p", "lfdr", "soft"):
        tok = R.regularized_map(rule, A, Z, P, LFDR, POST, 0.5)
        pix = R.regularized_map(rule, *(ref.upsample(m, s) for m in (A, Z, P, LFDR, POST)), 0.5)
        np.testing.assert_array_equal(pix, ref.upsample(tok, s))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"attention": A[:1]}, "shape"),
        ({"p": np.full_like(P, np.nan)}, "NaN"),
        ({"attention": -A}, "negative"),
        ({"pi0": 1.5}, "pi0"),
    ],
)
def test_bad_input_raises(kwargs, match):
    args = {"attention": A, "z": Z, "p": P, "lfdr": LFDR, "posterior": POST, "pi0": 0.5} | kwargs
    with pytest.raises(ValueError, match=match):
        R.regularized_maps(**args)


def test_unknown_rule_raises():
    with pytest.raises(ValueError, match="use one of"):
        R.regularized_map("fdr", A, Z, P, LFDR, POST, 0.5)
    with pytest.raises(ValueError, match="use one of"):
        R.significance_mask("fdr", Z, P, LFDR, 0.5)


@st.composite
def token_maps(draw):
    shape = draw(st.tuples(st.integers(1, 6), st.integers(1, 6)))
    unit = st.floats(0.0, 1.0)
    attention = draw(hnp.arrays(np.float64, shape, elements=st.floats(0.0, 1.0)))
    z = draw(hnp.arrays(np.float64, shape, elements=st.floats(-5, 5)))
    p = draw(hnp.arrays(np.float64, shape, elements=unit))
    lfdr = draw(hnp.arrays(np.float64, shape, elements=unit))
    return attention, z, p, lfdr


@settings(max_examples=150, deadline=None)
@given(token_maps(), st.floats(0, 1), st.floats(-2, 2), st.floats(0, 1), st.floats(0, 1))
def test_properties(maps, pi0, z_th, p_th, l_th):
    attention, z, p, lfdr = maps
    out = R.regularized_maps(attention, z, p, lfdr, 1 - lfdr, pi0, z_th=z_th, p_th=p_th, l_th=l_th)
    for rule, m in out.items():
        assert m.shape == attention.shape and np.all(np.isfinite(m))
        assert np.all((m >= 0) & (m <= attention)), rule
        if rule != "soft":
            assert np.all(m[z < z_th] == 0), rule  # zero where the z mask removes a token
            kept = R.significance_mask(rule, z, p, lfdr, pi0, z_th=z_th, p_th=p_th, l_th=l_th)
            np.testing.assert_array_equal(m, np.where(kept, attention, 0.0))
    assert np.all(out["soft"][lfdr == 1] == 0)
    # each hard rule is a subset of the base map
    base_kept = out["base"] > 0
    for rule in ("p", "lfdr", "pi0"):
        assert np.all(base_kept | (out[rule] == 0))
    # tightening a threshold only removes tokens
    tighter = R.significance_mask("p", z, p, lfdr, pi0, z_th=z_th, p_th=p_th / 2)
    looser = R.significance_mask("p", z, p, lfdr, pi0, z_th=z_th, p_th=p_th)
    assert np.all(looser | ~tighter)


def test_an_rgb_array_runs_and_a_huge_one_is_refused_by_the_memory_guard():
    from napari_attnreg import regularize

    # the guard reads rows and columns before the preparation decides the colour axis
    rgb = np.random.default_rng(0).integers(0, 255, (64, 64, 3)).astype(np.uint8)
    assert 0 < regularize(rgb, "demo", n_boot=4, device="cpu").p_map <= 1
    huge = np.broadcast_to(np.zeros(3, np.uint8), (9000, 9000, 3))
    with pytest.raises(ValueError, match="tiled"):
        regularize(huge, "demo", n_boot=4, device="cpu")
