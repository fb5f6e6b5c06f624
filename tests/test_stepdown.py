"""Share step-down inference against independent slow versions and its properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from napari_attnreg.core.stats import stepdown as sd
from napari_attnreg.core.stats.stepdown_maps import stepdown_mask, stepdown_statistics


def slow_step_down(a: np.ndarray, null: np.ndarray):
    """METHOD §16 steps 1–5 written literally: one step, one null map at a time."""
    n_boot, n_tok = null.shape
    order = sorted(range(n_tok), key=lambda t: (-a[t], t))
    s, m, p = [], np.empty((n_boot, n_tok)), []
    for k in range(n_tok):
        rest = order[k:]
        s_k = a[order[k]] / sum(a[t] for t in rest)
        for b in range(n_boot):
            m[b, k] = max(null[b, t] for t in rest) / sum(null[b, t] for t in rest)
        s.append(s_k)
        p.append((1 + sum(m[b, k] >= s_k for b in range(n_boot))) / (1 + n_boot))
    adjusted = [max(p[: k + 1]) for k in range(n_tok)]
    return np.array(order), np.array(s), m, np.array(p), np.array(adjusted)


def slow_forwardstop(p: np.ndarray, alpha: float) -> int:
    best = 0
    for k in range(1, len(p) + 1):
        if sum(-math.log(1 - v) if v < 1 else math.inf for v in p[:k]) / k <= alpha:
            best = k
    return best


def _maps(seed: int, n_boot: int = 30, n_tok: int = 24, planted: int = 0):
    rng = np.random.default_rng(seed)
    null = rng.dirichlet(np.full(n_tok, 2.0), size=n_boot)
    logits = rng.normal(size=n_tok)
    logits[:planted] += 3.0
    a = np.exp(logits) / np.exp(logits).sum()
    return a, null


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("planted", [0, 3])
@pytest.mark.parametrize("n_boot", [30, 7, 199])  # (1 + count) / (1 + B) not exact in binary
def test_matches_the_literal_step_loop(seed, planted, n_boot):
    a, null = _maps(seed, n_boot=n_boot, planted=planted)
    order, s, _m, p, adjusted = slow_step_down(a, null)
    fam = sd.step_down(torch.from_numpy(a), torch.from_numpy(null))
    np.testing.assert_array_equal(fam.order[0], order)
    np.testing.assert_allclose(fam.step_statistic[0], s, rtol=1e-12)
    np.testing.assert_array_equal(fam.step_p[0], p)
    np.testing.assert_array_equal(fam.adjusted_p[0], adjusted)


def test_null_step_statistic_matches_the_loop_in_small_blocks(monkeypatch):
    a, null = _maps(5, n_boot=17, n_tok=11, planted=2)
    _order, _s, m, _p, _adj = slow_step_down(a, null)
    monkeypatch.setattr(sd, "BLOCK_ELEMENTS", 11 * 3)  # three null maps per block
    order, _ = sd._ordered(torch.from_numpy(a)[None])
    blocks = list(sd._null_step_blocks(torch.from_numpy(null), order, True, torch.float64))
    assert len(blocks) > 1
    got = torch.cat([block[:, 0] for *_, block in blocks]).numpy()
    np.testing.assert_allclose(got, m, rtol=1e-12)


def _many_families(shared: bool, device: str = "cpu"):
    rng = np.random.default_rng(4)
    obs = torch.from_numpy(np.exp(rng.normal(0, 0.5, (60, 25)))).to(device)
    obs[:6, 0] *= 6.0
    shape = (150, 25) if shared else (60, 150, 25)
    return obs, torch.from_numpy(np.exp(rng.normal(0, 0.5, shape))).float().to(device)


@pytest.mark.parametrize("shared", [True, False])
def test_the_block_size_never_changes_a_value(monkeypatch, shared):
    # a GPU takes blocks of many null maps where a CPU takes one map of every family
    obs, null = _many_families(shared)
    results = []
    for budget in (1, 10**9):  # one null map per block; all of them in one block
        monkeypatch.setattr(sd, "_block_budget", lambda null, b=budget: b)
        results.append(sd.step_down(obs, null, tail="gpd"))
    small, large = results
    assert small.tail.steps > 0
    for name in ("step_statistic", "step_p", "adjusted_p", "tail_used"):
        np.testing.assert_array_equal(getattr(small, name), getattr(large, name), err_msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on a lent GPU)")
@pytest.mark.parametrize("shared", [True, False])
def test_on_a_gpu_large_blocks_give_the_values_of_one_map_blocks(monkeypatch, shared):
    obs, null = _many_families(shared, "cuda")
    large = sd.step_down(obs, null, tail="gpd")
    monkeypatch.setattr(sd, "_block_budget", lambda null: 1)
    small = sd.step_down(obs, null, tail="gpd")
    for name in ("step_statistic", "step_p", "adjusted_p", "tail_used"):
        np.testing.assert_array_equal(getattr(small, name), getattr(large, name), err_msg=name)


@pytest.mark.parametrize("seed", range(6))
def test_forwardstop_against_its_formula(seed):
    rng = np.random.default_rng(seed)
    p = np.sort(rng.uniform(0, 0.3, 40) ** 2)
    p[rng.integers(0, 40, 3)] = 1.0  # −log(1 − 1) = ∞ must not break the search
    for alpha in (0.01, 0.05, 0.1, 0.3):
        assert sd.forwardstop_count(p, alpha)[0] == slow_forwardstop(p, alpha)


def test_forwardstop_keeps_an_object_split_over_a_few_tokens():
    # three figure tokens, the second with a middling p: FWER stops at 1, ForwardStop keeps 3
    p = np.array([0.001, 0.06, 0.002, 0.9, 0.8, 0.7])
    adjusted = np.maximum.accumulate(p)
    fwer = sd.significant_steps(p[None], adjusted[None], np.ones((1, 6), bool), "fwer", 0.05)
    fstop = sd.significant_steps(p[None], adjusted[None], np.ones((1, 6), bool), "forwardstop", 0.1)
    assert fwer.sum() == 1 and fstop.sum() == 3


def test_ties_share_the_largest_adjusted_p_and_stay_together():
    rng = np.random.default_rng(3)
    null = rng.dirichlet(np.full(8, 1.0), size=50)
    a = np.array([0.3, 0.2, 0.2, 0.2, 0.05, 0.02, 0.02, 0.01])
    fam = sd.step_down(torch.from_numpy(a), torch.from_numpy(null))
    by_token = fam.in_token_order(fam.adjusted_p)[0]
    assert by_token[1] == by_token[2] == by_token[3]
    assert by_token[1] == fam.adjusted_p[0, 3]  # the last of the group's three steps
    assert by_token[5] == by_token[6]
    # a rule never splits a tie group
    k = sd.forwardstop_count(np.array([0.001, 0.001, 0.5, 0.5]), 0.05,
                             np.array([True, False, False, True]))
    assert k[0] == 1


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_boot=st.integers(1, 40), n_tok=st.integers(1, 30),
       spread=st.floats(0.01, 30.0), ties=st.booleans())
def test_properties_hold_for_any_valid_input(seed, n_boot, n_tok, spread, ties):
    rng = np.random.default_rng(seed)
    a = np.exp(spread * rng.normal(size=n_tok))
    if ties:
        a = np.round(a, 1) + 1e-3  # many exact ties
    null = np.exp(spread * rng.normal(size=(n_boot, n_tok)))
    fam = sd.step_down(torch.from_numpy(a / a.sum()), torch.from_numpy(null))
    p, adjusted = fam.step_p[0], fam.adjusted_p[0]
    assert np.all(np.isfinite(p)) and np.all(np.isfinite(adjusted))
    assert p.min() >= 1 / (n_boot + 1) - 1e-15 and p.max() <= 1.0
    # evidence never increases as attention decreases (step order)
    evidence = 1 - adjusted
    assert np.all(np.diff(evidence) <= 0)
    by_token = fam.in_token_order(fam.adjusted_p)[0]
    for value in np.unique(a):
        assert np.ptp(by_token[a == value]) == 0


def test_families_equal_one_run_per_family():
    rng = np.random.default_rng(8)
    obs = torch.from_numpy(rng.dirichlet(np.ones(16), size=5))
    shared = torch.from_numpy(rng.dirichlet(np.ones(16), size=40))
    own = torch.from_numpy(rng.dirichlet(np.ones(16), size=(5, 40)))
    both = sd.step_down(obs, shared)
    each = sd.step_down(obs, own)
    for f in range(5):
        alone = sd.step_down(obs[f], shared)
        np.testing.assert_array_equal(both.step_p[f], alone.step_p[0])
        alone_own = sd.step_down(obs[f], own[f])
        np.testing.assert_array_equal(each.adjusted_p[f], alone_own.adjusted_p[0])


def test_tiles_selected_by_bh_and_ruled_at_the_scaled_level():
    # four tiles: two with a clear first step; BH at 0.1 selects both, then α·2/4 inside
    p = np.array([[0.001, 0.01, 0.9], [0.002, 0.04, 0.9], [0.5, 0.6, 0.9], [0.7, 0.8, 0.9]])
    adjusted = np.maximum.accumulate(p, axis=1)
    ends = np.ones_like(p, dtype=bool)
    keep = sd.significant_steps(p, adjusted, ends, "forwardstop", 0.1)
    level = 0.1 * 2 / 4
    for f in range(4):
        expected = slow_forwardstop(p[f], level) if f < 2 else 0
        assert keep[f].sum() == expected
    assert keep[2:].sum() == 0


def test_result_maps_and_stored_steps_reproduce_the_rule():
    a, null = _maps(11, n_boot=99, n_tok=64, planted=4)
    st_ = stepdown_statistics(torch.from_numpy(a), torch.from_numpy(null))
    fam = sd.step_down(torch.from_numpy(a), torch.from_numpy(null))
    np.testing.assert_array_equal(st_.q, fam.in_token_order(fam.adjusted_p)[0])
    np.testing.assert_array_equal(st_.posterior, 1 - st_.q)
    assert st_.null_summary["p_map"] == fam.step_p[0, 0]
    k_hat = sd.forwardstop_count(fam.step_p, 0.1, fam.group_end)[0]
    mask = stepdown_mask(st_.null_summary, "forwardstop", 0.1, (8, 8)).reshape(-1)
    assert mask.sum() == k_hat
    assert set(np.flatnonzero(mask)) == set(fam.order[0, :k_hat])


# ------------------------------------------------------------------ tail approximation


def test_tail_p_matches_a_known_tail():
    rng = np.random.default_rng(0)
    values = rng.exponential(1.0, 2000)  # GPD with shape 0 above any threshold
    observed = 9.0  # true p = exp(-9) ≈ 1.2e-4, below the counting resolution 1/2001
    from napari_attnreg.core.stats.tail import gpd_tail_p

    p, floored = gpd_tail_p(values, observed)
    assert not floored
    assert 0.3 * math.exp(-9) < p < 3 * math.exp(-9)


def test_a_bounded_tail_is_not_extrapolated_to_its_end_point():
    from napari_attnreg.core.stats.tail import gpd_tail_p

    # shape −0.3: the true tail ends at 1/0.3 ≈ 3.3; just past the sample's largest value the
    # fitted end point would give p = 0 (the floor). The exponential tail used instead gives
    # a p of the order of one exceedance in B, never the floor.
    for shape, seed in ((-0.3, 1), (-0.1, 2), (-0.05, 3)):
        values = stats.genpareto.rvs(shape, size=500, random_state=np.random.default_rng(seed))
        found = gpd_tail_p(values, float(values.max()) * 1.01)
        # the exponential fit is rejected (the count is kept) or gives a p near 1/B
        assert found is None or (not found[1] and found[0] > 1e-4), (shape, found)
    values = stats.genpareto.rvs(-0.05, size=500, random_state=np.random.default_rng(3))
    p_far, floored_far = gpd_tail_p(values, 500.0)  # far beyond: the floor
    assert floored_far and p_far == pytest.approx(1 / (100 * 501))


def test_tail_p_values_stay_uniform_on_pure_noise():
    # the observed statistic is one more draw from the null: the tail p must be calibrated
    from napari_attnreg.core.stats.tail import gpd_tail_p

    rng = np.random.default_rng(2)
    p_values = []
    for _ in range(300):
        values = rng.gamma(2.0, 1.0, 201)
        observed, null = values[0], values[1:]
        count = (null >= observed).sum()
        tail = gpd_tail_p(null, observed) if count < 10 else None
        p_values.append(tail[0] if tail is not None else (1 + count) / 201)
    assert stats.kstest(p_values, "uniform").pvalue > 0.01


def test_tail_option_records_what_it_did():
    a, null = _maps(4, n_boot=150, n_tok=36, planted=5)
    fam = sd.step_down(torch.from_numpy(a), torch.from_numpy(null), tail="gpd")
    assert fam.tail.method == "gpd"
    assert fam.tail.steps == int(fam.tail_used.sum())
    assert np.all(fam.step_p[fam.tail_used] >= 1 / (100 * 151))
    few = sd.step_down(torch.from_numpy(a), torch.from_numpy(null[:50]), tail="gpd")
    assert few.tail.steps == 0 and "B = 50" in few.tail.note
    with pytest.raises(ValueError, match="tail"):
        sd.step_down(torch.from_numpy(a), torch.from_numpy(null), tail="exp")


def test_inputs_are_never_changed():
    a, null = _maps(12, n_boot=40, n_tok=30, planted=2)
    a_copy, null_copy = a.copy(), null.copy()
    stepdown_statistics(torch.from_numpy(a), torch.from_numpy(null), tail="gpd")
    np.testing.assert_array_equal(a, a_copy)
    np.testing.assert_array_equal(null, null_copy)


def test_token_and_step_order_are_numpys_put_and_take_along_axis():
    # done by torch's scatter and gather on the host's threads (30 M values for a slide)
    rng = np.random.default_rng(5)
    order = np.argsort(rng.random((7, 13)), axis=1)
    fam = sd.StepDownFamilies(order=order, step_statistic=rng.random((7, 13)),
                              step_p=rng.random((7, 13)), adjusted_p=rng.random((7, 13)),
                              group_end=rng.random((7, 13)) > 0.5,
                              tail_used=rng.random((7, 13)) > 0.5, n_boot=10,
                              tail=sd.TailFit.unused("none"))
    for values in (fam.step_p, fam.group_end, rng.integers(0, 99, (7, 13)).astype(np.int32)):
        expected = np.empty_like(values)
        np.put_along_axis(expected, order, values, axis=1)
        got = fam.in_token_order(values)
        assert got.dtype == values.dtype and np.array_equal(got, expected)
        assert np.array_equal(fam.in_step_order(got), values)  # and back
    shared = np.arange(13, dtype=np.int32)[None]  # one row for every family
    assert np.array_equal(fam.in_step_order(shared), np.take_along_axis(
        np.repeat(shared, 7, axis=0), order, axis=1))
