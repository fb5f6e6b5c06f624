"""Generalized Pareto tail approximation of small step-down p-values (``tail="gpd"``).

With ``B`` null maps a counting p-value cannot go below ``1/(B + 1)``: a tiled image with
hundreds of tiles, or a strict level, needs smaller ones than ``B`` allows. Where fewer
than :data:`MIN_EXCEEDING` null statistics reach the observed one (and ``B ≥ 100``), the
largest ``n = max(10, ⌊B/10⌋)`` null statistics are taken as exceedances of the next one,
``u``, fitted by a generalized Pareto distribution, and ``p = (n / B) · (1 − F_GPD(s − u))``
replaces the count (Knijnenburg et al. 2009; Winkler et al. 2016). The count is kept where
an Anderson–Darling test rejects the fit at 0.05, and no p goes below
``1 / (100·(B + 1))``.

The fit is closed-form: Hosking & Wallis (1987) probability-weighted moments, from the
sample mean and the second L-moment of the exceedances. Every step of every family that
needs a tail is fitted at once, as rows of one tensor on the compute device, and a null
sample shared by several families (the first step of tiles that share one set of null
tiles) is fitted once.

A fitted shape below 0 (a tail with an end point) is replaced by 0, an exponential tail
with the exceedances' mean as its scale: the null step statistics *are* bounded, but an end
point estimated from a few dozen exceedances lies near their largest value, so a pure-noise
tile just past it got the floor p. The exponential tail is heavier, so its p-values err on
the large side. The goodness-of-fit test is of that tail, the one used.

Only the leading steps are approximated (those before the first step that 10 or more null
statistics reach): after that step the step-down adjusted p is at least ``10/(B + 1)``,
which no smaller p of a later step can lower. At most :data:`MAX_TAIL_STEPS` per family:
the first step is the family's (tile's) p-value, and a map whose every patch beats every
null map would otherwise need a fit per patch of every tile; later steps keep their counts,
which only makes ForwardStop stricter.

The Anderson–Darling statistic of an estimated tail has a null distribution that depends on
the true shape and the number of exceedances; ``gpd_ad_critical.json`` tabulates its 95 %
quantile for this very procedure (estimator, then the exponential replacement), simulated by
``scripts/make_gpd_table.py``, and is read at the estimated shape.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.interpolate import RegularGridInterpolator

TAIL_METHODS = ("none", "gpd")
MIN_EXCEEDING = 10
MIN_BOOT = 100
TAIL_FRACTION = 0.1
MIN_EXCEEDANCES = 10
#: Leading steps per family that get a tail fit.
MAX_TAIL_STEPS = 16
_TABLE = Path(__file__).with_name("gpd_ad_critical.json")
#: ``|shape|`` below this is the exponential tail (the limit of the GPD formulas).
_EXPONENTIAL = 1e-9


@dataclass(frozen=True)
class TailFit:
    """What the tail approximation did in one run (kept in the result's metadata).

    Attributes
    ----------
    method : {"none", "gpd"}
    steps : int
        Steps whose p-value comes from a fitted tail.
    rejected : int
        Steps whose fit the Anderson–Darling test rejected, or whose observed value did not
        pass the threshold (their count was kept).
    floored : int
        Steps whose tail p was raised to the floor ``1 / (100·(B + 1))``.
    note : str
        Why nothing was approximated, when that is the case.
    fits : int
        Distinct null samples fitted (a sample shared by several families counts once).
    first_wanted, first_rejected : int
        Families (tiles) whose first step, their p-value, wanted a tail, and those of them
        whose fit was rejected: their p-value stayed the count, no smaller than
        ``1 / (B + 1)``. Where the tiles share one null, that is one fit for all.
    null_maps : int
        The null maps ``B`` the counts come from.
    """

    method: str
    steps: int = 0
    rejected: int = 0
    floored: int = 0
    note: str = ""
    fits: int = 0
    first_wanted: int = 0
    first_rejected: int = 0
    null_maps: int = 0

    @classmethod
    def unused(cls, method: str, note: str = "") -> TailFit:
        return cls(method=method, note=note)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class GPDFits:
    """Tails fitted to ``N`` null samples, one row each (tensors ``(N,)``).

    Attributes
    ----------
    threshold : the largest null value that is not an exceedance, ``u``
    estimated_shape : the probability-weighted-moment shape (the table's key)
    shape, scale : the tail used (shape ≥ 0)
    accepted : bool, the Anderson–Darling test keeps the tail used
    n_exceedances : int
    """

    threshold: torch.Tensor
    estimated_shape: torch.Tensor
    shape: torch.Tensor
    scale: torch.Tensor
    accepted: torch.Tensor
    n_exceedances: int


def tail_size(n_boot: int) -> int:
    """Exceedances per fit: the top tenth of the ``B`` null values, at least 10."""
    return max(MIN_EXCEEDANCES, int(TAIL_FRACTION * n_boot))


def pwm_fit(excess: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hosking–Wallis probability-weighted-moment GPD fit of each row (location 0).

    Parameters
    ----------
    excess : tensor ``(N, n)``
        Exceedances over the threshold, ascending along each row.

    Returns
    -------
    shape, scale : tensors ``(N,)`` in scipy's convention (shape > 0: heavy tail)
        ``shape = 2 − a0/l2``, ``scale = a0·(a0/l2 − 1)`` with ``a0`` the mean and ``l2`` the
        unbiased second L-moment. Rows without spread give NaN.
    """
    n = excess.shape[-1]
    rank = torch.arange(n, dtype=excess.dtype, device=excess.device)
    a0 = excess.mean(-1)
    b1 = (excess * rank).sum(-1) / (n * (n - 1))  # unbiased E[X·F(X)]
    l2 = 2.0 * b1 - a0
    ratio = torch.where(l2 > 0, a0 / l2, torch.full_like(a0, float("nan")))
    return 2.0 - ratio, a0 * (ratio - 1.0)


def used_tail(excess: torch.Tensor, shape: torch.Tensor,
              scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tail used: a negative shape becomes the exponential fitted to the same rows."""
    bounded = shape < 0
    return (torch.where(bounded, torch.zeros_like(shape), shape),
            torch.where(bounded, excess.mean(-1), scale))


def gpd_sf(y: torch.Tensor, shape: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``1 − F(y)`` of GPD(shape ≥ 0, 0, scale), elementwise (broadcasting)."""
    z = y.clamp_min(0.0) / scale
    heavy = shape.abs() > _EXPONENTIAL
    safe = torch.where(heavy, shape, torch.ones_like(shape))
    return torch.where(heavy, torch.exp(-torch.log1p(safe * z) / safe), torch.exp(-z))


def anderson_darling(excess: torch.Tensor, shape: torch.Tensor,
                     scale: torch.Tensor) -> torch.Tensor:
    """A² of each ascending row of ``excess`` against GPD(shape, 0, scale) of that row."""
    n = excess.shape[-1]
    cdf = (1.0 - gpd_sf(excess, shape[:, None], scale[:, None])).clamp(1e-12, 1 - 1e-12)
    weight = 2 * torch.arange(1, n + 1, dtype=excess.dtype, device=excess.device) - 1
    return -n - (weight * (torch.log(cdf) + torch.log1p(-cdf.flip(-1)))).mean(-1)


@functools.lru_cache(maxsize=1)
def _critical_table() -> RegularGridInterpolator:
    table = json.loads(_TABLE.read_text())
    return RegularGridInterpolator((np.asarray(table["shapes"]), np.log(table["sizes"])),
                                   np.asarray(table["critical_05"]))


def ad_critical_values(shape: np.ndarray, n: int) -> np.ndarray:
    """5 % critical values of A² for the tail used, at estimated shapes, ``n`` exceedances."""
    interp = _critical_table()
    shapes, log_sizes = interp.grid
    shape = np.clip(np.nan_to_num(np.asarray(shape, dtype=np.float64)), shapes[0], shapes[-1])
    size = np.full(shape.shape, float(np.clip(np.log(n), log_sizes[0], log_sizes[-1])))
    return interp(np.stack([shape, size], axis=-1))


def ad_critical_value(shape: float, n: int) -> float:
    """5 % critical value of A² for one fit (see :func:`ad_critical_values`)."""
    return float(ad_critical_values(np.array([shape]), n)[0])


def fit_tails(tops: torch.Tensor) -> GPDFits:
    """Fit the tail of each row of ``tops`` (its ``n + 1`` largest null values, descending).

    The batched fit every tail p-value comes from: closed-form, on the tensor's device.
    """
    tops = tops.to(torch.float64) if tops.device.type != "mps" else tops.cpu().double()
    threshold = tops[:, -1]
    excess = (tops[:, :-1] - threshold[:, None]).flip(-1)  # ascending
    estimated, scale = pwm_fit(excess)
    shape, scale = used_tail(excess, estimated, scale)
    n = excess.shape[1]
    valid = torch.isfinite(estimated) & torch.isfinite(scale) & (scale > 0)
    statistic = anderson_darling(excess, shape, torch.where(valid, scale, torch.ones_like(scale)))
    critical = torch.as_tensor(ad_critical_values(estimated.cpu().numpy(), n),
                               dtype=statistic.dtype, device=statistic.device)
    return GPDFits(threshold=threshold, estimated_shape=estimated, shape=shape, scale=scale,
                   accepted=valid & (statistic <= critical), n_exceedances=n)


def tail_p(fits: GPDFits, observed: torch.Tensor, n_boot: int,
           row: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tail p-values of ``observed`` values against fitted rows (``row[i]`` for value ``i``).

    Returns
    -------
    p : tensor, floored : bool tensor (raised to ``1/(100·(B + 1))``), usable : bool tensor
        ``usable`` is False where the fit was rejected or the value is not past the threshold.
    """
    pick = (lambda v: v) if row is None else (lambda v: v[row])
    threshold, shape, scale = pick(fits.threshold), pick(fits.shape), pick(fits.scale)
    observed = observed.to(threshold)
    usable = pick(fits.accepted) & (observed > threshold)
    safe_scale = torch.where(usable, scale, torch.ones_like(scale))
    p = fits.n_exceedances / n_boot * gpd_sf(observed - threshold, shape, safe_scale)
    floor = 1.0 / (100.0 * (n_boot + 1))
    return p.clamp_min(floor), p < floor, usable


def gpd_tail_p(null_values: np.ndarray, observed: float) -> tuple[float, bool] | None:
    """Tail p-value of ``observed`` against one step's null values, or None when unusable.

    Returns
    -------
    (p, floored) or None
        None when the observed value is not past the threshold or the Anderson–Darling test
        rejects the fit; else the tail p (at least ``1/(100·(B + 1))``) and whether it was
        raised to that floor.
    """
    values = torch.as_tensor(np.asarray(null_values, dtype=np.float64))
    n_boot = values.numel()
    if n_boot < tail_size(n_boot) + 1:
        return None
    fits = fit_tails(values.topk(tail_size(n_boot) + 1).values[None])
    p, floored, usable = tail_p(fits, torch.tensor([float(observed)]), n_boot)
    return (float(p[0]), bool(floored[0])) if bool(usable[0]) else None


def tail_pvalues(step_p: np.ndarray, counts: np.ndarray, step_statistic: np.ndarray,
                 n_boot: int,
                 null_tops: Callable[[tuple[np.ndarray, np.ndarray], int], torch.Tensor],
                 *, shared_first: bool = False) -> tuple[np.ndarray, np.ndarray, TailFit]:
    """Replace the leading small counting p-values by tail p-values where the fit holds.

    Parameters
    ----------
    step_p, counts, step_statistic : arrays ``(F, T)`` in step order
    n_boot : int
    null_tops : callable
        ``null_tops((families, steps), k)`` → tensor ``(n, k)``: the ``k`` largest null step
        statistics of each of those steps, descending.
    shared_first : bool
        Every family's first step has the same null sample (families sharing one null: the
        first step's statistic does not depend on the order), so it is fitted once.

    Returns
    -------
    step_p : np.ndarray, used : bool np.ndarray, TailFit
    """
    used = np.zeros(step_p.shape, dtype=bool)
    if n_boot < MIN_BOOT:
        return step_p, used, TailFit.unused("gpd", f"B = {n_boot} < {MIN_BOOT}: counts kept")
    leading = np.logical_and.accumulate(counts < MIN_EXCEEDING, axis=1)
    leading[:, MAX_TAIL_STEPS:] = False
    fam, step = np.nonzero(leading)
    if fam.size == 0:
        return step_p, used, TailFit.unused("gpd", "no step needed it")
    # one row per distinct null sample
    sample_family = np.where(step == 0, 0, fam) if shared_first else fam
    keys = sample_family.astype(np.int64) * step_p.shape[1] + step
    unique, row = np.unique(keys, return_inverse=True)
    tops = null_tops((unique // step_p.shape[1], unique % step_p.shape[1]),
                     tail_size(n_boot) + 1)
    fits = fit_tails(tops)
    device = fits.threshold.device
    observed = torch.as_tensor(step_statistic[fam, step], dtype=torch.float64, device=device)
    p, floored, usable = (v.cpu().numpy() for v in tail_p(
        fits, observed, n_boot, torch.as_tensor(row, device=device)))
    out = step_p.copy()
    out[fam[usable], step[usable]] = p[usable]
    used[fam[usable], step[usable]] = True
    first = step == 0
    return out, used, TailFit("gpd", int(usable.sum()), int((~usable).sum()),
                              int((floored & usable).sum()), fits=int(unique.size),
                              first_wanted=int(first.sum()),
                              first_rejected=int((first & ~usable).sum()), null_maps=n_boot)
