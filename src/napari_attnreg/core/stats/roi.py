"""Region-of-interest measures of the paper and the per-ROI statistics table.

The measures work on any pair of same-shaped maps (token grids or pixel maps).
The table is shared by the napari and notebook front ends: ROIs are integer
labels on the *original* image grid, mapped to tokens by coverage.

Token membership
    A token belongs to an ROI when at least half of its original-pixel
    footprint lies inside it (``coverage >= 0.5``). An ROI smaller than that
    everywhere (e.g. a few pixels) gets its single most-covered token, so every
    drawn ROI has a row.

Polygons
    :func:`polygon_roi_table` gives the rows of ``roi_table`` for polygons without their
    label image (a level-0 slide's would take gigabytes): each is rasterized band by band
    inside its own box, so memory follows the regions, not the image. A polygon that fills
    no pixel centre of the result still gets a row (:data:`NO_PIXELS`).

Example
-------
>>> import numpy as np
>>> raw = np.array([[0.1, 0.2], [0.3, 0.4]]); roi = np.array([[False, False], [False, True]])
>>> mean_percentile(raw, raw, roi)       # 0.4 exceeds all three outside scores
100.0
"""

from __future__ import annotations

import csv
import math
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import fisher_exact
from scipy.stats.contingency import odds_ratio

#: Columns of :func:`roi_table`, in CSV order.
ROI_COLUMNS = (
    "label",
    "area_px",
    "area_um2",
    "n_tokens",
    "mean_attention",
    "attention_enrichment",
    "attention_enrichment_low",
    "attention_enrichment_high",
    "mean_regularized",
    "mean_posterior",
    "frac_significant",
    "mean_pct_raw",
    "mean_pct_regularized",
    "odds_ratio",
    "odds_ratio_low",
    "odds_ratio_high",
    "fisher_p",
    "enrichment_test_note",
)
#: Fewer significant patches than this in the map: the odds ratio and Fisher test say little.
MIN_SIGNIFICANT_FOR_ENRICHMENT = 5
#: ``enrichment_test_note`` of a row whose map has too few significant patches.
TOO_FEW_SIGNIFICANT = "too few significant patches"
#: z of the two-sided 95 % interval.
_Z95 = 1.959963984540054
#: A token belongs to an ROI when at least this fraction of its footprint is inside.
MEMBERSHIP_COVERAGE = 0.5


def _as_mask(mask: np.ndarray, shape: tuple[int, ...], name: str = "roi_mask") -> np.ndarray:
    m = np.asarray(mask)
    if m.shape != shape:
        raise ValueError(f"{name} has shape {m.shape} but the scores have {shape}; pass a "
                         "boolean mask on the same grid.")
    return m.astype(bool)


def sparsity(scores: np.ndarray, roi_mask: np.ndarray | None = None) -> float:
    """Percentage of non-zero scores, in the ROI or over the whole map.

    Parameters
    ----------
    scores : array
        A (regularized) attention map.
    roi_mask : bool array, optional
        Restrict the count to these elements.

    Returns
    -------
    float in [0, 100].
    """
    scores = np.asarray(scores)
    values = scores if roi_mask is None else scores[_as_mask(roi_mask, scores.shape)]
    if values.size == 0:
        raise ValueError("The ROI is empty; draw a region that covers at least one element.")
    return 100.0 * np.count_nonzero(values) / values.size


#: How :func:`roi_percentiles` counts outside scores equal to an ROI score.
TIES = ("half", "zero")


def roi_percentiles(scores: np.ndarray, raw: np.ndarray, roi_mask: np.ndarray, *,
                    ties: str = "half") -> np.ndarray:
    """Percentile of every ROI score among the *raw* scores outside the ROI.

    Parameters
    ----------
    scores, raw : arrays of one shape
        The map whose ROI scores are ranked, and the un-regularized map whose scores outside
        the ROI are the reference.
    roi_mask : bool array
    ties : {"half", "zero"}
        ``"half"`` (default): an outside score equal to the ROI score counts half (mid-rank,
        scipy ``percentileofscore(kind="mean")``), so a score equal to every outside score
        sits at 50. ``"zero"``: only strictly smaller outside scores count
        (``kind="strict"``), the convention of the paper's reference code; it matters where
        ties are common, e.g. on an upsampled pixel grid where every token repeats.

    Returns
    -------
    np.ndarray of the ROI elements' percentiles in [0, 100].
    """
    if ties not in TIES:
        raise ValueError(f"ties={ties!r} is not supported; use one of {TIES}.")
    scores = np.asarray(scores, dtype=np.float64)
    raw = np.asarray(raw, dtype=np.float64)
    if raw.shape != scores.shape:
        raise ValueError(f"raw has shape {raw.shape} but scores have {scores.shape}.")
    roi = _as_mask(roi_mask, scores.shape)
    outside = np.sort(raw[~roi])
    inside = scores[roi]
    if inside.size == 0 or outside.size == 0:
        raise ValueError("The ROI must contain some elements and leave some outside it.")
    below = np.searchsorted(outside, inside, side="left")
    if ties == "zero":
        return 100.0 * below / outside.size
    below_or_equal = np.searchsorted(outside, inside, side="right")
    return 100.0 * (below + below_or_equal) / (2.0 * outside.size)


def mean_percentile(scores: np.ndarray, raw: np.ndarray, roi_mask: np.ndarray, *,
                    ties: str = "half") -> float:
    """ROI mean percentile (the paper's evaluation measure).

    Parameters
    ----------
    scores : array
        Map whose ROI scores are ranked (raw or regularized).
    raw : array
        The un-regularized map; its scores outside the ROI are the reference.
    roi_mask : bool array
        The ROI.
    ties : {"half", "zero"}
        How equal outside scores count; see :func:`roi_percentiles`.

    Returns
    -------
    float in [0, 100]: the mean of :func:`roi_percentiles`.
    """
    return float(np.mean(roi_percentiles(scores, raw, roi_mask, ties=ties)))


def d_ratio(reg_pcts: np.ndarray, raw_pcts: np.ndarray, *,
            covariance: bool = True) -> tuple[float, float]:
    """``D = Σ reg / Σ raw`` over images and its first-order (delta-method) error.

    Parameters
    ----------
    reg_pcts, raw_pcts : arrays ``(n_images,)``
        Mean percentiles of the same ROIs after and before regularization.
    covariance : bool
        Keep the covariance term of the error (default). ``False`` drops it, as the
        paper's reference code does, treating the two sums as independent.

    Returns
    -------
    (D, error)
        ``error = |D| sqrt(Var R / R² + Var W / W² − 2 Cov(R, W) / (R W))`` with
        ``R = Σ reg``, ``W = Σ raw`` and ``Var R = n s²_reg`` etc. (sample
        variances, ddof 1). The covariance term is kept by default because both sums
        come from the same images (it is positive when they move together, so dropping
        it usually overstates the error). ``error`` is NaN for a single image.
    """
    reg = np.asarray(reg_pcts, dtype=np.float64).reshape(-1)
    raw = np.asarray(raw_pcts, dtype=np.float64).reshape(-1)
    if reg.shape != raw.shape or reg.size == 0:
        raise ValueError("reg_pcts and raw_pcts must be non-empty and of equal length "
                         "(one mean percentile per image).")
    if not (np.all(np.isfinite(reg)) and np.all(np.isfinite(raw))):
        raise ValueError("reg_pcts and raw_pcts must be finite.")
    total_reg, total_raw = reg.sum(), raw.sum()
    if total_raw == 0:
        raise ValueError("The raw mean percentiles sum to 0, so D is undefined.")
    d = float(total_reg / total_raw)
    n = reg.size
    if n < 2:
        return d, math.nan
    cov = np.cov(reg, raw, ddof=1) * n
    rel = cov[0, 0] / total_reg**2 if total_reg != 0 else 0.0
    rel += cov[1, 1] / total_raw**2
    if covariance and total_reg != 0:
        rel -= 2.0 * cov[0, 1] / (total_reg * total_raw)
    return d, float(abs(d) * math.sqrt(max(rel, 0.0)))


def null_calibration(p: np.ndarray) -> float:
    """Signed RMSD between sorted null p-values and uniform quantiles ``(i − 0.5)/n``.

    Positive when the median p-value is ≤ 0.5 (p-values too small: inflation).
    """
    p = np.sort(np.asarray(p, dtype=np.float64).reshape(-1))
    if p.size == 0:
        raise ValueError("p is empty; pass the p-values of null images.")
    uniform = (np.arange(1, p.size + 1) - 0.5) / p.size
    rmsd = float(np.sqrt(np.mean((p - uniform) ** 2)))
    return rmsd if np.median(p) <= 0.5 else -rmsd


def roi_tokens(result: Any, roi: np.ndarray) -> np.ndarray:
    """Tokens ``(gh, gw)`` that belong to a boolean pixel ROI (see module docstring)."""
    coverage = np.asarray(result.token_coverage(roi), dtype=np.float64)
    member = coverage >= MEMBERSHIP_COVERAGE
    if not member.any() and coverage.max() > 0:
        member = np.zeros(coverage.shape, dtype=bool)
        member[np.unravel_index(np.argmax(coverage), coverage.shape)] = True
    return member


def attention_enrichment(attention: np.ndarray, member: np.ndarray
                         ) -> tuple[float, float, float]:
    """Mean attention inside the ROI over mean attention outside, with a 95 % interval.

    The interval is the delta method's on the log ratio, over tokens:
    ``exp(log R ± 1.96 sqrt(s²_in / (n_in m²_in) + s²_out / (n_out m²_out)))``. Neighbouring
    tokens are correlated, so it is narrower than a between-image interval would be: it says
    how well this image's tokens pin the ratio down, not how it would vary between images.

    Returns
    -------
    (ratio, low, high)
        NaN when nothing lies outside the ROI or the outside attention is 0; the bounds are
        NaN when a side has fewer than two tokens or the inside mean is 0 (ratio 0).
    """
    values = np.asarray(attention, dtype=np.float64)
    member = _as_mask(member, values.shape, "member")
    inside, outside = values[member], values[~member]
    if inside.size == 0 or outside.size == 0 or outside.mean() <= 0:
        return math.nan, math.nan, math.nan
    m_in, m_out = float(inside.mean()), float(outside.mean())
    ratio = m_in / m_out
    if inside.size < 2 or outside.size < 2 or m_in <= 0:
        return ratio, math.nan, math.nan
    se = math.sqrt(inside.var(ddof=1) / (inside.size * m_in**2)
                   + outside.var(ddof=1) / (outside.size * m_out**2))
    return ratio, ratio * math.exp(-_Z95 * se), ratio * math.exp(_Z95 * se)


#: Above this smallest margin of an ROI's 2×2 table its odds ratio's interval is the normal
#: one of the log ratio (Woolf's standard error) around the conditional estimate, not the
#: exact one: the exact interval's time grows with the square of the margin (0.25 s at 2,000
#: tokens, 7 s at 20,000, 73 s at 100,000: minutes per ROI on a level-0 slide) while the two
#: differ by under 1 % beyond it.
EXACT_OR_INTERVAL_MAX = 2000


def _odds_ratio(table: np.ndarray) -> tuple[float, float, float]:
    """Conditional maximum-likelihood odds ratio and its 95 % interval: exact, or the log
    ratio's normal interval on large tables (:data:`EXACT_OR_INTERVAL_MAX`).

    Unlike a Haldane-corrected ratio it is 0 for an ROI with no significant token (and inf
    when every token inside is significant and some outside are not); NaN when a row or column
    of the table is empty (e.g. no token outside the ROI: nothing to compare with).
    """
    if (table.sum(axis=0) == 0).any() or (table.sum(axis=1) == 0).any():
        return math.nan, math.nan, math.nan
    estimate = odds_ratio(table, kind="conditional")
    ratio = float(estimate.statistic)
    margin = min(table.sum(axis=0).min(), table.sum(axis=1).min())
    if margin > EXACT_OR_INTERVAL_MAX and (table > 0).all():
        half = _Z95 * math.sqrt(float(np.sum(1.0 / table)))
        return ratio, ratio * math.exp(-half), ratio * math.exp(half)
    ci = estimate.confidence_interval(0.95)
    return ratio, float(ci.low), float(ci.high)


def roi_table(
    result: Any,
    labels: np.ndarray,
    *,
    rule: str | None = None,
    p_th: float | None = None,
    l_th: float | None = None,
    z_th: float | None = None,
    q_th: float | None = None,
) -> list[dict]:
    """Per-ROI statistics of one result.

    Parameters
    ----------
    result : AttentionResult
        Token maps and geometry of a run.
    labels : int array ``result.image_shape``
        ROI labels on the original image grid; 0 is background, each positive
        id one ROI (a boolean mask is one ROI with id 1).
    rule, p_th, l_th, z_th, q_th
        Regularization rule and thresholds; ``None`` uses ``result.thresholds`` (to turn
        the z mask off, give a result whose thresholds say so, e.g.
        ``result.with_thresholds(z_th=None)``).

    Returns
    -------
    list of dict, one per ROI with the keys of :data:`ROI_COLUMNS`:
    ``label``, ``area_px``, ``n_tokens`` (member tokens), ``mean_attention``
    (raw) and ``mean_regularized`` over the members, ``attention_enrichment`` (mean attention
    inside over outside) with its 95 % interval over tokens (``attention_enrichment_low``,
    ``attention_enrichment_high``: :func:`attention_enrichment`), ``mean_posterior``,
    ``frac_significant`` (members kept by the rule), ``mean_pct_raw`` /
    ``mean_pct_regularized`` (:func:`mean_percentile` against the raw tokens
    outside; NaN when the ROI covers every token), ``odds_ratio`` and
    ``fisher_p`` (two-sided Fisher exact test) of significant tokens inside
    versus outside the ROI: the conditional maximum-likelihood odds ratio with its exact 95 %
    interval (``odds_ratio_low``, ``odds_ratio_high``; the log ratio's normal interval when
    every margin of the table exceeds :data:`EXACT_OR_INTERVAL_MAX` tokens, where the exact
    one would take minutes and differs by under 1 %), 0 for an ROI without significant
    tokens, NaN when there is nothing to compare with; ``enrichment_test_note`` is
    :data:`TOO_FEW_SIGNIFICANT` when fewer than :data:`MIN_SIGNIFICANT_FOR_ENRICHMENT` tokens
    of the map are significant (the odds ratio and Fisher p then say little), else empty.
    """
    labels = np.asarray(labels)
    if labels.dtype == bool:
        labels = labels.astype(np.int64)
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be an integer label image, got dtype {labels.dtype}; "
                         "convert shapes to labels first.")
    if labels.shape != tuple(result.image_shape):
        raise ValueError(f"labels have shape {labels.shape} but the image is "
                         f"{tuple(result.image_shape)}; draw the ROIs on the original image.")

    def regions():
        for label in np.unique(labels[labels > 0]):
            roi = labels == label
            yield int(label), int(roi.sum()), _as_block(roi_tokens(result, roi))

    return _rows(result, regions(), rule=rule, p_th=p_th, l_th=l_th, z_th=z_th, q_th=q_th)


#: Micrometres per unit of length, by the names napari (pint), OME and DICOM give units.
MICROMETRES = {"nanometer": 1e-3, "nm": 1e-3, "micrometer": 1.0, "micron": 1.0, "µm": 1.0,
               "μm": 1.0, "um": 1.0, "millimeter": 1e3, "mm": 1e3, "centimeter": 1e4,
               "cm": 1e4, "meter": 1e6, "m": 1e6}


def um2_per_pixel(result: Any) -> float:
    """Square micrometres per pixel of ``result`` (its recorded pixel size: a napari layer's
    scale and units, a slide's microns per pixel, a DICOM's spacing); NaN when the image has
    none (pixels, or units that are no length)."""
    return um2_per_pixel_of(getattr(result, "spatial", None) or {})


def um2_per_pixel_of(spatial: Mapping[str, Any]) -> float:
    """:func:`um2_per_pixel` of a ``spatial`` record (``{"scale": [sy, sx], "units": [...]}``:
    where a front end places the image now, which may have changed since the run)."""
    units = [MICROMETRES.get(str(u).strip()) for u in spatial.get("units", ())]
    scale = spatial.get("scale", ())
    if len(units) != 2 or None in units or len(scale) != 2:
        return math.nan
    return abs(float(scale[0]) * units[0] * float(scale[1]) * units[1])


def _rows(result: Any, regions: Any, **given: Any) -> list[dict]:
    """The rows of :func:`roi_table` from ``(label, area_px, tokens)`` triples (``tokens``:
    the ROI's :class:`PolygonTokens` block of the grid), whichever way the ROIs were drawn.

    Every statistic of the outside of a region comes from the whole map's (:class:`_MapTotals`,
    kept between threshold moves) less the region's own, so a row costs what its region
    holds, not the map: on a level-0 slide each region used to copy the whole map (twice, in
    float64) for its enrichment and counts.
    """
    thresholds = {k: v for k, v in given.items() if v is not None}
    significant = np.asarray(result.significant(**thresholds), dtype=bool)
    regularized = np.asarray(result.regularized(**thresholds))
    attention = np.asarray(result.attention)
    posterior = np.asarray(result.evidence)
    totals = _map_totals(result)
    tested = totals.tested
    # significant tokens of the tested map (glass a tissue mask left out is never counted)
    n_significant = int(np.count_nonzero(significant if tested is None
                                         else significant & tested))
    note = TOO_FEW_SIGNIFICANT if n_significant < MIN_SIGNIFICANT_FOR_ENRICHMENT else ""
    um2 = um2_per_pixel(result)
    rows = []
    for label, area_px, tokens in regions:
        if area_px == 0:  # smaller than a pixel of this result, off it or covered: no count
            rows.append({**dict.fromkeys(ROI_COLUMNS, math.nan), "label": label,
                         "area_px": 0, "area_um2": 0.0 * um2, "n_tokens": 0,
                         "enrichment_test_note": HIDDEN if tokens.hidden else NO_PIXELS})
            continue
        (r0, c0), (h, w) = tokens.origin, tokens.local.shape
        block = (slice(r0, r0 + h), slice(c0, c0 + w))
        member = tokens.local if tested is None else tokens.local & tested[block]
        if not member.any():  # an ROI on glass alone: nothing in it was tested
            rows.append({**dict.fromkeys(ROI_COLUMNS, math.nan), "label": label,
                         "area_px": area_px, "area_um2": area_px * um2, "n_tokens": 0,
                         "enrichment_test_note": NOT_TESTED})
            continue
        # the members in the grid's row-major order, as a boolean index of the whole map
        # gives them (so every mean over them is the same sum, to the bit)
        att_in, reg_in = attention[block][member], regularized[block][member]
        sig_in = significant[block][member]
        n_in, k_in = int(member.sum()), int(np.count_nonzero(sig_in))
        n_out, k_out = totals.n - n_in, n_significant - k_in
        table = np.array([[k_in, n_in - k_in], [k_out, n_out - k_out]])
        if n_out > 0:
            pct_raw, pct_reg = (_mean_outside_percentile(values, att_in, totals.reference)
                                for values in (att_in, reg_in))
        else:
            pct_raw = pct_reg = math.nan
        inside = att_in.astype(np.float64)
        rows.append({
            "label": label,
            "area_px": area_px,
            "area_um2": area_px * um2,
            "n_tokens": n_in,
            "mean_attention": float(inside.mean()),
            **dict(zip(("attention_enrichment", "attention_enrichment_low",
                        "attention_enrichment_high"),
                       _enrichment(inside, totals,
                                   partial(_outside, attention, tokens, tested)))),
            "mean_regularized": float(reg_in.astype(np.float64).mean()),
            "mean_posterior": _mean_tested(posterior[block][member].astype(np.float64)),
            "frac_significant": float(sig_in.mean()),
            "mean_pct_raw": pct_raw,
            "mean_pct_regularized": pct_reg,
            **dict(zip(("odds_ratio", "odds_ratio_low", "odds_ratio_high"), _odds_ratio(table))),
            "fisher_p": float(fisher_exact(table).pvalue),
            "enrichment_test_note": note,
        })
    return rows


@dataclass(frozen=True)
class _MapTotals:
    """What the ROI table needs of the whole attention map, whatever the region or threshold.

    ``tested``: the tokens that were tested (None: all; a tiled run's tissue mask leaves glass
    out, NaN evidence); ``n``, ``total``, ``m2``: their count, float64 sum and sum of squared
    deviations from the mean; ``reference``: their attention sorted, in the map's own dtype.
    """

    tested: np.ndarray | None
    n: int
    total: float
    m2: float
    reference: np.ndarray


#: Rows of the map summed at a time by :func:`_map_totals` (its float64 working copy).
_TOTALS_ROWS = 256


def _compute_totals(attention: np.ndarray, tested: np.ndarray | None) -> _MapTotals:
    # the map sorted once: every ROI ranks against it less its own tokens (sorting each
    # ROI's outside took seconds on a level-0 slide's grid)
    if tested is None:
        reference = np.sort(attention, axis=None)
    else:
        reference = attention[tested]  # a copy already: sorted in place
        reference.sort()
    flat = reference  # summed in chunks: a float64 copy of a slide's map is 100 MB
    n = int(flat.size)
    chunk = _TOTALS_ROWS * max(1, attention.shape[-1])
    total = math.fsum(float(flat[i:i + chunk].sum(dtype=np.float64))
                      for i in range(0, n, chunk))
    mean = total / n if n else 0.0
    m2 = math.fsum(float(np.square(flat[i:i + chunk].astype(np.float64) - mean).sum())
                   for i in range(0, n, chunk))
    return _MapTotals(tested, n, total, m2, reference)


_TOTALS_CACHE: dict[tuple, tuple[list[weakref.ref], _MapTotals]] = {}
_TOTALS_LOCK = threading.Lock()
#: Maps whose totals are kept (those of recently shown results).
_TOTALS_KEPT = 4


def _map_totals(result: Any) -> _MapTotals:
    """:class:`_MapTotals` of ``result``, kept while its maps live: a threshold move makes a
    new result with the same maps, and sorting a slide's map again took a second."""
    attention = np.asarray(result.attention)
    evidence = np.asarray(result.evidence)
    masked = "tissue_tiles" in getattr(result, "null_summary", {})
    key = (id(attention), id(evidence), masked)
    with _TOTALS_LOCK:
        entry = _TOTALS_CACHE.get(key)
        if entry is not None and entry[0][0]() is attention and entry[0][1]() is evidence:
            return entry[1]
    # glass a tiled run's tissue mask left out was never run (NaN evidence): no measure
    # counts it, inside an ROI or outside (its attention 0 is a fill, and counted outside it
    # inflated every enrichment)
    glass = np.isnan(evidence) if masked else None
    tested = ~glass if glass is not None and glass.any() else None
    totals = _compute_totals(attention, tested)
    try:
        refs = [weakref.ref(attention), weakref.ref(evidence)]
    except TypeError:  # not weak-referenceable (a view, a memory map): no keeping
        return totals
    with _TOTALS_LOCK:
        _TOTALS_CACHE[key] = (refs, totals)
        while len(_TOTALS_CACHE) > _TOTALS_KEPT:
            _TOTALS_CACHE.pop(next(iter(_TOTALS_CACHE)))
    return totals


def _outside(attention: np.ndarray, tokens: PolygonTokens,
             tested: np.ndarray | None) -> np.ndarray:
    """The tested attention outside an ROI, in float64 (a copy of the whole map)."""
    keep = np.ones(attention.shape, dtype=bool) if tested is None else tested.copy()
    (r0, c0), (h, w) = tokens.origin, tokens.local.shape
    keep[r0:r0 + h, c0:c0 + w] &= ~tokens.local
    return attention[keep].astype(np.float64)


#: Below this fraction of the map's sum (or its squared deviations) the outside's share is
#: taken from the outside itself: subtracting nearly equal totals would lose digits.
_CANCELLATION = 1e-3


def _enrichment(inside: np.ndarray, totals: _MapTotals,
                outside: Callable[[], np.ndarray]) -> tuple[float, float, float]:
    """:func:`attention_enrichment` of an ROI from its attention (``inside``, float64) and the
    map's totals; ``outside`` gives the outside's values where the totals would not do."""
    n_in, n_out = inside.size, totals.n - inside.size
    if n_out == 0:
        return math.nan, math.nan, math.nan
    m_in = float(inside.mean())
    s_out = totals.total - float(inside.sum())
    m2_in = float(np.square(inside - m_in).sum())
    m_out = s_out / n_out
    # the map's squared deviations are the inside's, the outside's and their means' apart
    m2_out = totals.m2 - m2_in - (m_in - m_out) ** 2 * n_in * n_out / totals.n
    if (n_out < n_in or abs(s_out) <= _CANCELLATION * abs(totals.total)
            or m2_out <= _CANCELLATION * totals.m2):
        values = outside()
        m_out = float(values.mean()) if values.size else math.nan
        var_out = float(values.var(ddof=1)) if values.size > 1 else math.nan
    else:
        var_out = m2_out / (n_out - 1) if n_out > 1 else math.nan
    if not m_out > 0:
        return math.nan, math.nan, math.nan
    ratio = m_in / m_out
    if n_in < 2 or n_out < 2 or m_in <= 0:
        return ratio, math.nan, math.nan
    se = math.sqrt(float(inside.var(ddof=1)) / (n_in * m_in**2) + var_out / (n_out * m_out**2))
    return ratio, ratio * math.exp(-_Z95 * se), ratio * math.exp(_Z95 * se)


def _mean_outside_percentile(scores: np.ndarray, raw_inside: np.ndarray,
                             raw_sorted: np.ndarray) -> float:
    """:func:`mean_percentile` (ties half) of an ROI's ``scores`` among the raw scores outside
    it, from every raw score sorted once (``raw_sorted``) less the ROI's own (``raw_inside``):
    the same counts and the same mean, without sorting the outside for every ROI. The arrays
    keep the map's dtype (a float32 slide map's float64 copy is 100 MB); comparisons of the
    same values give the same counts in either."""
    inside = np.sort(raw_inside)
    order = np.argsort(scores, kind="stable")
    keys = scores[order]  # sorted keys: searchsorted walks the long array once
    below = (np.searchsorted(raw_sorted, keys, side="left")
             - np.searchsorted(inside, keys, side="left"))
    below_or_equal = (np.searchsorted(raw_sorted, keys, side="right")
                      - np.searchsorted(inside, keys, side="right"))
    pct = np.empty(scores.size, dtype=np.float64)
    pct[order] = 100.0 * (below + below_or_equal) / (2.0 * (raw_sorted.size - inside.size))
    return float(np.mean(pct))  # in the ROI's own order: mean_percentile's sum, to the bit


#: The note of an ROI that covers no pixel centre of the result's image (so no token).
NO_PIXELS = ("covers no pixel of the analysed image (smaller than one of its pixels, or off "
             "it): draw it larger or run at a finer level")
#: The note of an ROI whose pixels all belong to regions drawn over it.
HIDDEN = ("covered by the regions drawn over it (where regions overlap, a pixel belongs to "
          "the one on top): move it, or draw it over them")
#: Most pixels one band of a polygon is rasterized in at a time (the memory it takes).
BAND_PIXELS = 1 << 22
#: Most pixels :func:`polygon_roi_table` rasterizes in all (the polygons' bounding boxes on
#: the image, overlaps counted again): at about 15 ns a pixel, 2³³ (a 90,000² box) already
#: takes two minutes.
MAX_RASTER_PIXELS = 1 << 33
#: A crossing or vertex closer than this to a pixel centre is decided by scikit-image itself.
_TIE = 1e-6


def _band_mask(cols: np.ndarray, rows: np.ndarray, y0: int, y1: int, c0: int,
               c1: int) -> np.ndarray:
    """Pixels ``[y0, y1) × [c0, c1)`` whose centres ``skimage.draw.polygon`` fills.

    skimage tests every pixel of the bounding box against every edge (O(area × vertices),
    and int64 coordinates of every pixel inside): minutes and gigabytes for a level-0
    annotation. Its test (O'Rourke's crossing counts, edges and vertices included) depends
    on each row's edge crossings only, so a row is filled between them here; the pixels
    within :data:`_TIE` of a crossing or a vertex, where rounding could decide, are handed
    to skimage's own test (``points_in_poly``, the same routine), so the masks agree exactly.
    """
    from skimage.measure import points_in_poly

    height, width = y1 - y0, c1 - c0
    prev_c, prev_r = np.roll(cols, 1), np.roll(rows, 1)  # edge (i - 1, i), as skimage walks
    spans = (np.maximum(rows, prev_r) >= y0 - 1) & (np.minimum(rows, prev_r) <= y1)
    xi, yi, xj, yj = cols[spans], rows[spans], prev_c[spans], prev_r[spans]
    y = np.arange(y0, y1, dtype=np.float64)[:, None]
    mask = np.zeros((height, width), dtype=bool)
    tie_r, tie_c = [], []
    # right crossings count edges with a vertex above the row; left ones, below it: a pixel
    # is filled when either count is odd (inside, or on an edge). They are the same edges
    # on rows no vertex lies exactly on (the usual band of a drawn polygon): one pass then
    on_row = (rows == np.rint(rows)) & (rows >= y0) & (rows < y1)
    sides = [(yi > y) != (yj > y)] + ([(yi < y) != (yj < y)] if on_row.any() else [])
    for straddle in sides:
        r, e = np.nonzero(straddle)
        x = xi[e] + (y[r, 0] - yi[e]) * (xj[e] - xi[e]) / (yj[e] - yi[e])
        toggles = np.zeros((height, width + 1), dtype=np.uint8)
        np.add.at(toggles, (r, np.clip(np.ceil(x) - c0, 0, width).astype(np.int64)), 1)
        mask |= (np.cumsum(toggles, axis=1, dtype=np.uint8)[:, :width] & 1).astype(bool)
        near = np.abs(x - np.rint(x)) < _TIE
        tie_r.append(r[near] + y0)
        tie_c.append(np.rint(x[near]).astype(np.int64))
    vertex = (np.abs(rows - np.rint(rows)) < _TIE) & (np.abs(cols - np.rint(cols)) < _TIE)
    tie_r.append(np.rint(rows[vertex]).astype(np.int64))
    tie_c.append(np.rint(cols[vertex]).astype(np.int64))
    tr, tc = np.concatenate(tie_r), np.concatenate(tie_c)
    keep = (tr >= y0) & (tr < y1) & (tc >= c0) & (tc < c1)
    if keep.any():
        tr, tc = tr[keep], tc[keep]
        # skimage's x is the column, y the row
        points = np.column_stack([tc, tr]).astype(np.float64)
        mask[tr - y0, tc - c0] = points_in_poly(points, np.column_stack([cols, rows]))
    return mask


def _bounds(vertices: np.ndarray, shape: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """Rows ``[y0, y1)`` and columns ``[c0, c1)`` of the image a polygon can fill (None: none)."""
    lo = np.maximum(np.floor(vertices.min(axis=0) - _TIE), 0).astype(np.int64)
    hi = np.minimum(np.floor(vertices.max(axis=0) + _TIE) + 1, shape).astype(np.int64)
    if (hi <= lo).any():
        return None
    return int(lo[0]), int(hi[0]), int(lo[1]), int(hi[1])


@dataclass(frozen=True)
class PolygonTokens:
    """One polygon's pixel area and member tokens (see :func:`polygon_tokens`), kept as the
    block of the token grid it spans rather than the whole grid."""

    area_px: int
    origin: tuple[int, int]
    local: np.ndarray
    #: it fills pixels, but regions painted over it cover every one of them
    hidden: bool = False

    def member(self, grid_shape: tuple[int, int]) -> np.ndarray:
        """The member tokens on the whole ``grid_shape`` grid."""
        out = np.zeros(grid_shape, dtype=bool)
        (r, c), (h, w) = self.origin, self.local.shape
        out[r:r + h, c:c + w] = self.local
        return out


def polygon_tokens(result: Any, polygons: list[np.ndarray]) -> list[PolygonTokens]:
    """Pixel area and member tokens of each polygon, as :func:`roi_table` finds them on
    the polygons' label image, without that image.

    Parameters
    ----------
    result : AttentionResult
    polygons : list of ``(n, 2)`` arrays
        (row, col) vertices in the result's pixels (pixel centres at whole numbers), painted
        in order: a later polygon covers an earlier one where they overlap, as
        ``skimage.draw.polygon`` into one label image would.

    Returns
    -------
    list of :class:`PolygonTokens`: the pixels whose centres the polygon fills (those of
    later polygons taken out) and its member tokens by the rule of :func:`roi_tokens` (none
    when it fills no pixel). Memory: a band of :data:`BAND_PIXELS` pixels and the tokens
    each polygon spans, whatever the image's size.

    Raises
    ------
    ValueError
        Polygons that are not ``(n >= 3, 2)`` or whose boxes span more than
        :data:`MAX_RASTER_PIXELS` pixels.
    """
    shape = tuple(int(n) for n in result.image_shape)
    verts = [np.asarray(v, dtype=np.float64) for v in polygons]
    for i, v in enumerate(verts, start=1):
        if v.ndim != 2 or v.shape[1] != 2 or len(v) < 3 or not np.isfinite(v).all():
            raise ValueError(f"ROI {i} needs at least three finite (row, col) vertices.")
    boxes = [_bounds(v, shape) for v in verts]
    cost = sum((b[1] - b[0]) * (b[3] - b[2]) for b in boxes if b is not None)
    if cost > MAX_RASTER_PIXELS:
        raise ValueError(
            f"These ROIs span {cost:,} pixels of the result ({shape[0]}×{shape[1]}), more "
            f"than {MAX_RASTER_PIXELS:,} to measure here; draw smaller or fewer regions, "
            "or run at a coarser level or resolution.")
    # token row / column of every pixel: the map token_coverage counts by
    token_row, token_col = result._pixel_token_index()
    per_row = np.bincount(token_row, minlength=result.grid_shape[0])
    per_col = np.bincount(token_col, minlength=result.grid_shape[1])
    nothing = PolygonTokens(0, (0, 0), np.zeros((0, 0), dtype=bool))
    out: list[PolygonTokens] = []
    for i, (v, box) in enumerate(zip(verts, boxes)):
        if box is None:
            out.append(nothing)
            continue
        y0, y1, c0, c1 = box
        above = [(w, b) for w, b in zip(verts[i + 1:], boxes[i + 1:])
                 if b is not None and b[0] < y1 and b[1] > y0 and b[2] < c1 and b[3] > c0]
        t_col = token_col[c0:c1]
        starts = np.flatnonzero(np.r_[True, t_col[1:] != t_col[:-1]])
        tr0, tc0 = int(token_row[y0]), int(t_col[0])
        inside = np.zeros((int(token_row[y1 - 1]) - tr0 + 1, len(starts)), dtype=np.int64)
        own = 0  # its pixels before the later polygons take theirs
        # rows × columns and rows × edges of a band stay within BAND_PIXELS
        step = max(1, BAND_PIXELS // max(c1 - c0, len(v), *(len(w) for w, _ in above)))
        for b0 in range(y0, y1, step):
            b1 = min(b0 + step, y1)
            mask = _band_mask(v[:, 1], v[:, 0], b0, b1, c0, c1)
            own += int(np.count_nonzero(mask))
            for w, (wy0, wy1, _, _) in above:
                if wy0 < b1 and wy1 > b0:
                    mask &= ~_band_mask(w[:, 1], w[:, 0], b0, b1, c0, c1)
            counts = np.add.reduceat(mask, starts, axis=1, dtype=np.int64)
            np.add.at(inside, token_row[b0:b1] - tr0, counts)
        area = int(inside.sum())
        if area == 0:
            out.append(replace(nothing, hidden=own > 0))
            continue
        total = per_row[tr0:tr0 + inside.shape[0], None] * per_col[tc0:tc0 + inside.shape[1]]
        coverage = inside / np.maximum(total, 1).astype(np.float64)
        local = coverage >= MEMBERSHIP_COVERAGE
        if not local.any():  # the rule of roi_tokens: the single most-covered token
            local[np.unravel_index(np.argmax(coverage), coverage.shape)] = True
        out.append(PolygonTokens(area, (tr0, tc0), local))
    return out


def _as_block(member: np.ndarray) -> PolygonTokens:
    """A whole-grid member mask as the block of the grid it spans (``area_px`` unused)."""
    rows, cols = np.nonzero(member.any(axis=1))[0], np.nonzero(member.any(axis=0))[0]
    if rows.size == 0:
        return PolygonTokens(0, (0, 0), np.zeros((0, 0), dtype=bool))
    local = member[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    return PolygonTokens(0, (int(rows[0]), int(cols[0])), local)


def polygon_roi_table(
    result: Any,
    polygons: list[np.ndarray],
    *,
    labels: list[int] | None = None,
    tokens: list[PolygonTokens] | None = None,
    rule: str | None = None,
    p_th: float | None = None,
    l_th: float | None = None,
    z_th: float | None = None,
    q_th: float | None = None,
) -> list[dict]:
    """:func:`roi_table` of polygons, without their label image (a level-0 slide's would
    take gigabytes): the same rows as ``roi_table`` of their ``skimage.draw.polygon`` labels.

    Parameters
    ----------
    result : AttentionResult
    polygons : list of ``(n, 2)`` arrays
        (row, col) vertices in the result's pixels, pixel centres at whole numbers; a later
        polygon covers an earlier one where they overlap.
    labels : list of int, optional
        Each polygon's ROI id (default 1, 2, ...); the rows come in id order.
    tokens : list of PolygonTokens, optional
        :func:`polygon_tokens` of these polygons on this result's grid, kept from an earlier
        call (a threshold move changes the rows, not the regions' tokens).
    rule, p_th, l_th, z_th, q_th
        As :func:`roi_table`.

    Returns
    -------
    list of dict, one per polygon (unlike a label image, none vanishes): one that fills
    no pixel of the result has ``area_px`` and ``n_tokens`` 0, NaN statistics and
    ``enrichment_test_note`` :data:`NO_PIXELS`.
    """
    ids = list(range(1, len(polygons) + 1)) if labels is None else [int(k) for k in labels]
    if len(ids) != len(polygons) or len(set(ids)) != len(ids) or min(ids, default=1) < 1:
        raise ValueError("labels must give each polygon its own positive id.")
    found = polygon_tokens(result, polygons) if tokens is None else tokens
    if len(found) != len(polygons):
        raise ValueError("tokens must come from polygon_tokens of these polygons.")
    regions = ((label, t.area_px, t)
               for label, t in sorted(zip(ids, found), key=lambda pair: pair[0]))
    return _rows(result, regions, rule=rule, p_th=p_th, l_th=l_th, z_th=z_th, q_th=q_th)


#: The note of an ROI that covers only glass a tissue mask left out.
NOT_TESTED = "not tested: glass outside the tissue mask"


def _mean_tested(values: np.ndarray) -> float:
    """The mean over the tokens that were tested (NaN marks one never tested: glass a tissue
    mask left out, an attention sink left out); NaN when none of them was."""
    tested = values[~np.isnan(values)]
    return float(tested.mean()) if tested.size else math.nan


def roi_table_to_csv(rows: list[dict], path: str | Path) -> None:
    """Write :func:`roi_table` rows as CSV (header only when there are no rows)."""
    extra = [k for row in rows for k in row if k not in ROI_COLUMNS]
    fieldnames = list(ROI_COLUMNS) + list(dict.fromkeys(extra))
    with open(Path(path), "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)


#: ROI ids named in a size warning; more are counted, not listed.
LISTED_IDS = 5


def small_objects(areas_px: dict[int, float], token_scale: tuple[float, float]) -> list[int]:
    """Ids of the objects (ROIs, labels) whose area is below one token's footprint."""
    token_area = float(token_scale[0]) * float(token_scale[1])
    return [label for label, area in areas_px.items() if area < token_area]


def object_size_advice(areas_px: dict[int, float], token_scale: tuple[float, float],
                       patch_size: tuple[int, int], *, tiled: bool = False,
                       tile_scale: float = 1.0, noun: str = "ROI") -> str | None:
    """A warning when objects are smaller than one token, and what run would resolve them.

    Like cellpose's object diameter: a token (``patch × image/model`` pixels untiled, ``patch ×
    tile_scale`` tiled) larger than the objects asked about leaves each object's statistics
    resting on the single token it overlaps most.

    Parameters
    ----------
    areas_px : dict
        Object id → area in image pixels.
    token_scale : (float, float)
        One token's size in image pixels (``result.token_scale``).
    patch_size : (int, int)
        The model's patch in model pixels.
    tiled, tile_scale
        How the result was made.
    noun : str
        What the objects are called in the text.

    Returns
    -------
    str or None (no object is smaller than a token).

    Example
    -------
    >>> print(object_size_advice({1: 9.0, 2: 400.0}, (16.0, 16.0), (16, 16), tiled=True))
    1 of 2 ROIs (ROI 1) smaller than one patch (16×16 px; median diameter of those 3.4 px): \
their statistics rest on the single patch each overlaps most. Objects this size need finer \
patches than the model has: even native-resolution tiles have 16×16-px patches, so upsample \
the image before the run or choose a model with a smaller patch.
    """
    small = small_objects(areas_px, token_scale)
    if not small:
        return None
    sy, sx = token_scale
    area = float(np.median([areas_px[k] for k in small]))
    names = (f" ({noun} {', '.join(str(k) for k in small)})" if len(small) <= LISTED_IDS
             else "")
    text = (f"{len(small)} of {len(areas_px)} {noun}s{names} smaller than one patch "
            f"({sy:.3g}×{sx:.3g} px; median diameter of those "
            f"{2.0 * math.sqrt(area / math.pi):.2g} px): their statistics rest on the single "
            "patch each overlaps most.")
    return f"{text} {_finer_patches(math.sqrt(area), patch_size, tiled, tile_scale)}"


def _finer_patches(side: float, patch_size: tuple[int, int], tiled: bool,
                   tile_scale: float) -> str:
    """Which run gives patches no larger in area than an object of ``side``² pixels."""
    ph, pw = patch_size
    scale = math.floor(2.0 * side / max(ph, pw)) / 2.0  # largest tile_scale, in 0.5 steps
    if scale < 1.0:
        return ("Objects this size need finer patches than the model has: even "
                f"native-resolution tiles have {ph}×{pw}-px patches, so upsample the image "
                "before the run or choose a model with a smaller patch.")
    if not tiled:
        return (f"Run 'Tiled (native resolution)': a patch then covers {ph}×{pw} image pixels"
                + (f" ({ph * scale:g}×{pw * scale:g} with 'Downsample ×' {scale:g})."
                   if scale > 1.0 else "."))
    if tile_scale > scale:
        return (f"Lower 'Downsample ×' (now {tile_scale:g}) to {scale:g}: a patch then covers "
                f"{ph * scale:g}×{pw * scale:g} image pixels.")
    return "Choose a model with a smaller patch for objects this size."
