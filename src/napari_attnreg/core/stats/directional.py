"""Directional inference: is a token's attention *higher* than noise input gives?

The paper's two-sided statistics (:mod:`.stats`) rank ``|z|``, so tokens far *below* the null
also look "significant". Here every quantity is one-sided:

- ``p⁺`` against the pooled null, ``(1 + #{z_null ≥ z_obs}) / (1 + B·T)`` (never 0), or
  against each token's own position (``null_pool="position"``, a Student-t predictive
  p-value of the observed log attention given that position's ``B`` null values);
- ``π0`` = 1 by default (Benjamini–Hochberg ``q⁺``; the tokens of one map are positively
  dependent, which defeats data-driven π0 estimates on noise input; Storey's estimators stay
  available), ``q⁺`` Storey's q-values with that π0;
- ``lfdr⁺ = min(1, π0 / ĝ(p⁺))`` with ``ĝ`` the Grenander (least concave majorant) density
  of the ``p⁺`` values, which is non-increasing, so ``posterior⁺ = 1 − lfdr⁺`` never falls
  as attention rises.

Example
-------
>>> import torch
>>> g = torch.Generator().manual_seed(0)
>>> null = torch.rand(50, 64, generator=g) + 0.1
>>> obs = torch.rand(64, generator=g) + 0.1
>>> s = directional_statistics(obs, null)
>>> bool((s.lfdr >= 0).all() and (s.lfdr <= 1).all())
True
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import isotonic_regression
from scipy.stats import t as student_t

from napari_attnreg.core.stats.choices import NULL_POOLS
from napari_attnreg.core.stats.paper import (
    TokenStatistics,
    as_positive_tensor,
    compute_dtype,
    estimate_pi0,
    pvalues_from_sorted,
    qvalues,
    sorted_pool,
    summarize_null,
    z_scores,
)


def pooled_pvalues(z_obs: torch.Tensor, sorted_null: torch.Tensor) -> np.ndarray:
    """``p⁺[t] = (1 + #{z_null ≥ z_obs[t]}) / (1 + B·T)`` from the sorted pooled null."""
    return pvalues_from_sorted(z_obs, sorted_null, "null", "greater")


def position_pvalues(observed: torch.Tensor, null_scores: torch.Tensor,
                     positions: np.ndarray | None = None) -> np.ndarray:
    """Predictive p-value of each token against the ``B`` nulls at its own position.

    With ``m_t``, ``s_t`` the mean and std (ddof 1) of ``log null_scores[:, t]``,
    ``p⁺[t] = 1 − F_{B−1}((log observed[t] − m_t) / (s_t·sqrt(1 + 1/B)))``, ``F`` the
    Student t CDF: the probability that a new null draw at that position exceeds it.

    Parameters
    ----------
    observed : tensor ``(T,)``
    null_scores : tensor ``(B, T)``, ``B ≥ 3``
    positions : array of int, optional
        Null column of each observed token (tiled images); default: token ``t`` ↔ column ``t``.

    Returns
    -------
    np.ndarray ``(T,)`` float64 in [0, 1].
    """
    null_scores = as_positive_tensor(null_scores, "null_scores")
    observed = as_positive_tensor(observed, "observed")
    n_boot = int(null_scores.shape[0])
    if n_boot < 3:
        raise ValueError(f"null_pool='position' needs at least 3 null images per position, got "
                         f"B = {n_boot}; raise n_boot (100 or more is advisable).")
    dtype = compute_dtype(null_scores.device)
    log_null = null_scores.reshape(n_boot, -1).to(dtype=dtype, copy=True).log_()  # one copy
    log_obs = torch.log(observed.reshape(-1).to(device=null_scores.device, dtype=dtype))
    m = log_null.mean(0)
    s = log_null.std(0, correction=1)
    if positions is not None:
        index = torch.as_tensor(np.asarray(positions), dtype=torch.long, device=m.device)
        m, s = m[index], s[index]
    if bool((s <= 1e-12 * m.abs().clamp_min(1.0)).any()):
        bad = int((s <= 1e-12 * m.abs().clamp_min(1.0)).sum())
        raise ValueError(f"{bad} token position(s) have the same null attention in every null image, "
                         "so the position null cannot be formed; use null_pool='pooled'.")
    stat = ((log_obs - m) / (s * math.sqrt(1.0 + 1.0 / n_boot))).cpu().numpy().astype(np.float64)
    return np.clip(student_t.sf(stat, df=n_boot - 1), 0.0, 1.0)


def grenander_density(p: np.ndarray) -> np.ndarray:
    """Grenander estimate of the density of ``p`` on [0, 1], evaluated at each ``p``.

    The left derivative of the least concave majorant of the empirical CDF (the majorant
    starts at the origin; at a knot the slope of the segment ending there). The slopes of
    that majorant are the antitonic regression of the ECDF's raw slopes weighted by the gap
    lengths, which scipy's pool-adjacent-violators computes in linear time.

    Returns
    -------
    np.ndarray, the shape of ``p``: non-increasing in ``p``; ``inf`` where ``p == 0`` (an
    atom at zero).
    """
    p = np.asarray(p, dtype=np.float64)
    flat = p.reshape(-1)
    if flat.size == 0 or not np.all((flat >= 0) & (flat <= 1)):
        raise ValueError("p must be a non-empty array of p-values in [0, 1].")
    values, counts = np.unique(flat, return_counts=True)
    ecdf = np.cumsum(counts) / flat.size
    density_at = np.empty(values.size)
    start = 0
    if values[0] == 0.0:  # the majorant jumps at 0: infinite left slope there
        density_at[0] = np.inf
        start = 1
    if start < values.size:
        x = np.concatenate(([0.0], values[start:]))
        f = np.concatenate(([ecdf[start - 1] if start else 0.0], ecdf[start:]))
        gaps = np.diff(x)
        slopes = np.diff(f) / gaps
        density_at[start:] = isotonic_regression(slopes, weights=gaps, increasing=False).x
    return density_at[np.searchsorted(values, flat)].reshape(p.shape)


def directional_lfdr(p: np.ndarray, pi0: float) -> np.ndarray:
    """``lfdr⁺ = min(1, π0 / ĝ(p⁺))`` with ``ĝ`` the :func:`grenander_density` of ``p``."""
    if not 0.0 <= pi0 <= 1.0:
        raise ValueError(f"pi0 must lie in [0, 1], got {pi0}.")
    g = grenander_density(p)
    with np.errstate(divide="ignore", invalid="ignore"):
        lfdr = np.where(g > 0, pi0 / g, 1.0)
    return np.clip(lfdr, 0.0, 1.0)


def directional_statistics(
    observed: torch.Tensor,
    null_scores: torch.Tensor,
    *,
    null_pool: str = "pooled",
    pi0_method: str | float = "bh",
    positions: np.ndarray | None = None,
) -> TokenStatistics:
    """Every directional token statistic of one image.

    Parameters
    ----------
    observed : tensor ``(T,)``
        Observed CLS attention of the patch tokens (strictly positive).
    null_scores : tensor ``(B, T)``
        Attention of the ``B`` null images; the pooled work runs on its device.
    null_pool : {"pooled", "position"}
        Compare each token with every null token (pooled) or with its own position.
    pi0_method : str or float
        See :func:`~napari_attnreg.core.stats.paper.estimate_pi0`; 1 (Benjamini–Hochberg) by default.
    positions : array of int, optional
        Null column of each observed token when the observed tokens are not the null's
        columns (a tiled image against a pool of null tiles).

    Returns
    -------
    TokenStatistics
        ``p``, ``q``, ``lfdr``, ``posterior`` hold ``p⁺``, ``q⁺``, ``lfdr⁺``, ``posterior⁺``;
        ``z`` is the pooled log-scale z-score (for display and the optional z mask).
    """
    if null_pool not in NULL_POOLS:
        raise ValueError(f"null_pool={null_pool!r} is not supported; use one of {NULL_POOLS}.")
    # the position p-values first: their float64 copy of the pool is freed before z's
    p = position_pvalues(observed, null_scores, positions) if null_pool == "position" else None
    z_obs, z_null, mu0, sigma0 = z_scores(observed, null_scores, positions=positions)
    sorted_null, columns = sorted_pool(z_null)
    del z_null  # the same storage, now sorted
    if p is None:
        p = pooled_pvalues(z_obs, sorted_null)
    pi0 = estimate_pi0(p, pi0_method)
    lfdr = directional_lfdr(p, pi0)
    summary = summarize_null(columns, sorted_null)
    summary.update(lfdr_fit="grenander", empirical_null=None, null_pool=null_pool)
    return TokenStatistics(
        z=z_obs.cpu().numpy().astype(np.float64),
        p=p,
        pi0=pi0,
        lfdr=lfdr,
        posterior=1.0 - lfdr,
        q=qvalues(p, pi0),
        mu0=mu0,
        sigma0=sigma0,
        null_summary=summary,
    )
