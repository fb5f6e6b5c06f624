"""ROI measures (docs/method.md) and the per-ROI table."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from scipy.stats import fisher_exact, percentileofscore

from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.stats import roi as R

# 2 x 3 token grid, patch 4, image 8 x 12 (one token = a 4 x 4 pixel block)
ATT = np.array([[0.30, 0.05, 0.20], [0.10, 0.25, 0.10]])
Z = np.array([[2.0, -1.0, 1.5], [0.2, 1.8, 0.1]])
P = np.array([[0.01, 0.70, 0.04], [0.50, 0.02, 0.40]])
LFDR = np.array([[0.05, 1.00, 0.20], [0.90, 0.10, 0.80]])


def make_result(image_shape=(8, 12), rule="p") -> AttentionResult:
    return AttentionResult(
        attention=ATT, maps=dict(z=Z, p=P, lfdr=LFDR, posterior=1 - LFDR, q=P), pi0=0.5,
        thresholds={"rule": rule, "z_th": 0.0, "p_th": 0.05, "l_th": 0.3},
        image_shape=image_shape, model_shape=(8, 12), patch_size=(4, 4),
    )


# ------------------------------------------------------------ measures


def test_sparsity():
    m = np.array([[0.0, 0.2], [0.0, 0.0]])
    assert R.sparsity(m) == 25.0
    assert R.sparsity(m, np.array([[False, True], [False, False]])) == 100.0
    with pytest.raises(ValueError, match="empty"):
        R.sparsity(m, np.zeros((2, 2), bool))


def test_percentiles_match_scipy_and_a_literal_loop():
    rng = np.random.default_rng(0)
    raw = np.round(rng.uniform(size=(7, 9)), 1)  # coarse values: many ties
    scores = np.where(rng.uniform(size=raw.shape) < 0.4, 0.0, raw)  # a "regularized" map
    roi = rng.uniform(size=raw.shape) < 0.3
    outside = raw[~roi]
    expected = [percentileofscore(outside, v, kind="mean") for v in scores[roi]]
    np.testing.assert_allclose(R.roi_percentiles(scores, raw, roi), expected, atol=1e-12)
    total = 0.0
    for v in scores[roi]:
        below = sum(1 for o in outside if o < v)
        equal = sum(1 for o in outside if o == v)
        total += 100.0 * (below + 0.5 * equal) / len(outside)
    assert R.mean_percentile(scores, raw, roi) == pytest.approx(total / roi.sum(), abs=1e-12)


def test_mean_percentile_by_hand():
    raw = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    roi = np.array([False, False, False, True, True])
    assert R.mean_percentile(raw, raw, roi) == 100.0  # 4 and 5 beat 1, 2, 3
    reg = np.array([1.0, 2.0, 3.0, 0.0, 2.0])
    # 0 -> 0 %, 2 -> (1 below + 0.5 tie) / 3 = 50 %
    assert R.mean_percentile(reg, raw, roi) == pytest.approx(25.0)
    with pytest.raises(ValueError, match="outside"):
        R.mean_percentile(raw, raw, np.ones(5, bool))


def test_percentile_ties_conventions_by_hand():
    raw = np.array([1.0, 2.0, 2.0, 3.0, 2.0, 0.5])
    roi = np.array([False, False, False, False, True, True])
    # outside: 1, 2, 2, 3. ROI score 2: 1 below and 2 equal; 0.5: nothing below or equal
    np.testing.assert_allclose(R.roi_percentiles(raw, raw, roi), [100 * (1 + 1.0) / 4, 0.0])
    np.testing.assert_allclose(R.roi_percentiles(raw, raw, roi, ties="zero"), [25.0, 0.0])
    assert R.mean_percentile(raw, raw, roi) == pytest.approx(25.0)
    assert R.mean_percentile(raw, raw, roi, ties="zero") == pytest.approx(12.5)
    # a score equal to every outside score: 50 (half) or 0 (zero)
    flat, one = np.array([4.0, 4.0, 4.0]), np.array([True, False, False])
    assert R.mean_percentile(flat, flat, one) == 50.0
    assert R.mean_percentile(flat, flat, one, ties="zero") == 0.0
    # without ties both conventions agree
    distinct = np.array([1.0, 2.0, 3.0, 2.5])
    last = np.array([False, False, False, True])
    assert R.mean_percentile(distinct, distinct, last, ties="zero") == pytest.approx(
        R.mean_percentile(distinct, distinct, last)) == pytest.approx(200 / 3)
    np.testing.assert_allclose(
        R.roi_percentiles(raw, raw, roi, ties="zero"),
        [percentileofscore(raw[~roi], v, kind="strict") for v in raw[roi]])
    with pytest.raises(ValueError, match="ties"):
        R.roi_percentiles(raw, raw, roi, ties="mean")


def test_d_ratio_without_covariance_by_hand():
    reg = np.array([1.0, 3.0])
    raw = np.array([2.0, 4.0])
    # R = 4, W = 6, D = 2/3; n·s² of each = 2·2 = 4, n·cov = 2·2 = 4
    d, err = R.d_ratio(reg, raw)
    assert d == pytest.approx(2 / 3)
    assert err == pytest.approx((2 / 3) * math.sqrt(4 / 16 + 4 / 36 - 2 * 4 / 24))
    d0, err0 = R.d_ratio(reg, raw, covariance=False)
    assert d0 == d
    assert err0 == pytest.approx((2 / 3) * math.sqrt(4 / 16 + 4 / 36))
    assert err0 > err  # positively correlated sums: the covariance term shrinks the error


def test_d_ratio_and_delta_method_error():
    reg = np.array([20.0, 35.0, 28.0, 40.0])
    raw = np.array([60.0, 70.0, 55.0, 80.0])
    d, err = R.d_ratio(reg, raw)
    assert d == pytest.approx(reg.sum() / raw.sum())
    # delta method with the gradient of R/W written out
    n, rs, ws = reg.size, reg.sum(), raw.sum()
    grad = np.array([1 / ws, -rs / ws**2])
    cov = n * np.cov(np.vstack([reg, raw]))
    assert err == pytest.approx(math.sqrt(grad @ cov @ grad))
    d1, err1 = R.d_ratio([10.0], [20.0])
    assert d1 == 0.5 and math.isnan(err1)
    with pytest.raises(ValueError):
        R.d_ratio([1.0, 2.0], [0.0, 0.0])
    with pytest.raises(ValueError):
        R.d_ratio([1.0], [1.0, 2.0])


def test_null_calibration_sign_and_size():
    n = 200
    uniform = (np.arange(1, n + 1) - 0.5) / n
    assert R.null_calibration(uniform) == pytest.approx(0.0, abs=1e-15)
    assert R.null_calibration(uniform**2) > 0.05  # p-values pushed to 0: inflation
    assert R.null_calibration(np.sqrt(uniform)) < -0.05  # conservative


# ------------------------------------------------------------ table


def labels_8x12() -> np.ndarray:
    labels = np.zeros((8, 12), np.int32)
    labels[0:4, 0:4] = 1  # token (0,0) fully ...
    labels[0:2, 4] = 1  # ... plus 2 of token (0,1)'s 16 pixels: not a member
    labels[5:7, 9:11] = 7  # 4 pixels of token (1,2): coverage 0.25, fallback member
    labels[4:8, 0:8] = 3  # tokens (1,0) and (1,1)
    return labels


def test_roi_table_by_hand():
    result = make_result()
    rows = R.roi_table(result, labels_8x12())
    assert [r["label"] for r in rows] == [1, 3, 7]
    assert all(list(r) == list(R.ROI_COLUMNS) for r in rows)
    # rule "p", p_th 0.05, z_th 0: significant tokens (0,0), (0,2), (1,1)
    sig = np.array([[True, False, True], [False, True, False]])
    np.testing.assert_array_equal(result.significant(), sig)

    r1, r3, r7 = rows
    assert (r1["area_px"], r1["n_tokens"]) == (18, 1)
    assert r1["mean_attention"] == 0.30 and r1["mean_regularized"] == 0.30
    assert r1["mean_posterior"] == pytest.approx(0.95)
    assert r1["frac_significant"] == 1.0
    assert r1["mean_pct_raw"] == 100.0  # 0.30 is the largest token
    assert r1["mean_pct_regularized"] == 100.0
    # inside: 1 sig, 0 not; outside: 2 sig, 3 not -> every inside token significant: inf
    assert r1["odds_ratio"] == math.inf and r1["odds_ratio_high"] == math.inf
    assert 0 < r1["odds_ratio_low"] < 1
    assert r1["fisher_p"] == pytest.approx(fisher_exact([[1, 0], [2, 3]]).pvalue)

    assert (r3["area_px"], r3["n_tokens"]) == (32, 2)
    assert r3["mean_attention"] == pytest.approx(0.175)
    assert r3["mean_regularized"] == pytest.approx(0.125)  # (0 + 0.25) / 2
    assert r3["frac_significant"] == 0.5
    # outside raw: 0.30, 0.05, 0.20, 0.10; inside 0.10 -> (1 + 0.5)/4, 0.25 -> 3/4
    assert r3["mean_pct_raw"] == pytest.approx((37.5 + 75.0) / 2)
    # regularized inside: 0 -> 0 %, 0.25 -> 75 %
    assert r3["mean_pct_regularized"] == pytest.approx(37.5)
    assert r3["odds_ratio"] == pytest.approx(1.0)  # [[1, 1], [2, 2]]: no association
    assert r3["odds_ratio_low"] < 1 < r3["odds_ratio_high"]
    assert r3["fisher_p"] == pytest.approx(fisher_exact([[1, 1], [2, 2]]).pvalue)

    assert (r7["area_px"], r7["n_tokens"]) == (4, 1)
    assert r7["mean_attention"] == 0.10 and r7["frac_significant"] == 0.0
    # no significant token inside: the odds ratio is 0, not a Haldane-corrected positive value
    assert r7["odds_ratio"] == 0.0 and r7["odds_ratio_low"] == 0.0


def test_roi_table_rule_override_and_bool_labels():
    result = make_result()
    mask = np.zeros((8, 12), bool)
    mask[4:8, 0:8] = True
    (row,) = R.roi_table(result, mask, rule="base")
    assert row["label"] == 1 and row["frac_significant"] == 1.0  # both z >= 0
    (row,) = R.roi_table(result, mask, rule="base", z_th=1.0)
    assert row["frac_significant"] == 0.5


def test_roi_covering_everything_has_no_percentile():
    (row,) = R.roi_table(make_result(), np.ones((8, 12), np.uint8))
    assert row["n_tokens"] == 6 and math.isnan(row["mean_pct_raw"])
    assert row["fisher_p"] == 1.0 and math.isnan(row["odds_ratio"])  # nothing outside


def test_roi_membership_with_non_integer_token_scale():
    # image 10 x 15 resized to 8 x 12 for the model: one token = 5 x 5 original pixels
    result = make_result(image_shape=(10, 15))
    labels = np.zeros((10, 15), np.int64)
    labels[5:10, 10:15] = 2
    (row,) = R.roi_table(result, labels)
    assert row["n_tokens"] == 1 and row["mean_attention"] == ATT[1, 2]


@pytest.mark.parametrize(
    "labels, match",
    [(np.zeros((8, 11), int), "original image"), (np.zeros((8, 12), float), "integer")],
)
def test_roi_table_bad_labels(labels, match):
    with pytest.raises(ValueError, match=match):
        R.roi_table(make_result(), labels)


def test_empty_labels_give_no_rows():
    assert R.roi_table(make_result(), np.zeros((8, 12), int)) == []


def test_csv_round_trip(tmp_path):
    rows = R.roi_table(make_result(), labels_8x12())
    path = tmp_path / "rois.csv"
    R.roi_table_to_csv(rows, path)
    with open(path, newline="") as handle:
        back = list(csv.DictReader(handle))
    assert [int(r["label"]) for r in back] == [1, 3, 7]
    assert float(back[1]["mean_pct_raw"]) == rows[1]["mean_pct_raw"]
    assert list(back[0]) == list(R.ROI_COLUMNS)
    R.roi_table_to_csv([], tmp_path / "empty.csv")
    assert (tmp_path / "empty.csv").read_text().strip() == ",".join(R.ROI_COLUMNS)


# ------------------------------------------------------------ attention enrichment


def test_attention_enrichment_by_hand():
    # inside (0,0), (1,1): 0.30, 0.25; outside 0.05, 0.20, 0.10, 0.10
    member = np.array([[True, False, False], [False, True, False]])
    ratio, low, high = R.attention_enrichment(ATT, member)
    m_in, m_out = 0.275, 0.1125
    assert ratio == pytest.approx(m_in / m_out)
    s_in, s_out = np.var([0.30, 0.25], ddof=1), np.var([0.05, 0.20, 0.10, 0.10], ddof=1)
    se = math.sqrt(s_in / (2 * m_in**2) + s_out / (4 * m_out**2))
    assert low == pytest.approx(ratio * math.exp(-1.959964 * se))
    assert high == pytest.approx(ratio * math.exp(1.959964 * se))
    assert low < ratio < high
    # the interval is symmetric on the log scale
    assert math.log(ratio) - math.log(low) == pytest.approx(math.log(high) - math.log(ratio))


def test_attention_enrichment_covers_the_true_ratio_about_95_percent_of_the_time():
    # independent tokens: inside mean 2, outside mean 1 -> true ratio 2
    rng = np.random.default_rng(3)
    member = np.zeros(400, bool)
    member[:60] = True
    hits = 0
    for _ in range(400):
        attention = np.where(member, rng.gamma(4.0, 0.5, 400), rng.gamma(4.0, 0.25, 400))
        _, low, high = R.attention_enrichment(attention, member)
        hits += low <= 2.0 <= high
    assert 0.91 <= hits / 400 <= 0.985


def test_attention_enrichment_edge_cases():
    att = np.array([0.0, 0.0, 0.5, 0.5])
    ratio, low, high = R.attention_enrichment(att, np.array([True, True, False, False]))
    assert ratio == 0.0 and math.isnan(low) and math.isnan(high)  # no attention inside
    assert all(math.isnan(v) for v in R.attention_enrichment(att, np.ones(4, bool)))
    ratio, low, _ = R.attention_enrichment(att, np.array([False, False, True, False]))
    assert ratio == pytest.approx(0.5 / (0.5 / 3)) and math.isnan(low)  # one token inside


def test_roi_table_has_the_enrichment_interval_and_flags_too_few_significant(tmp_path):
    result = make_result()  # 3 significant tokens: fewer than 5
    rows = R.roi_table(result, labels_8x12())
    r3 = rows[1]  # tokens (1, 0) and (1, 1)
    expected = R.attention_enrichment(ATT, np.array([[False] * 3, [True, True, False]]))
    assert (r3["attention_enrichment"], r3["attention_enrichment_low"],
            r3["attention_enrichment_high"]) == pytest.approx(expected)
    assert r3["attention_enrichment"] == pytest.approx(0.175 / 0.1625)
    assert all(r["enrichment_test_note"] == R.TOO_FEW_SIGNIFICANT for r in rows)
    # every token significant (rule "base", z >= -1): the test has enough to say something
    many = R.roi_table(result, labels_8x12(), rule="base", z_th=-1.0)
    assert all(r["enrichment_test_note"] == "" for r in many)
    R.roi_table_to_csv(rows, tmp_path / "rois.csv")
    with open(tmp_path / "rois.csv", newline="") as handle:
        back = list(csv.DictReader(handle))
    assert float(back[1]["attention_enrichment_low"]) == pytest.approx(expected[1])
    assert back[0]["enrichment_test_note"] == R.TOO_FEW_SIGNIFICANT


@pytest.mark.parametrize(("spatial", "per_pixel"), [
    ({"scale": [0.5, 0.25], "units": ["micrometer", "micrometer"]}, 0.125),  # napari (pint)
    ({"scale": [0.2, 0.2], "units": ["mm", "mm"]}, 40_000.0),  # a DICOM's PixelSpacing
    ({"scale": [0.5, 0.5], "units": ["µm", "µm"]}, 0.25),  # a slide's microns per pixel
    ({"scale": [2.0, 2.0], "units": ["pixel", "pixel"]}, math.nan),  # no physical size
    (None, math.nan),
])
def test_roi_area_in_square_micrometres_from_the_pixel_size(spatial, per_pixel):
    # the table gave pixels only: an analyst with a calibrated image had to convert by hand
    result = make_result()
    if spatial is not None:
        result.metadata["spatial"] = {**spatial, "translate": [0.0, 0.0]}
    rows = R.roi_table(result, labels_8x12())
    polygons = R.polygon_roi_table(result, [np.array([[-0.5, -0.5], [-0.5, 3.5], [3.5, 3.5],
                                                      [3.5, -0.5]])])
    for row in [*rows, *polygons]:
        np.testing.assert_allclose(row["area_um2"], row["area_px"] * per_pixel)
    assert rows[0]["area_px"] == 18 and polygons[0]["area_px"] == 16
