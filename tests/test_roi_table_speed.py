"""The ROI table's rows from whole-map totals kept between threshold moves are the rows of the
plain per-region computation (each region's outside copied out of the whole map), and a
threshold move no longer copies the whole map per region."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from scipy.stats import fisher_exact

from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.stats import roi as R

SIDE = 1400  # pixels; 100 x 100 tokens of 14 px
ENRICHMENT = ("attention_enrichment", "attention_enrichment_low", "attention_enrichment_high")


def _result(seed: int, *, glass: bool = False, dtype=np.float32, side: int = SIDE,
            evidence_dtype=None) -> AttentionResult:
    g = side // 14
    rng = np.random.default_rng(seed)
    att = rng.gamma(2.0, size=(g, g)).astype(dtype)
    att[g // 2, : g // 4] = att[g // 2, 0]  # ties across the map
    p = (rng.uniform(size=(g, g)) ** 3).astype(dtype)
    lfdr = rng.uniform(size=(g, g)).astype(dtype)
    posterior = (1 - lfdr).astype(evidence_dtype or dtype)
    summary = {}
    if glass:  # a masked tiled run: the top third is glass, never tested (NaN evidence)
        posterior[: g // 3] = np.nan
        att[: g // 3] = 0
        summary = {"tissue_tiles": 7}
    return AttentionResult(
        attention=att, maps=dict(z=rng.normal(size=(g, g)).astype(dtype), p=p, lfdr=lfdr,
                                 posterior=posterior, q=p),
        pi0=0.5, thresholds={"rule": "p", "z_th": 0.0, "p_th": 0.05, "l_th": 0.3},
        image_shape=(side, side), model_shape=(g * 14, g * 14), patch_size=(14, 14),
        null_summary=summary)


def _blob(cy, cx, r, n=40):
    t = np.linspace(0, 2 * np.pi, n, endpoint=False)
    rr = r * (1 + 0.25 * np.sin(5 * t))
    return np.column_stack([cy + rr * np.sin(t), cx + rr * np.cos(t)])


def _box(y0, x0, y1, x1):
    return np.array([[y0, x0], [y0, x1], [y1, x1], [y1, x0]], dtype=float)


REGION_SETS = {
    "blobs": [_blob(700, 500, 300), _blob(1000, 1000, 120), _blob(720, 520, 60),
              _blob(1300, 200, 5)],
    "no pixel and glass": [np.array([[800.1, 400.1], [800.1, 400.4], [800.4, 400.4]]),
                           _box(20, 20, 300, 1300), _box(300, 600, 900, 900),
                           _box(5000, 5000, 6000, 6000)],
    # most of the map, with holes cut by later regions; then all of it
    "large": [_box(0, 0, 1300, 1350), _blob(600, 600, 200), _box(0, 0, SIDE, SIDE)],
}


def _reference(result, members, areas, hidden=(), **t):
    """The per-region rows as computed before: every region's outside taken from the whole
    (glass-free) map, its percentiles by mean_percentile (the outside sorted anew)."""
    significant = np.asarray(result.significant(**t), dtype=bool)
    regularized = np.asarray(result.regularized(**t), dtype=np.float64)
    attention = np.asarray(result.attention, dtype=np.float64)
    posterior = np.asarray(result.evidence, dtype=np.float64)
    tested = ~np.isnan(posterior) if "tissue_tiles" in result.null_summary else \
        np.ones(posterior.shape, bool)
    sig, reg, att, post = (v[tested] for v in (significant, regularized, attention, posterior))
    rows = []
    for label, (member, area) in enumerate(zip(members, areas), start=1):
        if area == 0:
            rows.append({"label": label, "area_px": 0, "n_tokens": 0,
                         "enrichment_test_note": R.HIDDEN if label in hidden else R.NO_PIXELS})
            continue
        m = member[tested]
        if not m.any():
            rows.append({"label": label, "area_px": area, "n_tokens": 0,
                         "enrichment_test_note": R.NOT_TESTED})
            continue
        table = np.array([[np.sum(sig & m), np.sum(~sig & m)],
                          [np.sum(sig & ~m), np.sum(~sig & ~m)]])
        pct = ((R.mean_percentile(v, att, m) for v in (att, reg)) if (~m).any()
               else (math.nan, math.nan))
        tested_post = post[m][~np.isnan(post[m])]
        rows.append({
            "label": label, "area_px": area, "n_tokens": int(m.sum()),
            "mean_attention": float(att[m].mean()),
            **dict(zip(ENRICHMENT, R.attention_enrichment(att, m))),
            "mean_regularized": float(reg[m].mean()),
            "mean_posterior": float(tested_post.mean()) if tested_post.size else math.nan,
            "frac_significant": float(sig[m].mean()),
            **dict(zip(("mean_pct_raw", "mean_pct_regularized"), pct)),
            **dict(zip(("odds_ratio", "odds_ratio_low", "odds_ratio_high"),
                       R._odds_ratio(table))),
            "fisher_p": float(fisher_exact(table).pvalue),
            "enrichment_test_note": R.TOO_FEW_SIGNIFICANT
            if sig.sum() < R.MIN_SIGNIFICANT_FOR_ENRICHMENT else "",
        })
    return rows


def _assert_same(rows, want):
    assert [r["label"] for r in rows] == [r["label"] for r in want]
    for row, exp in zip(rows, want):
        for key in R.ROI_COLUMNS:
            got, value = row[key], exp.get(key, math.nan)
            if isinstance(value, float) and math.isnan(value):
                assert isinstance(got, float) and math.isnan(got), (exp["label"], key, got)
            elif key in ENRICHMENT:
                # the outside's mean and variance come from whole-map totals less the
                # region's: the same numbers, summed in another order (last-bit rounding)
                assert got == pytest.approx(value, rel=1e-12, abs=0), (exp["label"], key)
            else:
                assert got == value and type(got) is type(value), (exp["label"], key, got, value)


CASES = [
    pytest.param(dict(seed=0), id="float32"),
    pytest.param(dict(seed=1, glass=True), id="glass"),
    pytest.param(dict(seed=2, dtype=np.float64), id="float64"),
    pytest.param(dict(seed=3, glass=True, evidence_dtype=np.float64), id="glass-f64-evidence"),
]
THRESHOLDS = [{}, {"p_th": 0.002}, {"rule": "soft"}, {"rule": "lfdr", "l_th": 0.2}]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("regions", list(REGION_SETS))
def test_polygon_rows_equal_the_per_region_computation(case, regions):
    result = _result(**case)
    polygons = REGION_SETS[regions]
    tokens = R.polygon_tokens(result, polygons)
    members = [t.member(result.grid_shape) for t in tokens]
    for t in THRESHOLDS:  # threshold moves reuse the map's totals
        rows = R.polygon_roi_table(result, polygons, tokens=tokens, **t)
        hidden = [k for k, t_ in enumerate(tokens, start=1) if t_.hidden]
        _assert_same(rows, _reference(result, members, [t_.area_px for t_ in tokens],
                                      hidden, **t))


@pytest.mark.parametrize("case", CASES[:2])
def test_label_rows_equal_the_per_region_computation(case):
    from skimage.draw import polygon as fill

    result = _result(**case)
    labels = np.zeros(result.image_shape, dtype=np.int64)
    for k, v in enumerate(REGION_SETS["blobs"] + [_box(20, 20, 300, 1300)], start=1):
        rr, cc = fill(v[:, 0], v[:, 1], labels.shape)
        labels[rr, cc] = k
    members = [R.roi_tokens(result, labels == k) for k in range(1, labels.max() + 1)]
    areas = [int((labels == k).sum()) for k in range(1, labels.max() + 1)]
    for t in THRESHOLDS[:2]:
        _assert_same(R.roi_table(result, labels, **t), _reference(result, members, areas, **t))


def test_a_threshold_move_does_not_copy_the_map_per_region():
    """On a 700 x 700 grid the table of a threshold move took 24 MiB (float64 copies of the
    whole map for every region's outside): now less than two of them, whatever the regions."""
    result = _result(4, side=9800)
    polygons = [_blob(3000, 3500, 1500, 200), _blob(7000, 2500, 600, 100),
                _blob(8000, 8000, 90), _blob(3100, 3700, 300)]
    tokens = R.polygon_tokens(result, polygons)
    R.polygon_roi_table(result, polygons, tokens=tokens)  # the map's totals, once
    result.significant(p_th=0.01)  # the mask napari's layers have drawn already
    tracemalloc.start()
    try:
        R.polygon_roi_table(result, polygons, tokens=tokens, p_th=0.01)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * result.attention.size * 8, f"{peak / 2**20:.1f} MiB"


def test_map_totals_are_kept_while_the_maps_live():
    result = _result(5)
    first = R._map_totals(result)
    assert R._map_totals(result.with_thresholds(p_th=0.01)) is first  # same maps
    other = _result(5)
    assert R._map_totals(other) is not first
