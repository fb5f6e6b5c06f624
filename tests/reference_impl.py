"""Slow, literal, pixel-level reference of the paper's statistics (docs/method.md; tests only).

Written independently of ``napari_attnreg.core.stats.paper``: numpy loops and
``np.sum`` counting instead of sorting/searchsorted, the reference
implementation's order of work (upsample every token map to pixels by a
nearest factor ``s`` *first*, then compute), Green & Silverman's Reinsch form
of the cubic smoothing spline instead of scipy's B-spline solver, and the
q-value definition written out as a double minimum. Only statsmodels'
``local_fdr``/``NullDistribution`` are shared with the package, because
The method defines the lfdr as exactly that call.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq
from statsmodels.stats.multitest import NullDistribution, local_fdr

LAMBDAS = np.array([k / 20 for k in range(1, 20)])  # 0.05, 0.10, ..., 0.95


def upsample(token_map: np.ndarray, s: int) -> np.ndarray:
    """Nearest upsampling of the last two axes by an integer factor ``s``."""
    return np.repeat(np.repeat(token_map, s, axis=-2), s, axis=-1)


def z_scores(obs_px: np.ndarray, null_px: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    log_null = np.log(null_px.astype(np.float64))
    mu0 = float(np.mean(log_null))
    sigma0 = float(np.sqrt(np.mean((log_null - mu0) ** 2)))
    return (np.log(obs_px.astype(np.float64)) - mu0) / sigma0, (log_null - mu0) / sigma0, mu0, sigma0


def pvalues(z_obs: np.ndarray, z_null: np.ndarray, p_method: str, alternative: str) -> np.ndarray:
    """The pooled empirical p-value, one observed value at a time."""
    f = np.abs if alternative == "two-sided" else (lambda v: v)
    obs = f(z_obs.ravel())
    nul = f(z_null.ravel())
    p = np.empty(obs.size)
    if p_method == "pooled":
        pool = np.concatenate([obs, nul])
        m0 = pool.size
        for i, v in enumerate(obs):
            p[i] = 1.0 - np.sum(pool <= v) / m0
    else:
        for i, v in enumerate(obs):
            p[i] = (1.0 + np.sum(nul >= v)) / (1.0 + nul.size)
    return p


def pi0_lambda(p: np.ndarray) -> np.ndarray:
    return np.array([np.sum(p >= lam) / (p.size * (1.0 - lam)) for lam in LAMBDAS])


def pi0_reference(p: np.ndarray) -> float:
    return min(1.0, np.sum(p > 0.89) / (0.11 * p.size))


def reinsch_smoother(x: np.ndarray, alpha: float) -> np.ndarray:
    """Smoother matrix of the natural cubic smoothing spline (Green & Silverman 1994, §2.3).

    Minimises ``sum (y - g(x))^2 + alpha * int g''^2``; ``g(x) = S y``.
    """
    n = x.size
    h = np.diff(x)
    Q = np.zeros((n, n - 2))
    R = np.zeros((n - 2, n - 2))
    for j in range(1, n - 1):  # interior knots, column j - 1
        Q[j - 1, j - 1] = 1.0 / h[j - 1]
        Q[j, j - 1] = -1.0 / h[j - 1] - 1.0 / h[j]
        Q[j + 1, j - 1] = 1.0 / h[j]
        R[j - 1, j - 1] = (h[j - 1] + h[j]) / 3.0
        if j < n - 2:
            R[j - 1, j] = R[j, j - 1] = h[j] / 6.0
    K = Q @ np.linalg.solve(R, Q.T)
    return np.linalg.inv(np.eye(n) + alpha * K)


def pi0_smoother(p: np.ndarray, df: float = 3.0) -> float:
    log_alpha = brentq(lambda a: np.trace(reinsch_smoother(LAMBDAS, 10.0**a)) - df, -12, 8,
                       xtol=1e-14)
    fitted = reinsch_smoother(LAMBDAS, 10.0**log_alpha) @ pi0_lambda(p)
    return float(min(1.0, max(0.0, fitted[-1])))


def pi0_bootstrap(p: np.ndarray) -> float:
    """R qvalue::pi0est(pi0.method = "bootstrap"), transcribed loop by loop."""
    m = p.size
    pi0 = pi0_lambda(p)
    minpi0 = np.quantile(pi0, 0.1)  # R quantile type 7 == numpy "linear"
    mse = np.empty(LAMBDAS.size)
    for k, lam in enumerate(LAMBDAS):
        W = np.sum(p >= lam)
        mse[k] = (W / (m**2 * (1 - lam) ** 2)) * (1 - W / m) + (pi0[k] - minpi0) ** 2
    best = [pi0[k] for k in range(LAMBDAS.size) if mse[k] == mse.min()]
    return float(min(min(best), 1.0))


def estimate_pi0(p: np.ndarray, method: str | float) -> float:
    if not isinstance(method, str):
        return float(method)
    return {"reference": pi0_reference, "smoother": pi0_smoother, "bootstrap": pi0_bootstrap}[
        method
    ](p)


def lfdr(z: np.ndarray, pi0: float, null: str) -> np.ndarray:
    if null == "theoretical":
        return local_fdr(z, null_proportion=pi0)
    fit = NullDistribution(z)
    return local_fdr(z, null_proportion=pi0, null_pdf=fit.pdf)


def qvalues(p: np.ndarray, pi0: float) -> np.ndarray:
    """q_i = pi0 * min over p_j >= p_i of min(1, m p_j / rank_j), rank_j = #{p_k <= p_j}."""
    m = p.size
    rank = np.array([np.sum(p <= v) for v in p])
    ratio = np.minimum(1.0, p * m / rank)
    return np.array([pi0 * np.min(ratio[p >= v]) for v in p])


def reference_statistics(
    obs_map: np.ndarray,
    null_maps: np.ndarray,
    s: int,
    *,
    p_method: str = "pooled",
    alternative: str = "two-sided",
    pi0_method: str | float = "reference",
    null: str = "theoretical",
) -> dict:
    """z, p, π0, lfdr and posterior on the pixel grid; arrays are flattened pixel maps."""
    obs_px = upsample(np.asarray(obs_map), s)
    null_px = upsample(np.asarray(null_maps), s)
    z_obs, z_null, mu0, sigma0 = z_scores(obs_px.ravel(), null_px.reshape(null_px.shape[0], -1))
    p = pvalues(z_obs, z_null, p_method, alternative)
    pi0 = estimate_pi0(p, pi0_method)
    fdr = lfdr(z_obs, pi0, null)
    return {
        "z": z_obs,
        "p": p,
        "pi0": pi0,
        "lfdr": fdr,
        "posterior": 1.0 - fdr,
        "q": qvalues(p, pi0),
        "mu0": mu0,
        "sigma0": sigma0,
        "pixel_shape": obs_px.shape,
    }
