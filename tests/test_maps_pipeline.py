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
