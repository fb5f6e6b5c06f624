"""Generalized Pareto tail approximation of small step-down p-values (``tail="gpd"``).

With ``B`` null maps a counting p-value cannot go below ``1/(B + 1)``: a tiled image with
hundreds of tiles, or a strict level, needs smaller ones than ``B`` allows. Where fewer
than :data:`MIN_EXCEEDING` null statistics reach the observed one (and ``B ≥ 100``), the
top 10 % of the null statistics are fitted by a generalized Pareto distribution (scipy's
maximum likelihood, location fixed at the threshold ``u``) and
``p = (n_exc / B) · (1 − F_GPD(s − u))`` replaces the count (Knijnenburg et al. 2009;
Winkler et al. 2016). The count is kept where an Anderson–Darling test rejects the fit at
0.05, and no p goes below ``1 / (100·(B + 1))``: a fitted tail with a finite end point
would otherwise give an observed value past it a p of 0.

A fitted shape below 0 (a tail with an end point) is replaced by 0 (an exponential tail,
refitted): the null step statistics *are* bounded, but an end point estimated from a few
dozen exceedances lies near their largest value, so a pure-noise tile just past it got
the floor p. Measured on 2048² noise mosaics with the demo model (B = 200, 441 tiles): with
the fitted end point, 5 of 10 mosaics had a tile at the floor, selected by Benjamini–Hochberg.
The exponential tail is heavier, so its p-values err on the large side.

Only the leading steps are approximated (those before the first step that 10 or more null
statistics reach): after that step the step-down adjusted p is at least ``10/(B + 1)``,
which no smaller p of a later step can lower. At most :data:`MAX_TAIL_STEPS` per family:
the first step is the family's (tile's) p-value, and a map whose every patch beats every
null map (a model attending to all of a slice's anatomy, say) would otherwise need a fit per
patch of every tile; later steps keep their counts, which only makes ForwardStop stricter.

The Anderson–Darling critical values of a fit with estimated shape and scale depend on the
shape and the number of exceedances; ``gpd_ad_critical.json`` tabulates them for this very
estimator (``scripts/make_gpd_table.py``), as Choulakian & Stephens (2001) did for theirs.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy import stats
from scipy.interpolate import RegularGridInterpolator

TAIL_METHODS = ("none", "gpd")
MIN_EXCEEDING = 10
MIN_BOOT = 100
TAIL_FRACTION = 0.1
MIN_EXCEEDANCES = 10
#: Leading steps per family that get a tail fit (each fit takes milliseconds).
MAX_TAIL_STEPS = 16
_TABLE = Path(__file__).with_name("gpd_ad_critical.json")


@dataclass(frozen=True)
class TailFit:
    """What the tail approximation did in one run (kept in the result's metadata).

    Attributes
    ----------
    method : {"none", "gpd"}
    steps : int
        Steps whose p-value comes from a fitted tail.
    rejected : int
        Steps whose fit the Anderson–Darling test rejected (their count was kept).
    floored : int
        Steps whose tail p was raised to the floor ``1 / (100·(B + 1))``.
    note : str
        Why nothing was approximated, when that is the case.
    """

    method: str
    steps: int = 0
    rejected: int = 0
    floored: int = 0
    note: str = ""

    @classmethod
    def unused(cls, method: str, note: str = "") -> TailFit:
        return cls(method=method, note=note)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@functools.lru_cache(maxsize=1)
def _critical_table() -> RegularGridInterpolator:
    table = json.loads(_TABLE.read_text())
    return RegularGridInterpolator((np.asarray(table["shapes"]), np.log(table["sizes"])),
                                   np.asarray(table["critical_05"]))


def ad_critical_value(shape: float, n: int) -> float:
    """5 % critical value of A² for a fitted GPD of this shape from ``n`` exceedances."""
    interp = _critical_table()
    shapes, log_sizes = interp.grid
    point = (float(np.clip(shape, shapes[0], shapes[-1])),
             float(np.clip(np.log(n), log_sizes[0], log_sizes[-1])))
    return float(interp([point])[0])


def anderson_darling(sample: np.ndarray, shape: float, scale: float) -> float:
    """A² of ``sample`` against GPD(shape, 0, scale)."""
    u = np.clip(np.sort(stats.genpareto.cdf(sample, shape, 0.0, scale)), 1e-12, 1 - 1e-12)
    n = u.size
    i = np.arange(1, n + 1)
    return float(-n - np.mean((2 * i - 1) * (np.log(u) + np.log1p(-u[::-1]))))


def gpd_tail_p(null_values: np.ndarray, observed: float) -> tuple[float, bool] | None:
    """Tail p-value of ``observed`` against one step's null values, or None when unusable.

    Returns
    -------
    (p, floored) or None
        None when the exceedances are too few, the observed value is not past the
        threshold, or the Anderson–Darling test rejects the fit; else the tail p (at least
        ``1/(100·(B + 1))``) and whether it was raised to that floor.
    """
    values = np.asarray(null_values, dtype=np.float64)
    n_boot = values.size
    threshold = float(np.quantile(values, 1.0 - TAIL_FRACTION))
    excess = values[values > threshold] - threshold
    if excess.size < MIN_EXCEEDANCES or observed <= threshold or np.ptp(excess) <= 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the optimizer's chatter; the fit is judged below
        shape, _, scale = stats.genpareto.fit(excess, floc=0.0)
        if shape < 0:  # no end point extrapolated from a few exceedances (module docstring)
            shape, scale = 0.0, float(np.mean(excess))
    if not (np.isfinite(shape) and np.isfinite(scale) and scale > 0):
        return None
    if anderson_darling(excess, shape, scale) > ad_critical_value(shape, excess.size):
        return None
    p = excess.size / n_boot * float(stats.genpareto.sf(observed - threshold, shape, 0.0, scale))
    floor = 1.0 / (100.0 * (n_boot + 1))
    return max(p, floor), p < floor


def tail_pvalues(step_p: np.ndarray, counts: np.ndarray, step_statistic: np.ndarray,
                 n_boot: int, null_columns: Callable[[tuple[np.ndarray, np.ndarray]], np.ndarray],
                 ) -> tuple[np.ndarray, np.ndarray, TailFit]:
    """Replace the leading small counting p-values by tail p-values where the fit holds.

    Parameters
    ----------
    step_p, counts, step_statistic : arrays ``(F, T)`` in step order
    n_boot : int
    null_columns : callable
        ``null_columns((families, steps))`` → ``(B, n)`` null step statistics of those steps.

    Returns
    -------
    step_p : np.ndarray, used : bool np.ndarray, TailFit
    """
    used = np.zeros(step_p.shape, dtype=bool)
    if n_boot < MIN_BOOT:
        return step_p, used, TailFit.unused("gpd", f"B = {n_boot} < {MIN_BOOT}: counts kept")
    leading = np.logical_and.accumulate(counts < MIN_EXCEEDING, axis=1)
    leading[:, MAX_TAIL_STEPS:] = False
    wanted = np.nonzero(leading)
    if wanted[0].size == 0:
        return step_p, used, TailFit.unused("gpd", "no step needed it")
    columns = null_columns(wanted)
    out = step_p.copy()
    rejected = floored = 0
    for j, (fam, step) in enumerate(zip(*wanted)):
        found = gpd_tail_p(columns[:, j], float(step_statistic[fam, step]))
        if found is None:
            rejected += 1
            continue
        out[fam, step], was_floored = found
        used[fam, step] = True
        floored += int(was_floored)
    return out, used, TailFit("gpd", int(used.sum()), rejected, floored)
