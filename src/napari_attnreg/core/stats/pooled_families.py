"""The pooled-null procedures (paper, directional) on several maps of one image at once.

A run hands a procedure *families* where one map is not the whole test: every head of a
block (``map="heads"``), or the one map with its attention sinks left out
(``exclude_sinks=True``). Under the pooled-null procedures each family is tested alone, as
if it were the only map: its observed tokens against its own null columns (the null maps of
that head at the kept positions), with that procedure's z, p, π0, local fdr and q. The
families are then combined the way the procedure controls multiplicity:

- q: the procedure's q-values over **all** ``F·K`` family-token p-values together (π0 by the
  procedure's own estimator over all of them; Benjamini–Hochberg for the directional
  default), so the q rule controls the false discovery rate over every head and token looked
  at, not within one head;
- the local fdr (and the posterior ``1 − lfdr``) stays each family's own: it is a per-test
  probability under that family's two-group fit and needs no multiplicity correction;
- z and p stay each family's own (the p rule is a per-test threshold, as for one map).

Per image token the statistics reported are those of the family that gives the token the
most attention (its *owner*, as the step-down reports its step p); a token in no family (an
attention sink left out) is not tested: NaN p, q, lfdr and posterior. Its z is that of its
own value against the union of the families' null pools, so the z map stays finite.
``null_summary`` keeps every family's posterior (``family_posterior``, ``(F, T)``) and π0.

With one family this is exactly the procedure run on the kept tokens alone.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from napari_attnreg.core.stats.paper import (
    TokenStatistics,
    estimate_pi0,
    qvalues,
    sorted_pool,
    summarize_null,
)

#: One family's statistics: observed ``(K,)`` and null ``(B, K)`` → :class:`TokenStatistics`.
FamilyTest = Callable[[torch.Tensor, torch.Tensor], TokenStatistics]


def family_statistics(test: FamilyTest, observed: torch.Tensor, null_scores: torch.Tensor, *,
                      families: torch.Tensor, owner: tuple[np.ndarray, np.ndarray],
                      family_tokens: np.ndarray, pi0_method: str | float) -> TokenStatistics:
    """Token statistics of an image whose tokens are tested in families (module notes).

    Parameters
    ----------
    test : callable
        The procedure's statistics of one map against its nulls.
    observed : tensor ``(T,)``
        The image's map (the mean of the heads for head families); gives the z of tokens
        that no family tests.
    null_scores : tensor ``(B, K)`` shared by every family, or ``(B, F·K)`` family by family
    families : tensor ``(F, K)``
        Each family's observed values at its ``K`` kept tokens.
    owner : (array, array)
        For each of the ``T`` image tokens: the family that reports it and its index there.
    family_tokens : array ``(F, K)`` of int
        The image token under each kept token of each family.
    pi0_method : str or float
        The procedure's π0 estimator, applied to all ``F·K`` p-values for the q-values.

    Returns
    -------
    TokenStatistics
    """
    n_fam, n_kept = families.shape
    n_boot = null_scores.shape[0]
    shared = null_scores.shape[1] == n_kept and n_fam > 1
    nulls = null_scores.reshape(n_boot, 1 if shared else n_fam, n_kept)
    each = [test(families[f], nulls[:, 0 if shared else f]) for f in range(n_fam)]
    p_all = np.stack([s.p for s in each])
    pi0 = estimate_pi0(p_all.reshape(-1), pi0_method)
    q_all = qvalues(p_all, pi0)

    n_image = int(observed.numel())
    family_of, local = (np.asarray(v, dtype=np.int64).reshape(-1) for v in owner)
    tested = np.zeros(n_image, dtype=bool)
    tested[np.asarray(family_tokens).reshape(-1)] = True

    def reported(per_family: np.ndarray) -> np.ndarray:
        return np.where(tested, per_family[family_of, local], np.nan)

    mu0, sigma0, summary = _union_null(each, nulls, family_of, local, tested)
    log_obs = torch.log(observed.reshape(-1).double().cpu()).numpy()
    z = np.where(tested, np.stack([s.z for s in each])[family_of, local],
                 (log_obs - mu0) / sigma0)
    lfdr = reported(np.stack([s.lfdr for s in each]))
    posterior_all = np.stack([s.posterior for s in each])
    family_posterior = np.full((n_fam, n_image), np.nan)
    np.put_along_axis(family_posterior, np.asarray(family_tokens, dtype=np.int64),
                      posterior_all, axis=1)
    summary.update(
        lfdr_fit=_worst_fit(each), empirical_null=None,
        n_pooled_families=n_fam, family_pi0=np.array([s.pi0 for s in each]),
        family_posterior=family_posterior)
    if "null_pool" in each[0].null_summary:
        summary["null_pool"] = each[0].null_summary["null_pool"]
    return TokenStatistics(z=z, p=reported(p_all), pi0=pi0, lfdr=lfdr,
                           posterior=reported(posterior_all), q=reported(q_all), mu0=mu0,
                           sigma0=sigma0, null_summary=summary)


def _union_null(each: list[TokenStatistics], nulls: torch.Tensor, family_of: np.ndarray,
                local: np.ndarray, tested: np.ndarray) -> tuple[float, float, dict]:
    """Moments of the union of the families' log null pools (equal sizes) and a summary.

    The summary's pooled quantiles and histogram are those of every family's null z (each
    against its own pool, as its tokens' z are); its per-position mean and sd are the
    owner family's, on the image grid.
    """
    mus = np.array([s.mu0 for s in each])
    sigmas = np.array([s.sigma0 for s in each])
    mu0 = float(mus.mean())
    # the variance of equal-sized pools together (never below the smallest pool's, > 0)
    sigma0 = float(np.sqrt(max(np.mean(sigmas ** 2 + mus ** 2) - mu0 ** 2, sigmas.min() ** 2)))
    standardized = torch.cat([  # a shared null (one column block) is every family's
        (nulls[:, f].to(torch.float64).log() - each[f].mu0) / each[f].sigma0
        for f in range(nulls.shape[1])], dim=1)
    sorted_null, columns = sorted_pool(standardized.cpu().contiguous())
    summary = summarize_null(columns, sorted_null)
    n_kept = nulls.shape[2]
    for key in ("z_null_mean", "z_null_std"):
        per_family = np.asarray(summary[key]).reshape(-1, n_kept)
        summary[key] = np.where(tested, per_family[family_of % per_family.shape[0], local],
                                np.nan)
    summary.update(B=int(nulls.shape[0]), T=int(n_kept))
    return mu0, sigma0, summary


def _worst_fit(each: list[TokenStatistics]) -> str:
    """The density fit to name in the diagnostics: a fallback if any family needed one."""
    fits = [str(s.null_summary.get("lfdr_fit")) for s in each]
    fallback = [f for f in fits if f not in ("lindsey-deg7", "grenander")]
    return fallback[0] if fallback else fits[0]
