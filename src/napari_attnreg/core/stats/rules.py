"""Regularized attention maps: each rule keeps or zeroes tokens.

Every rule keeps the observed attention of the tokens it accepts and zeroes the
rest, except ``"soft"``, which shrinks every token by its posterior probability
of being non-null. Inputs are token maps of any shape (``(T,)`` or
``(gh, gw)``); thresholds can be moved freely because nothing is recomputed.

The defaults here are the paper's: ``z_th = 0`` and ``p_th = l_th = 0.3``, the reference
implementation's high-level default (its low-level function uses 0.1 and its notebook often
the median of the map; pass those explicitly to compare). The directional preset
(:mod:`.presets`) uses rule ``"q"`` at ``q_th = 0.1`` and no z mask (``z_th=None``).

Example
-------
>>> import numpy as np
>>> a = np.array([0.5, 0.3, 0.2]); z = np.array([2.0, 0.5, -1.0])
>>> p = np.array([0.01, 0.4, 0.9]); lfdr = np.array([0.05, 0.6, 1.0])
>>> regularized_maps(a, z, p, lfdr, 1 - lfdr, 0.5)["p"]
array([0.5, 0. , 0. ])
"""

from __future__ import annotations

import numpy as np

from napari_attnreg.core.stats.choices import RULES
from napari_attnreg.core.stats.paper import qvalues

DEFAULT_Z_TH = 0.0
DEFAULT_P_TH = 0.3
DEFAULT_L_TH = 0.3
DEFAULT_Q_TH = 0.1


def _as_float_array(x: np.ndarray, name: str, shape: tuple[int, ...] | None,
                    untested: bool = False) -> np.ndarray:
    """``x`` as float64, checked; ``untested=True`` lets NaN mark a token that was not
    tested (an attention sink left out), which no rule keeps — but not every token."""
    arr = np.asarray(x, dtype=np.float64)
    if shape is not None and arr.shape != shape:
        raise ValueError(f"{name} has shape {arr.shape} but attention has {shape}; pass maps "
                         "of the same token grid.")
    finite = np.isfinite(arr)
    if not (np.all(finite | (untested & np.isnan(arr))) and (finite.any() or arr.size == 0)):
        raise ValueError(f"{name} contains NaN or inf; recompute the statistics.")
    return arr


def _check_rule(rule: str) -> None:
    if rule not in RULES:
        raise ValueError(f"rule={rule!r} is not supported; use one of {RULES}.")


def _check_fraction(value: float, name: str) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}.")
    return value


def pi0_p_threshold(p: np.ndarray, pi0: float, pixels_per_token: int = 1) -> float:
    """The ``100·(1 − π0)``-th percentile of ``p``: the pi0 rule keeps ``p`` at or below it.

    Zeroing the ``π0`` fraction of tokens with the largest p-values is the
    reference implementation's way to drop the estimated null tokens. The reference takes
    the percentile on the upsampled pixel grid, where every token appears
    ``pixels_per_token`` (= s²) times; that percentile is read here straight from the
    sorted token p-values (numpy's linear interpolation on the repeated array), so the
    paper preset matches it without upsampling.
    """
    p = np.asarray(p, dtype=np.float64)
    if p.size == 0:
        raise ValueError("p is empty; pass the p-value map of at least one token.")
    q = 1.0 - _check_fraction(pi0, "pi0")
    reps = int(pixels_per_token)
    if reps < 1:
        raise ValueError(f"pixels_per_token must be a positive integer, got {pixels_per_token}.")
    if reps == 1:
        return float(np.percentile(p, 100.0 * q))
    values = np.sort(p.reshape(-1))
    pos = q * (values.size * reps - 1)  # index into the repeated, sorted pixel array
    lo = int(np.floor(pos))
    hi = min(lo + 1, values.size * reps - 1)
    v_lo, v_hi = values[lo // reps], values[hi // reps]
    return float(v_lo + (v_hi - v_lo) * (pos - lo))


def significance_mask(
    rule: str,
    z: np.ndarray,
    p: np.ndarray,
    lfdr: np.ndarray,
    pi0: float,
    *,
    z_th: float | None = DEFAULT_Z_TH,
    p_th: float = DEFAULT_P_TH,
    l_th: float = DEFAULT_L_TH,
    q_th: float = DEFAULT_Q_TH,
    posterior: np.ndarray | None = None,
    q: np.ndarray | None = None,
    pixels_per_token: int = 1,
) -> np.ndarray:
    """Tokens kept (not zeroed) by a rule.

    Parameters
    ----------
    rule : {"q", "p", "lfdr", "pi0", "soft", "base"}
        ``"base"``: ``z >= z_th``; ``"q"``: and ``q <= q_th``; ``"p"``: and ``p <= p_th``; ``"lfdr"``: and
        ``lfdr <= l_th``; ``"pi0"``: and ``p`` at most its ``100·(1 − π0)``-th
        percentile; ``"soft"``: ``posterior = 1 − lfdr >= 0.5`` and ``z >= z_th``
        (the soft map itself is never zero there, so this is the token set
        worth outlining).
    z, p, lfdr : arrays of one shape
    pi0 : float in [0, 1]
    z_th : float or None
        z mask; ``None`` applies none (the directional preset).
    p_th, l_th, q_th : float
        Thresholds on p, lfdr and q.
    posterior : array, optional
        Used by ``"soft"``; defaults to ``1 - lfdr``.
    q : array, optional
        Used by ``"q"``; defaults to Storey's q-values of ``p`` with ``pi0``.
    pixels_per_token : int
        ``"pi0"`` only: take its percentile on a grid where each token is repeated this
        often (the paper's pixel grid; 1 = token grid).

    Returns
    -------
    np.ndarray of bool, the shape of ``z``. A token whose ``p`` is NaN was not tested (an
    attention sink left out of the test) and is never kept.
    """
    _check_rule(rule)
    z = _as_float_array(z, "z", None)
    p = _as_float_array(p, "p", z.shape, untested=True)
    lfdr = _as_float_array(lfdr, "lfdr", z.shape, untested=True)
    tested = ~np.isnan(p)  # NaN: left out of the test (every comparison below is False)
    keep = z >= z_th if z_th is not None else np.ones(z.shape, dtype=bool)
    keep &= tested
    if rule == "q":
        if q is None:
            q = np.full(p.shape, np.nan)
            q[tested] = qvalues(p[tested], pi0)
        keep &= _as_float_array(q, "q", z.shape, untested=True) <= q_th
    elif rule == "p":
        keep &= p <= p_th
    elif rule == "lfdr":
        keep &= lfdr <= l_th
    elif rule == "pi0" and tested.any():
        keep &= p <= pi0_p_threshold(p[tested], pi0, pixels_per_token)
    elif rule == "soft":
        post = 1.0 - lfdr if posterior is None else _as_float_array(
            posterior, "posterior", z.shape, untested=True)
        keep &= post >= 0.5
    return keep


def regularized_map(
    rule: str,
    attention: np.ndarray,
    z: np.ndarray,
    p: np.ndarray,
    lfdr: np.ndarray,
    posterior: np.ndarray,
    pi0: float,
    *,
    z_th: float | None = DEFAULT_Z_TH,
    p_th: float = DEFAULT_P_TH,
    l_th: float = DEFAULT_L_TH,
    q_th: float = DEFAULT_Q_TH,
    q: np.ndarray | None = None,
    pixels_per_token: int = 1,
) -> np.ndarray:
    """One regularized map; see :func:`regularized_maps` for the rules."""
    _check_rule(rule)
    attention = _as_float_array(attention, "attention", None)
    if np.any(attention < 0):
        raise ValueError("attention contains negative values; pass the observed attention map.")
    if rule == "soft":  # an untested token (NaN posterior) gets no weight
        posterior = _as_float_array(posterior, "posterior", attention.shape, untested=True)
        return attention * np.nan_to_num(np.clip(posterior, 0.0, 1.0), nan=0.0)
    z = _as_float_array(z, "z", attention.shape)
    keep = significance_mask(rule, z, p, lfdr, pi0, z_th=z_th, p_th=p_th, l_th=l_th, q_th=q_th,
                             q=q, pixels_per_token=pixels_per_token)
    return np.where(keep, attention, 0.0)


def regularized_maps(
    attention: np.ndarray,
    z: np.ndarray,
    p: np.ndarray,
    lfdr: np.ndarray,
    posterior: np.ndarray,
    pi0: float,
    *,
    z_th: float | None = DEFAULT_Z_TH,
    p_th: float = DEFAULT_P_TH,
    l_th: float = DEFAULT_L_TH,
    q_th: float = DEFAULT_Q_TH,
    q: np.ndarray | None = None,
    pixels_per_token: int = 1,
) -> dict[str, np.ndarray]:
    """The regularized attention maps of every rule.

    Parameters
    ----------
    attention, z, p, lfdr, posterior : arrays of one shape
        Observed attention and its token statistics.
    pi0 : float
        Estimated proportion of null tokens.
    z_th, p_th, l_th, q_th : float
        Thresholds on z (``None``: no z mask), p, lfdr and q.
    q : array, optional
        q-values (default: Storey's from ``p`` and ``pi0``).
    pixels_per_token : int
        Grid of the pi0 rule's percentile (see :func:`pi0_p_threshold`).

    Returns
    -------
    dict with float64 maps the shape of ``attention``:
    ``"base"`` = A·[z ≥ z_th]; ``"q"`` = base·[q ≤ q_th]; ``"p"`` = base·[p ≤ p_th];
    ``"lfdr"`` = base·[lfdr ≤ l_th]; ``"pi0"`` = base zeroed where p exceeds
    its ``100·(1 − π0)``-th percentile; ``"soft"`` = A·posterior.
    """
    return {
        rule: regularized_map(rule, attention, z, p, lfdr, posterior, pi0, z_th=z_th, p_th=p_th,
                              l_th=l_th, q_th=q_th, q=q, pixels_per_token=pixels_per_token)
        for rule in ("base", "q", "p", "lfdr", "pi0", "soft")
    }
