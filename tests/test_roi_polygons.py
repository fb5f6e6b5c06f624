"""ROI statistics of polygons without their label image: the same rows as roi_table of the
label image where both apply, every region a row, memory bounded by the regions."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from skimage.draw import polygon as fill_polygon

from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.stats import roi as R


def make_result(grid=(7, 9), image_shape=(61, 83), glass=None, seed=0) -> AttentionResult:
    """A result whose tokens are 61/7 × 83/9 pixels (not whole numbers), maps at random."""
    rng = np.random.default_rng(seed)
    attention = rng.gamma(2.0, size=grid)
    p = rng.uniform(size=grid) ** 3  # a fair share significant
    lfdr = rng.uniform(size=grid)
    posterior = 1 - lfdr
    summary = {}
    if glass is not None:
        posterior = np.where(glass, np.nan, posterior)
        summary["tissue_tiles"] = (~glass).tolist()
    return AttentionResult(
        attention=attention, maps=dict(z=rng.normal(size=grid), p=p, lfdr=lfdr,
                                       posterior=posterior, q=p),
        pi0=0.5, thresholds={"rule": "p", "z_th": 0.0, "p_th": 0.2, "l_th": 0.3},
        image_shape=image_shape, model_shape=(grid[0] * 4, grid[1] * 4), patch_size=(4, 4),
        null_summary=summary)


def label_image(polygons, shape) -> np.ndarray:
    """The label path: each polygon painted by skimage over the earlier ones."""
    labels = np.zeros(shape, dtype=np.int32)
    for label, v in enumerate(polygons, start=1):
        rr, cc = fill_polygon(v[:, 0], v[:, 1], shape=shape)
        labels[rr, cc] = label
    return labels


def same_rows(got: list[dict], want: list[dict]) -> None:
    assert [r["label"] for r in got] == [r["label"] for r in want]
    for g, w in zip(got, want):
        assert set(g) == set(w)
        for key, value in w.items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(g[key]), (w["label"], key, g[key])
            else:
                assert g[key] == value, (w["label"], key, g[key], value)


SHAPES = {
    "rectangle on whole pixels": [[3, 4], [3, 30], [20, 30], [20, 4]],
    "rectangle on pixel edges": [[10.5, 40.5], [10.5, 60.5], [35.5, 60.5], [35.5, 40.5]],
    "concave polygon": [[30.2, 10.7], [55.9, 14.1], [41.3, 25.0], [58.6, 39.4], [27.7, 33.3]],
    "past the image's edges": [[-9.0, 70.2], [-4.0, 95.0], [70.0, 91.5], [48.3, 66.0]],
    "self-intersecting bow tie": [[40, 45], [58, 75], [40, 75], [58, 45]],
    "smaller than a token": [[25.2, 50.3], [25.2, 52.8], [27.9, 52.8], [27.9, 50.3]],
    "one pixel centre": [[12.6, 70.6], [12.6, 71.4], [13.4, 71.4], [13.4, 70.6]],
}


def test_polygon_rows_equal_the_label_image_rows_shape_by_shape():
    result = make_result()
    for name, vertices in SHAPES.items():
        polygons = [np.asarray(vertices, dtype=float)]
        want = R.roi_table(result, label_image(polygons, result.image_shape))
        assert len(want) == 1, name
        same_rows(R.polygon_roi_table(result, polygons), want)


def test_overlapping_polygons_later_over_earlier_and_thresholds_passed_on():
    result = make_result(seed=1)
    polygons = [np.asarray(v, dtype=float) for v in SHAPES.values()]
    labels = label_image(polygons, result.image_shape)
    for thresholds in ({}, {"rule": "lfdr", "l_th": 0.5}, {"p_th": 0.01}):
        same_rows(R.polygon_roi_table(result, polygons, **thresholds),
                  R.roi_table(result, labels, **thresholds))
    # ids of the caller's own (e.g. a napari layer's shapes), rows in id order
    rows = R.polygon_roi_table(result, polygons[:2], labels=[5, 3])
    assert [r["label"] for r in rows] == [3, 5]
    assert rows[1]["area_px"] == R.polygon_roi_table(result, polygons[:1])[0]["area_px"]


def test_random_polygons_on_a_masked_tiled_result_give_the_label_image_rows():
    rng = np.random.default_rng(7)
    glass = np.zeros((7, 9), dtype=bool)
    glass[:, 6:] = True  # the right third never run
    result = make_result(glass=glass, seed=2)
    for _ in range(12):
        polygons = [rng.uniform(-5, 88, size=(rng.integers(3, 9), 2)) for _ in range(3)]
        polygons += [np.round(rng.uniform(0, 60, size=(4, 2)))]  # vertices on pixel centres
        labels = label_image(polygons, result.image_shape)
        want = R.roi_table(result, labels)
        got = [row for row in R.polygon_roi_table(result, polygons) if row["area_px"]]
        same_rows(got, want)


def test_a_region_on_glass_alone_is_not_tested():
    glass = np.zeros((7, 9), dtype=bool)
    glass[:, 6:] = True
    result = make_result(glass=glass)
    on_glass = [np.array([[5.0, 65.0], [5.0, 80.0], [40.0, 80.0], [40.0, 65.0]])]
    (row,) = R.polygon_roi_table(result, on_glass)
    same_rows([row], R.roi_table(result, label_image(on_glass, result.image_shape)))
    assert row["n_tokens"] == 0 and row["enrichment_test_note"] == R.NOT_TESTED


def test_a_region_covering_no_pixel_gets_a_row_that_says_so():
    result = make_result()
    # between pixel centres (a region drawn on a finer level than the result analysed),
    # and one drawn over entirely by a later region: the label image loses both
    tiny = np.array([[10.1, 10.1], [10.1, 10.9], [10.9, 10.9], [10.9, 10.1]])
    hidden = np.array([[30.0, 30.0], [30.0, 33.0], [33.0, 33.0], [33.0, 30.0]])
    cover = np.array([[28.0, 28.0], [28.0, 36.0], [36.0, 36.0], [36.0, 28.0]])
    polygons = [tiny, hidden, cover]
    assert [r["label"] for r in R.roi_table(result, label_image(polygons, (61, 83)))] == [3]
    rows = R.polygon_roi_table(result, polygons)
    assert [r["label"] for r in rows] == [1, 2, 3]
    for row in rows[:2]:
        assert row["area_px"] == 0 and row["n_tokens"] == 0
        assert math.isnan(row["mean_attention"]) and math.isnan(row["fisher_p"])
    # each says why: too small for this level, or covered by the region drawn over it
    assert rows[0]["enrichment_test_note"] == R.NO_PIXELS
    assert rows[1]["enrichment_test_note"] == R.HIDDEN
    assert rows[2]["n_tokens"] >= 1


def test_tokens_kept_from_an_earlier_call_give_the_same_rows():
    result = make_result()
    polygons = [np.asarray(v, dtype=float) for v in SHAPES.values()]
    tokens = R.polygon_tokens(result, polygons)
    same_rows(R.polygon_roi_table(result, polygons, tokens=tokens, p_th=0.1),
              R.polygon_roi_table(result, polygons, p_th=0.1))
    with pytest.raises(ValueError, match="polygon_tokens"):
        R.polygon_roi_table(result, polygons, tokens=tokens[:1])


@pytest.mark.parametrize(("polygons", "labels", "match"), [
    ([np.zeros((2, 2))], None, "three finite"),
    ([np.array([[0, 0], [0, np.nan], [5, 5]])], None, "three finite"),
    ([np.ones((3, 2)), np.ones((3, 2))], [1, 1], "own positive id"),
])
def test_bad_polygons_are_refused(polygons, labels, match):
    with pytest.raises(ValueError, match=match):
        R.polygon_roi_table(make_result(), polygons, labels=labels)


def test_regions_too_large_to_rasterize_say_what_to_do(monkeypatch):
    monkeypatch.setattr(R, "MAX_RASTER_PIXELS", 1000)
    with pytest.raises(ValueError, match="coarser level"):
        R.polygon_roi_table(make_result(), [np.array([[0, 0], [0, 82], [60, 82.0]])])


def test_memory_scales_with_the_regions_not_a_whole_slide():
    # a level-0 whole slide of 50,000² pixels (tokens of 500 px to keep the maps small):
    # its label image alone would be 2.5 G pixels
    result = make_result(grid=(100, 100), image_shape=(50_000, 50_000))
    polygons = [np.array([[1199.5, 2999.5], [1199.5, 4999.5], [3999.5, 4999.5],
                          [3999.5, 2999.5]]),
                np.array([[20_000.3, 20_000.7], [23_000.1, 21_500.2], [21_000.9, 24_000.4]])]
    tracemalloc.start()
    rows = R.polygon_roi_table(result, polygons)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**20, peak
    assert rows[0]["area_px"] == 2800 * 2000  # rows 1200..3999, cols 3000..4999
    assert rows[0]["n_tokens"] == 6 * 4  # tokens of 500 px at least half inside
    assert 0 < rows[1]["area_px"] < 3000 * 4000 / 2


def test_the_odds_ratio_interval_of_a_large_table_is_fast_and_close_to_the_exact_one():
    # a level-0 ROI holds 10⁵ tokens or more: the exact interval took over a minute per ROI
    from scipy.stats.contingency import odds_ratio

    table = np.array([[600, 1900], [4000, 20000]])  # smallest margin 2,500 > 2,000
    ratio, low, high = R._odds_ratio(table)
    exact = odds_ratio(table, kind="conditional")
    ci = exact.confidence_interval(0.95)
    assert ratio == exact.statistic
    half = R._Z95 * math.sqrt(np.sum(1.0 / table))
    assert (low, high) == pytest.approx((ratio * math.exp(-half), ratio * math.exp(half)),
                                        rel=1e-12)
    assert (low, high) == pytest.approx((ci.low, ci.high), rel=0.01)
    # small tables keep the exact interval
    small = np.array([[60, 190], [400, 2000]])
    ci = odds_ratio(small, kind="conditional").confidence_interval(0.95)
    assert R._odds_ratio(small)[1:] == (ci.low, ci.high)


def test_the_table_percentiles_are_mean_percentile_to_the_bit():
    # the table sorts the map once for all ROIs; its values stay mean_percentile's
    result = make_result(grid=(12, 14), image_shape=(48, 56), seed=3)
    result.attention[:] = np.round(result.attention, 1)  # ties
    labels = np.zeros((48, 56), dtype=np.int32)
    labels[4:20, 8:30], labels[30:47, 2:12], labels[0:48, 40:56] = 1, 2, 3
    attention, regularized = result.attention, result.regularized()
    for row in R.roi_table(result, labels):
        member = R.roi_tokens(result, labels == row["label"])
        assert row["mean_pct_raw"] == R.mean_percentile(attention, attention, member)
        assert row["mean_pct_regularized"] == R.mean_percentile(regularized, attention, member)
