"""Token-level bootstrap statistics of attention maps (the paper's z, p, π0 and local fdr; docs/method.md).

Everything here works on the ``T`` patch tokens of one image. The heavy part
(log of the ``B·T`` null scores, pooled moments, sorting the null pool and
ranking the observed tokens in it) runs in torch on the device of the null
scores; the small fits on ``T`` numbers (π0, Lindsey's density estimate,
Efron's empirical null, q-values) run in numpy/scipy/statsmodels.

Computing at token level rather than on the upsampled pixel grid is exact for
z, p, the reference and smoother π0 and the Lindsey local fdr (see docs/method.md;
``tests/reference_impl.py`` checks it). Two options are per-token by
construction and deliberately *not* pixel-replicated: the ``+1`` of
``p_method="null"`` and the variance term of ``pi0_method="bootstrap"``, since
the token, not the pixel, is the unit of inference.

Example
-------
>>> import torch
>>> g = torch.Generator().manual_seed(0)
>>> null = torch.rand(50, 64, generator=g) + 0.1
>>> obs = torch.rand(64, generator=g) + 0.1
>>> stats = compute_statistics(obs, null)
>>> stats.p.shape, 0.0 <= stats.pi0 <= 1.0
((64,), True)
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.interpolate import make_smoothing_spline
from scipy.optimize import brentq
from statsmodels.stats import multitest as _smt
from statsmodels.tools.sm_exceptions import ModelWarning

# local_fdr imports the GLM module lazily, and that first import installs
# statsmodels' "always" warning filters, which would override our own
# warning handling during the first fit; importing it up front avoids that.
import statsmodels.genmod.generalized_linear_model  # noqa: F401  isort: skip
from napari_attnreg.core.stats.choices import ALTERNATIVES, NULL_MODELS, P_METHODS, PI0_METHODS

#: Storey's λ grid used by the smoother and bootstrap π0 estimators (R qvalue default).
PI0_LAMBDAS = np.round(np.arange(0.05, 0.951, 0.05), 2)
#: The reference implementation's π0 cut: π0 = #{p > 0.89} / (0.11·T).
REFERENCE_PI0_CUT = 0.89
#: Storey's (2002) single λ: π0 = #{p > 0.5} / (0.5·T).
STOREY_LAMBDA = 0.5
#: Degrees of freedom of Storey's cubic smoothing spline over the λ grid.
SMOOTHER_DF = 3.0
#: Number of histogram bins and quantile levels kept in ``null_summary``.
SUMMARY_BINS = 100
SUMMARY_QUANTILES = 201


class StatisticsWarning(UserWarning):
    """A statistic was computed by a fallback or from degenerate input."""


@dataclass(frozen=True)
class TokenStatistics:
    """Per-token statistics of one image (all arrays float64, shape ``(T,)``).

    Attributes
    ----------
    z, p, lfdr, posterior, q : np.ndarray
        Observed z-score, empirical p-value, local fdr, ``1 - lfdr`` and
        Storey q-value of every patch token.
    pi0 : float
        Estimated proportion of null tokens.
    mu0, sigma0 : float
        Mean and population std of the pooled log null scores.
    null_summary : dict
        Small numpy summary of the null: per-token ``z_null_mean`` and
        ``z_null_std``, pooled ``quantile_levels``/``z_null_quantiles``
        (201 levels), ``hist_counts``/``hist_edges`` of the pooled z_null,
        ``B``, ``T``, which ``lfdr_fit`` was used and the fitted
        ``empirical_null`` ``(mean, sd)`` (or ``None``).
    """

    z: np.ndarray
    p: np.ndarray
    pi0: float
    lfdr: np.ndarray
    posterior: np.ndarray
    q: np.ndarray
    mu0: float
    sigma0: float
    null_summary: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- z


def compute_dtype(device: torch.device | str) -> torch.dtype:
    """float64 wherever the device has it; MPS has no float64, so float32 there."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def as_positive_tensor(x: torch.Tensor | np.ndarray, name: str) -> torch.Tensor:
    x = torch.as_tensor(x)
    if not (x.is_floating_point() or x.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"{name} must be a real-valued array of attention scores, got {x.dtype}.")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty; pass at least one attention score.")
    # min and max answer every check without a mask the size of the null pool (NaN
    # propagates through both, and -inf / +inf show up as the min / max)
    low, high = (float(v) for v in torch.aminmax(x))
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"{name} contains NaN or inf; attention scores must be finite.")
    if low < 0:
        raise ValueError(f"{name} contains negative values; pass softmax attention scores (>= 0).")
    if low == 0:
        # A float32 softmax can underflow to exactly 0 for very peaked attention; the
        # smallest positive float32 keeps the ranks and avoids log(0) = -inf.
        warnings.warn(
            f"{name} contains exact zeros (softmax underflow); they are replaced by the "
            "smallest positive float32 before taking logs.",
            StatisticsWarning,
            stacklevel=3,
        )
        x = x.clamp_min(torch.finfo(torch.float32).tiny)
    return x


def z_scores(
    observed: torch.Tensor | np.ndarray,
    null_scores: torch.Tensor | np.ndarray,
    *,
    positions: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """Log-scale z-scores of observed and null attention against the pooled null (docs/method.md).

    Parameters
    ----------
    observed : tensor, shape ``(T,)`` or any shape ``S``
        Observed attention, strictly positive.
    null_scores : tensor, shape ``(B, T)`` or ``(B, *S)``
        Null attention maps; their device is where the work runs.
    positions : array of int, optional
        For ``N`` observed tokens that are not the null's ``T`` columns (a tiled image
        against a pool of null tiles): the null column of each observed token. Only
        checked here; position-wise statistics use it.

    Returns
    -------
    z_obs : tensor ``(T,)``, z_null : tensor ``(B, T)``, mu0 : float, sigma0 : float
        In :func:`compute_dtype` on the device of ``null_scores``; ``mu0`` and
        ``sigma0`` are the mean and population std (ddof 0) of ``log null_scores``.
    """
    null_scores = as_positive_tensor(null_scores, "null_scores")
    observed = as_positive_tensor(observed, "observed")
    if null_scores.ndim < 2:
        raise ValueError(
            f"null_scores must have shape (B, T) with one row per null image, got "
            f"{tuple(null_scores.shape)}."
        )
    if positions is not None:
        _check_positions(positions, observed.numel(), null_scores[0].numel())
    elif tuple(observed.shape) not in (tuple(null_scores.shape[1:]), (null_scores[0].numel(),)):
        raise ValueError(
            f"observed has shape {tuple(observed.shape)} but null_scores has "
            f"{tuple(null_scores.shape)}; pass observed (T,) and null_scores (B, T) "
            "for the same tokens."
        )
    device = null_scores.device
    dtype = compute_dtype(device)
    # One float64 copy of the pool, transformed in place (the same elementwise operations
    # as log(x) then (v - mu0) / sigma0, so the same values): the pool is the largest
    # thing in memory, and each out-of-place step would hold another copy of it.
    z_null = null_scores.reshape(null_scores.shape[0], -1).to(dtype=dtype, copy=True).log_()
    log_obs = torch.log(observed.reshape(-1).to(device=device, dtype=dtype))
    mu0 = float(z_null.mean())
    sigma0 = float(z_null.std(correction=0))
    # Identical null scores give a std of a few ulps rather than exactly 0.
    if not sigma0 > 1e-12 * max(1.0, abs(mu0)):
        raise ValueError(
            "The null attention scores are all equal (sigma0 == 0), so no z-score can be "
            "formed; use more bootstrap images (B) or a null generator that varies the image."
        )
    return (log_obs - mu0) / sigma0, z_null.sub_(mu0).div_(sigma0), mu0, sigma0


def _check_positions(positions: np.ndarray, n_observed: int, n_columns: int) -> None:
    positions = np.asarray(positions)
    if positions.shape != (n_observed,) or positions.dtype.kind not in "iu":
        raise ValueError(f"positions must be {n_observed} integer null-column indices (one per "
                         f"observed token), got shape {positions.shape} of {positions.dtype}.")
    if n_observed and (positions.min() < 0 or positions.max() >= n_columns):
        raise ValueError(f"positions must index the {n_columns} null columns, got values in "
                         f"[{positions.min()}, {positions.max()}].")


# --------------------------------------------------------------------------- p


def _check_choice(value: str, allowed: tuple[str, ...], name: str) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; use one of {allowed}.")


def _count(sorted_values: torch.Tensor, query: torch.Tensor, *, right: bool) -> torch.Tensor:
    return torch.searchsorted(sorted_values, query, right=right)


def _abs_le(sorted_values: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """#{|v| <= a} from the *signed* sorted values (|v| <= a  <=>  -a <= v <= a)."""
    return _count(sorted_values, a, right=True) - _count(sorted_values, -a, right=False)


def _abs_lt(sorted_values: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """#{|v| < a}; clamped because the open interval (-0, 0) is empty."""
    return (_count(sorted_values, a, right=False) - _count(sorted_values, -a, right=True)).clamp_min(0)


def pvalues_from_sorted(
    z_obs: torch.Tensor, sorted_null: torch.Tensor, p_method: str, alternative: str
) -> np.ndarray:
    n_null = sorted_null.numel()
    if p_method == "pooled":
        sorted_obs = torch.sort(z_obs).values
        m0 = n_null + z_obs.numel()
        if alternative == "two-sided":
            a = z_obs.abs()
            n_le = _abs_le(sorted_null, a) + _abs_le(sorted_obs, a)
        else:
            n_le = _count(sorted_null, z_obs, right=True) + _count(sorted_obs, z_obs, right=True)
        # (m0 - n)/m0 is the correctly rounded value of 1 - n/m0 (ties count as <=).
        p = (m0 - n_le).to(z_obs.dtype) / m0
    else:
        if alternative == "two-sided":
            n_ge = n_null - _abs_lt(sorted_null, z_obs.abs())
        else:
            n_ge = n_null - _count(sorted_null, z_obs, right=False)
        p = (1 + n_ge).to(z_obs.dtype) / (1 + n_null)
    return np.clip(p.cpu().numpy().astype(np.float64), 0.0, 1.0)


def empirical_pvalues(
    z_obs: torch.Tensor | np.ndarray,
    z_null: torch.Tensor | np.ndarray,
    *,
    p_method: str = "pooled",
    alternative: str = "two-sided",
) -> np.ndarray:
    """Empirical p-values of the observed tokens against the bootstrap null (docs/method.md).

    Parameters
    ----------
    z_obs : tensor ``(T,)``
        Observed z-scores.
    z_null : tensor ``(B, T)``
        Null z-scores (any shape; all values are pooled).
    p_method : {"pooled", "null"}
        ``"pooled"`` (paper): ``p = 1 - #{v in |z_obs| ∪ |z_null| : v <= |z_obs[t]|} / (T + B·T)``,
        the largest token gets 0. ``"null"``: ``(1 + #{|z_null| >= |z_obs[t]|}) / (1 + B·T)``.
    alternative : {"two-sided", "greater"}
        Rank ``|z|`` (paper) or ``z`` (only attention above the null counts).

    Returns
    -------
    np.ndarray ``(T,)`` float64 in [0, 1].
    """
    _check_choice(p_method, P_METHODS, "p_method")
    _check_choice(alternative, ALTERNATIVES, "alternative")
    z_null = torch.as_tensor(z_null)
    z_obs = torch.as_tensor(z_obs).to(device=z_null.device, dtype=z_null.dtype).reshape(-1)
    sorted_null = torch.sort(z_null.reshape(-1)).values
    return pvalues_from_sorted(z_obs, sorted_null, p_method, alternative)


# --------------------------------------------------------------------------- π0


def _pi0_lambda(p: np.ndarray, lambdas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Storey's π0(λ) = #{p >= λ} / (m (1 - λ)) and the counts W(λ) = #{p >= λ}."""
    m = p.size
    counts = np.array([np.count_nonzero(p >= lam) for lam in lambdas], dtype=np.float64)
    return counts / (m * (1.0 - lambdas)), counts


@functools.lru_cache(maxsize=8)
def _smoother_lam(lambdas: tuple[float, ...], df: float) -> float:
    """Penalty of the cubic smoothing spline whose smoother matrix has trace ``df``.

    The smoother matrix depends only on the abscissae, so the penalty is found
    once per λ grid (by root finding on log10 of the penalty) and cached.
    """
    x = np.asarray(lambdas)
    eye = np.eye(x.size)

    def excess_df(log_lam: float) -> float:
        return float(np.trace(make_smoothing_spline(x, eye, lam=10.0**log_lam)(x))) - df

    # trace(S) falls monotonically from n (interpolation) to 2 (straight line).
    lo, hi = -12.0, 8.0
    if not excess_df(lo) > 0 > excess_df(hi):
        raise ValueError(f"Cannot reach {df} degrees of freedom on {x.size} λ values.")
    return 10.0 ** brentq(excess_df, lo, hi, xtol=1e-13, rtol=1e-13)


def _pi0_smoother(p: np.ndarray, lambdas: np.ndarray = PI0_LAMBDAS) -> float:
    pi0_lam, _ = _pi0_lambda(p, lambdas)
    lam = _smoother_lam(tuple(float(v) for v in lambdas), SMOOTHER_DF)
    fitted = make_smoothing_spline(lambdas, pi0_lam, lam=lam)(lambdas)
    return float(fitted[-1])


def _pi0_bootstrap(p: np.ndarray, lambdas: np.ndarray = PI0_LAMBDAS) -> float:
    # Closed form of Storey, Taylor & Siegmund (2004) as in R qvalue::pi0est:
    # binomial variance of π0(λ) plus squared bias against its 10% quantile.
    pi0_lam, counts = _pi0_lambda(p, lambdas)
    m = p.size
    min_pi0 = np.quantile(pi0_lam, 0.1)
    mse = (counts / (m**2 * (1.0 - lambdas) ** 2)) * (1.0 - counts / m) + (pi0_lam - min_pi0) ** 2
    return float(np.min(pi0_lam[mse == mse.min()]))


def estimate_pi0(p: np.ndarray, method: str | float = "reference") -> float:
    """Proportion of null tokens π0 (docs/method.md).

    Parameters
    ----------
    p : array ``(T,)``
        p-values in [0, 1].
    method : {"reference", "bh", "storey", "smoother", "bootstrap"} or float
        ``"reference"`` (paper): ``min(1, #{p > 0.89} / (0.11 T))``; ``"bh"`` (directional
        default): 1, so q-values are Benjamini–Hochberg's, which stay valid when the tokens
        of one map are positively dependent; ``"storey"``: Storey (2002) at λ = 0.5,
        ``#{p > 0.5} / (0.5 T)``;
        ``"smoother"``: Storey's cubic smoothing spline with 3 df through
        π0(λ), λ = 0.05..0.95, read at λ = 0.95; ``"bootstrap"``: Storey,
        Taylor & Siegmund (2004) MSE-optimal λ (R ``qvalue::pi0est``
        closed form); a float in [0, 1] is used as is.

    Returns
    -------
    float in [0, 1]. Estimates outside are clipped with a :class:`StatisticsWarning`.
    """
    if isinstance(method, (int, float)) and not isinstance(method, bool):
        value = float(method)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"A fixed pi0 must lie in [0, 1], got {value}.")
        return value
    if not isinstance(method, str):
        raise ValueError(
            f"pi0_method must be one of {PI0_METHODS} or a float, got {method!r}."
        )
    _check_choice(method, PI0_METHODS, "pi0_method")
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    if p.size == 0 or not np.all((p >= 0) & (p <= 1)):
        raise ValueError("p must be a non-empty array of p-values in [0, 1].")
    if method == "bh":
        return 1.0
    if method == "reference":
        pi0 = np.count_nonzero(p > REFERENCE_PI0_CUT) / ((1.0 - REFERENCE_PI0_CUT) * p.size)
    elif method == "storey":
        pi0 = np.count_nonzero(p > STOREY_LAMBDA) / ((1.0 - STOREY_LAMBDA) * p.size)
    elif method == "smoother":
        pi0 = _pi0_smoother(p)
    else:
        pi0 = _pi0_bootstrap(p)
    if pi0 <= 0.0:
        warnings.warn(
            f"pi0 ({method}) estimated as {pi0:.3g} <= 0: too few large p-values, so every "
            "token is treated as non-null (lfdr = 0). Consider another pi0_method or a fixed pi0.",
            StatisticsWarning,
            stacklevel=2,
        )
    return float(min(1.0, max(0.0, pi0)))


# --------------------------------------------------------------------------- lfdr


def _lindsey_lfdr(z: np.ndarray, pi0: float, null_pdf, deg: int) -> np.ndarray:
    with warnings.catch_warnings(record=True) as caught:
        # The Poisson GLM's overflow chatter is judged by the finiteness of the
        # result (a bad fit triggers an explicit fallback); its model warnings
        # (separation, convergence) are summarised below in one line.
        warnings.simplefilter("always")
        lfdr = _smt.local_fdr(z, null_proportion=pi0, null_pdf=null_pdf, deg=deg)
    lfdr = np.asarray(lfdr, dtype=np.float64)
    if lfdr.shape != z.shape or not np.all(np.isfinite(lfdr)):
        raise FloatingPointError("non-finite local fdr")
    model_warnings = {str(w.message) for w in caught if issubclass(w.category, ModelWarning)}
    if model_warnings:
        warnings.warn(
            f"The Lindsey fit of the z density (degree {deg}, {z.size} tokens) is poorly "
            f"determined ({'; '.join(sorted(model_warnings))}); the local fdr may be unreliable.",
            StatisticsWarning,
            stacklevel=4,
        )
    return lfdr


def _gaussian_lfdr(z: np.ndarray, pi0: float, null_pdf) -> np.ndarray:
    # Marginal density approximated by a normal with the sample mean/std of z.
    sd = float(np.std(z))
    if not sd > 0:
        raise FloatingPointError("constant z")
    fz = np.exp(-0.5 * ((z - z.mean()) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        lfdr = pi0 * null_pdf(z) / fz
    lfdr = np.where(np.isnan(lfdr), 1.0, lfdr)
    return np.clip(lfdr, 0.0, 1.0)


def _standard_normal_pdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)


def _fit_empirical_null(z: np.ndarray) -> tuple[float, float] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = _smt.NullDistribution(z)
    except (RuntimeError, ValueError, FloatingPointError) as err:
        reason = str(err)
    else:
        if math.isfinite(fit.mean) and math.isfinite(fit.sd) and fit.sd > 0:
            return float(fit.mean), float(fit.sd)
        reason = f"fit gave mean={fit.mean}, sd={fit.sd}"
    warnings.warn(
        f"Empirical null could not be fitted ({reason}); using the theoretical N(0, 1) null.",
        StatisticsWarning,
        stacklevel=3,
    )
    return None


def _local_fdr_details(
    z: np.ndarray, pi0: float, null: str
) -> tuple[np.ndarray, str, tuple[float, float] | None]:
    _check_choice(null, NULL_MODELS, "null")
    z = np.asarray(z, dtype=np.float64).reshape(-1)
    if z.size == 0 or not np.all(np.isfinite(z)):
        raise ValueError("z must be a non-empty array of finite z-scores.")
    if not 0.0 <= pi0 <= 1.0:
        raise ValueError(f"pi0 must lie in [0, 1], got {pi0}.")

    empirical = _fit_empirical_null(z) if null == "empirical" else None
    if empirical is None:
        null_pdf = _standard_normal_pdf
    else:
        mean, sd = empirical

        def null_pdf(x: np.ndarray) -> np.ndarray:
            return _standard_normal_pdf((x - mean) / sd) / sd

    if np.ptp(z) == 0:
        # Lindsey's bins need a range; with one distinct z there is no evidence
        # beyond the prior, so lfdr = P(null) = π0.
        warnings.warn(
            "All observed z-scores are equal; local fdr set to pi0 (no evidence either way).",
            StatisticsWarning,
            stacklevel=3,
        )
        return np.full(z.shape, pi0), "constant", empirical

    fits = (
        ("lindsey-deg7", lambda: _lindsey_lfdr(z, pi0, null_pdf, 7)),
        ("lindsey-deg2", lambda: _lindsey_lfdr(z, pi0, null_pdf, 2)),
        ("gaussian", lambda: _gaussian_lfdr(z, pi0, null_pdf)),
    )
    failures = []
    for name, fit in fits:
        try:
            lfdr = fit()
        except (FloatingPointError, ValueError, np.linalg.LinAlgError, OverflowError) as err:
            failures.append(f"{name}: {err or type(err).__name__}")
            continue
        if failures:
            warnings.warn(
                f"Lindsey fit of the z density failed ({'; '.join(failures)}); local fdr "
                f"computed with the {name} fallback.",
                StatisticsWarning,
                stacklevel=3,
            )
        return np.clip(lfdr, 0.0, 1.0), name, empirical
    warnings.warn(
        f"Every local fdr fit failed ({'; '.join(failures)}); local fdr set to pi0.",
        StatisticsWarning,
        stacklevel=3,
    )
    return np.full(z.shape, pi0), "constant", empirical


def local_fdr(z: np.ndarray, pi0: float, *, null: str = "theoretical") -> np.ndarray:
    """Efron's local false discovery rate of the observed z-scores (docs/method.md).

    Parameters
    ----------
    z : array ``(T,)``
        Observed z-scores.
    pi0 : float
        Proportion of null tokens.
    null : {"theoretical", "empirical"}
        N(0, 1) null (paper), or Efron's empirical null N(δ0, σ0²) fitted to the
        centre of ``z`` (statsmodels ``NullDistribution``).

    Returns
    -------
    np.ndarray ``(T,)`` in [0, 1]: ``statsmodels.stats.multitest.local_fdr(z,
    null_proportion=pi0)`` (Lindsey's method, 29 bins, degree 7). If that fit
    fails, a degree-2 fit, then a Gaussian marginal, then the constant π0 are
    used, each announced by a :class:`StatisticsWarning`. The two-group model
    is on z itself, so the lfdr does not depend on the p-value ``alternative``:
    tokens far *below* the null also get a small lfdr, and the z mask of the
    regularized maps (:mod:`.regularize`) is what removes them.
    """
    return _local_fdr_details(z, float(pi0), null)[0]


# --------------------------------------------------------------------------- q


def qvalues(p: np.ndarray, pi0: float) -> np.ndarray:
    """Storey q-values ``π0 · min_{j >= i} T p_(j) / j`` (R ``qvalue``), in [0, 1].

    Tied p-values share the q-value of the largest rank in the tie.
    """
    p = np.asarray(p, dtype=np.float64)
    flat = p.reshape(-1)
    m = flat.size
    if m == 0:
        return p.copy()
    order = np.argsort(flat, kind="stable")[::-1]  # decreasing p, rank i = m..1
    ranks = np.arange(m, 0, -1, dtype=np.float64)
    q_sorted = np.minimum.accumulate(flat[order] * m / ranks)
    q = np.empty(m)
    q[order] = pi0 * np.minimum(1.0, q_sorted)
    return np.clip(q, 0.0, 1.0).reshape(p.shape)


# --------------------------------------------------------------------------- all


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.cpu().numpy().astype(np.float64)


def sorted_pool(z_null: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The pooled null sorted, *in place* on the CPU, and its per-token summaries.

    ``z_null`` is consumed: its per-token mean and std are taken first, then its storage is
    sorted (numpy's in-place sort needs no index array, unlike ``torch.sort``, which would
    hold two more copies of the pool). Other devices sort out of place.

    Returns
    -------
    sorted_null : tensor ``(B·T,)``, columns : dict
        ``columns`` is the per-token part of :func:`summarize_null`.
    """
    columns = {
        "B": int(z_null.shape[0]),
        "T": int(z_null.shape[1]),
        "z_null_mean": _to_numpy(z_null.mean(0)),
        "z_null_std": _to_numpy(z_null.std(0, correction=0)),
    }
    flat = z_null.reshape(-1)
    if flat.device.type == "cpu" and flat.is_contiguous():
        flat.numpy().sort()
        return flat, columns
    return torch.sort(flat).values, columns


def summarize_null(columns: dict, sorted_null: torch.Tensor) -> dict:
    n = sorted_null.numel()
    levels = torch.linspace(0.0, 1.0, SUMMARY_QUANTILES, dtype=sorted_null.dtype,
                            device=sorted_null.device)
    pos = levels * (n - 1)
    lo = pos.floor().long().clamp(0, n - 1)
    hi = pos.ceil().long().clamp(0, n - 1)
    quantiles = sorted_null[lo] + (sorted_null[hi] - sorted_null[lo]) * (pos - lo)
    edges = torch.linspace(float(sorted_null[0]), float(sorted_null[-1]), SUMMARY_BINS + 1,
                           dtype=sorted_null.dtype, device=sorted_null.device)
    # np.histogram convention: half-open bins, the last one closed.
    cum = _count(sorted_null, edges, right=False)
    cum[-1] = n
    counts = torch.diff(cum)
    return {
        **columns,
        "quantile_levels": _to_numpy(levels),
        "z_null_quantiles": _to_numpy(quantiles),
        "hist_counts": counts.cpu().numpy().astype(np.int64),
        "hist_edges": _to_numpy(edges),
    }


def compute_statistics(
    observed: torch.Tensor,
    null_scores: torch.Tensor,
    *,
    p_method: str = "pooled",
    alternative: str = "two-sided",
    pi0_method: str | float = "reference",
    null: str = "theoretical",
    positions: np.ndarray | None = None,
) -> TokenStatistics:
    """All token statistics of the paper's procedure for one image.

    Parameters
    ----------
    observed : tensor ``(T,)``
        Observed CLS attention of the patch tokens (strictly positive).
    null_scores : tensor ``(B, T)``
        Attention of the ``B`` bootstrap null images; the work runs on its device.
    p_method, alternative, pi0_method, null
        See :func:`empirical_pvalues`, :func:`estimate_pi0`, :func:`local_fdr`.
        Defaults reproduce the paper.
    positions : array of int, optional
        Null column of each observed token when the observed tokens are not the null's
        columns (tiled images, see :func:`z_scores`); every statistic here is pooled.

    Returns
    -------
    TokenStatistics
    """
    _check_choice(p_method, P_METHODS, "p_method")
    _check_choice(alternative, ALTERNATIVES, "alternative")
    _check_choice(null, NULL_MODELS, "null")
    if isinstance(pi0_method, str):
        _check_choice(pi0_method, PI0_METHODS, "pi0_method")

    z_obs, z_null, mu0, sigma0 = z_scores(observed, null_scores, positions=positions)
    # One sort of the signed null pool serves both alternatives and the summary.
    sorted_null, columns = sorted_pool(z_null)
    del z_null  # the same storage, now sorted
    p = pvalues_from_sorted(z_obs, sorted_null, p_method, alternative)
    z = z_obs.cpu().numpy().astype(np.float64)

    pi0 = estimate_pi0(p, pi0_method)
    lfdr, lfdr_fit, empirical = _local_fdr_details(z, pi0, null)
    summary = summarize_null(columns, sorted_null)
    summary["lfdr_fit"] = lfdr_fit
    summary["empirical_null"] = empirical
    return TokenStatistics(
        z=z,
        p=p,
        pi0=pi0,
        lfdr=lfdr,
        posterior=np.clip(1.0 - lfdr, 0.0, 1.0),
        q=qvalues(p, pi0),
        mu0=mu0,
        sigma0=sigma0,
        null_summary=summary,
    )
