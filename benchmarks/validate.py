"""Validation harness: both presets side by side; regenerates docs/validation.md.

    python benchmarks/validate.py                 # full run, ~8 min on 2 idle CPU cores
    python benchmarks/validate.py --quick --out /tmp/v.md   # smoke run

Every image goes through the pipeline as a user's image does (an ndarray into the engine),
once per preset; a diagnostic third reading (the directional statistics with another π0
estimate) comes from the directional run's null maps (see validation_common.py). Localization
and the crops are also run with a second null method (``--alt-method``, default ``patch``).

1. Null calibration: the observed image is itself noise drawn, in the image's own channels,
   from the null generator's model of a synthetic field (grey, RGB, 2-channel with
   channel_axis). p (directional: p⁺) should be uniform; few inputs should have any q ≤ 0.1.
   Also a deliberately wrong null: nulls drawn per model channel for a grey image.
2. Localization of planted mitotic figures: precision / recall / F1 / IoU of every rule under
   each preset's default thresholds, vs raw attention > median and > Otsu.
3. Robustness: crops without decisive objects; one field as uint8, uint16 and float32.
4. The paper's noise-ROI simulation: D and sparsity, with our and the reference's conventions.
5. Runtime per image.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy import ndimage, stats
from skimage.filters import threshold_otsu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validation_common import (
    PRESETS,
    READINGS,
    jaccard,
    model_channel_null_scores,
    null_input,
    overlap,
    prepare,
    progress,
    run_presets,
    with_preset,
)
from validation_report import report

from napari_attnreg.core.backbones import load_backbone
from napari_attnreg.core.regularize import RULES
from napari_attnreg.core.roi import d_ratio, null_calibration, roi_percentiles, sparsity
from napari_attnreg.synthetic import TRAINING_SCALE, make_cell_image

HELD_OUT_STREAM = 7  # the demo model trained on stream 0 and was tested on stream 2
FIELD = 512
SCALE = 4 * TRAINING_SCALE
Q_ALPHA = 0.1
PI0_LOW = 0.05  # π0 at or below this: q and lfdr near 0 for every token
RUNTIMES: list[float] = []


def _field(seed, stream: int, i: int, **kw):
    kw.setdefault("hard_negatives", False)
    return make_cell_image([seed, stream, i], size=kw.pop("size", FIELD), scale=SCALE, **kw)


def _run(bb, image, args, seed: int, **kw):
    res = run_presets(bb, image, n_boot=args.n_boot, seed=seed, device=args.device, **kw)
    RUNTIMES.extend(res[p].metadata["timings"]["total_s"] for p in PRESETS)
    return res


# ---------------------------------------------------------------- 1. null calibration

CAL_CASES = {  # case → (channels of the field, keep these channels, size of the null image)
    "grey": (1, None, "model"),
    "RGB": (3, None, "model"),
    "2-channel (channel_axis=0)": (3, [0, 1], "model"),
    "grey, 512 px (downsampled by preprocessing)": (1, None, "field"),
}
WRONG = "grey, nulls per model channel (wrong)"


def _calibration_summary(results: list) -> dict:
    p = np.concatenate([r.p.ravel() for r in results])
    return {"ks": float(stats.kstest(p, "uniform").statistic), "rmsd": null_calibration(p),
            "any_q": float(np.mean([(r.q <= Q_ALPHA).any() for r in results])),
            "any_sig": float(np.mean([r.significant().any() for r in results])),
            "frac_sig": float(np.mean([r.significant().mean() for r in results])),
            "pi0": float(np.mean([r.pi0 for r in results])),
            "pi0_low": float(np.mean([r.pi0 <= PI0_LOW for r in results])), "n": len(results),
            "z_sd": (min(r.z.std() for r in results), max(r.z.std() for r in results))}


def calibration(bb, args, cases: tuple[str, ...] = tuple(CAL_CASES)) -> dict:
    """``(case, method, preset) → summary``; the wrong null rides on the grey ``normal`` inputs."""
    model_size = bb.input_size[1:]
    out = {}
    for c, (case, (channels, keep, size)) in enumerate(CAL_CASES.items()):
        if case not in cases:
            continue
        methods = ("normal",) if size == "field" else args.cal_methods
        for method in methods:
            n = args.n_cal if method == "normal" else args.n_cal_other
            got, wrong = defaultdict(list), defaultdict(list)
            for i in range(n):
                field = _field(args.seed, HELD_OUT_STREAM + 2, i, channels=channels).image
                field = field if keep is None else field[..., keep]
                rng = np.random.default_rng([args.seed, 11, c, i, len(method)])  # len: distinct
                image = null_input(field, method, rng, model_size if size == "model" else None)
                options = {}
                if keep is not None:  # a (C, H, W) multichannel image, as from a microscope file
                    image, options = np.moveaxis(image, -1, 0), {"channel_axis": 0}
                res = _run(bb, image, args, seed=i, method=method, **options)
                for name in READINGS:
                    got[name].append(res[name])
                if case == "grey" and method == "normal":
                    nulls = model_channel_null_scores(bb, prepare(bb, image), n_boot=args.n_boot, seed=i)
                    first = res["directional"]
                    bad = replace(first, null_scores=nulls.reshape(-1, *first.grid_shape))
                    for name, (preset, opts) in READINGS.items():
                        wrong[name].append(with_preset(bad, preset, **opts))
            progress(f"calibration: {case}, {method}: {n} null inputs")
            for name in READINGS:
                out[(case, method, name)] = _calibration_summary(got[name])
            for name in wrong:
                out[(WRONG, method, name)] = _calibration_summary(wrong[name])
    return out


# ---------------------------------------------------------------- 2. localization


def _with_alt_null(bb, image, args, seed: int) -> dict:
    """Readings of the default null, plus each preset under ``args.alt_method`` (if any)."""
    res = _run(bb, image, args, seed=seed)
    if args.alt_method:
        alt = _run(bb, image, args, seed=seed, method=args.alt_method)
        res.update({f"{preset} · {args.alt_method} null": alt[preset] for preset in PRESETS})
    return res


def localization(bb, args) -> tuple[dict, dict]:
    """``(reading, rule) →`` mean (precision, recall, F1, IoU); ``reading →`` diagnostics."""
    rows, diag = defaultdict(list), defaultdict(list)
    for i in range(args.n_loc):
        sample = _field(args.seed, HELD_OUT_STREAM, i, abnormal=True)
        res = _with_alt_null(bb, sample.image, args, seed=i)
        att = res["directional"].attention
        truth = res["directional"].token_coverage(sample.decisive_mask) >= 0.25
        for name, r in res.items():
            for rule in RULES:
                rows[(name, rule)].append(overlap(r.significant(rule), truth))
            sig = r.significant()
            z_null_max = float(r.null_summary["z_null_quantiles"][-1])
            diag[name].append({
                "kept": sig.sum(), "truth": truth.sum(), "fp": sig[~truth].mean(),
                "truth_q": (r.q[truth] <= Q_ALPHA).mean(), "truth_above": (r.z[truth] > z_null_max).mean(),
                "post_kept": (r.posterior >= 0.5).sum(), "post_half": (r.posterior >= 0.5).mean() > 0.5,
                "pi0": r.pi0, "pi0_low": r.pi0 <= PI0_LOW, "p_median": np.median(r.p),
                "p_max": r.p.max(), "z_sd": r.z.std()})
        rows[("raw attention", "> median")].append(overlap(att > np.median(att), truth))
        rows[("raw attention", "> Otsu")].append(overlap(att > threshold_otsu(att), truth))
        rows[("chance", "all tokens")].append(overlap(np.ones_like(truth), truth))
    progress(f"localization: {args.n_loc} fields")
    return ({k: np.mean(v, axis=0) for k, v in rows.items()},
            {k: {m: float(np.mean([d[m] for d in v])) for m in v[0]} for k, v in diag.items()})


# ---------------------------------------------------------------- 3. robustness

CROPS = {"300x300": (300, 300), "512x256": (512, 256)}
DTYPES = ("uint16", "float32", "uint8")


def _as_dtype(image: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "uint16":
        return image
    if dtype == "float32":
        return image.astype(np.float32)
    lo, hi = float(image.min()), float(image.max())  # a plain min-max conversion to 8 bit
    return np.round(255 * (image.astype(np.float64) - lo) / (hi - lo)).astype(np.uint8)


def crop_without_objects(seed: int, i: int, name: str) -> np.ndarray:
    """Crop ``name`` of held-out field ``i`` (no mitotic figures), at a random place."""
    field = _field(seed, HELD_OUT_STREAM + 3, i, abnormal=False, hard_negatives=True).image
    h, w = CROPS[name]
    y, x = np.random.default_rng([seed, 13, i, h, w]).integers(0, [FIELD - h + 1, FIELD - w + 1])
    return field[y:y + h, x:x + w]


def crops_without_objects(bb, args) -> dict:
    """``(crop, reading) →`` means of (fraction of tokens significant, any significant, π0,
    π0 ≤ 0.05, fraction with posterior ≥ 0.5, largest p, sd of z), then the worst crop's
    index and fraction significant."""
    crops = defaultdict(list)
    for i in range(args.n_crop):
        for name in CROPS:
            res = _with_alt_null(bb, crop_without_objects(args.seed, i, name), args, seed=i)
            for reading, r in res.items():
                sig = r.significant()
                crops[(name, reading)].append((
                    sig.mean(), sig.any(), r.pi0, r.pi0 <= PI0_LOW, (r.posterior >= 0.5).mean(),
                    r.p.max(), r.z.std(), i))
    progress(f"robustness: {args.n_crop} fields without mitoses, {len(CROPS)} crops each")
    out = {k: np.mean(v, axis=0) for k, v in crops.items()}
    for k, v in crops.items():  # the crop with the most significant tokens: (index, fraction)
        out[k][-1], worst = max(((c[-1], c[0]) for c in v), key=lambda t: t[1])
        out[k] = np.append(out[k], worst)
    return out


def dtype_agreement(bb, args) -> dict:
    """``(dtype, reading) →`` means of (fraction significant, Jaccard vs uint16, fraction
    with the same decision, π0)."""
    dtypes = defaultdict(list)
    for i in range(args.n_dtype):
        field = _field(args.seed, HELD_OUT_STREAM + 4, i, abnormal=True).image
        res = {d: _run(bb, _as_dtype(field, d), args, seed=i) for d in DTYPES}
        for name in READINGS:
            ref = res["uint16"][name].significant()
            for d in DTYPES:
                sig = res[d][name].significant()
                dtypes[(d, name)].append((sig.mean(), jaccard(sig, ref), float((sig == ref).mean()),
                                          res[d][name].pi0))
    progress(f"robustness: {args.n_dtype} fields as {', '.join(DTYPES)}")
    return {k: np.mean(v, axis=0) for k, v in dtypes.items()}


# ---------------------------------------------------------------- 4. noise-ROI simulation


def diffuse_roi(shape: tuple[int, int], k: int, rng: np.random.Generator) -> np.ndarray:
    """Top-k² pixels of a Gaussian-smoothed random field (the paper's diffuse ROI)."""
    field = ndimage.gaussian_filter(rng.standard_normal(shape), sigma=max(shape) / 16)
    cut = np.partition(field.ravel(), field.size - k * k)[field.size - k * k]
    return field >= cut


def _square_roi(shape: tuple[int, int], k: int, rng: np.random.Generator) -> np.ndarray:
    y, x = rng.integers(0, shape[0] - k, size=2)
    roi = np.zeros(shape, bool)
    roi[y:y + k, x:x + k] = True
    return roi


# D's variants: (grid, ties). "token"/"half" is ours; "pixel"/"zero" the reference code's.
CONVENTIONS = (("token", "half"), ("pixel", "half"), ("pixel", "zero"))


def noise_simulation(bb, args, side_fraction: float = 0.25) -> dict:
    rng = np.random.default_rng([args.seed, 17])
    k = int(FIELD * side_fraction)
    acc = defaultdict(list)  # (shape, preset, rule) → [(reg pcts per convention, raw pcts, sparsity)]
    for i in range(args.n_sim):
        image = _field(args.seed, HELD_OUT_STREAM + 1, i).image.astype(np.float64)
        for shape, make_roi in (("square", _square_roi), ("diffuse", diffuse_roi)):
            roi = make_roi(image.shape, k, rng)
            noisy = image.copy()
            noisy[roi] = rng.normal(image.mean(), image.std(), size=int(roi.sum()))
            res = _run(bb, np.clip(noisy, 0, None), args, seed=i)
            any_res = res["directional"]
            roi_tok = any_res.token_coverage(roi) >= 0.5
            if not roi_tok.any() or roi_tok.all():
                continue
            grids = {"token": (any_res.attention, roi_tok, lambda m: m),
                     "pixel": (any_res.to_pixels(any_res.attention), roi, any_res.to_pixels)}
            raw = [roi_percentiles(grids[g][0], grids[g][0], grids[g][1], ties=t).mean()
                   for g, t in CONVENTIONS]
            for name, r in res.items():
                for rule in RULES:
                    reg = r.regularized(rule)
                    pct = [roi_percentiles(grids[g][2](reg), grids[g][0], grids[g][1], ties=t).mean()
                           for g, t in CONVENTIONS]
                    acc[(shape, name, rule)].append((pct, raw, sparsity(reg, roi_tok)))
        if (i + 1) % 5 == 0 or i + 1 == args.n_sim:
            progress(f"noise simulation: {i + 1}/{args.n_sim} fields")
    out = {}
    for key, items in acc.items():
        reg = np.array([it[0] for it in items])
        raw = np.array([it[1] for it in items])
        ours = d_ratio(reg[:, 0], raw[:, 0])
        pixel_half = d_ratio(reg[:, 1], raw[:, 1])
        reference = d_ratio(reg[:, 2], raw[:, 2], covariance=False)
        ours_no_cov = d_ratio(reg[:, 0], raw[:, 0], covariance=False)
        out[key] = {"ours": ours, "ours_no_cov": ours_no_cov, "pixel_half": pixel_half,
                    "reference": reference,
                    "sparsity": float(np.mean([it[2] for it in items])), "n": len(items)}
    return out


# ---------------------------------------------------------------- main


def source_version() -> str:
    """The commit of the package source, and whether it had uncommitted changes."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=root, text=True,
                               capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted changes in src/" if dirty else "")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--n-boot", type=int, default=100)
    ap.add_argument("--n-cal", type=int, default=20, help="null inputs per case, method normal")
    ap.add_argument("--n-cal-other", type=int, default=6, help="null inputs per case, other methods")
    ap.add_argument("--cal-methods", default="normal,pixel,uniform")
    ap.add_argument("--alt-method", default="patch",
                    help="a second null method for localization and crops ('' for none)")
    ap.add_argument("--n-loc", type=int, default=16)
    ap.add_argument("--n-crop", type=int, default=6)
    ap.add_argument("--n-dtype", type=int, default=4)
    ap.add_argument("--n-sim", type=int, default=12)
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run in well under a minute (B = 10, one or two images per part)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "validation.md")
    args = ap.parse_args(argv)
    if args.quick:
        args.n_boot, args.n_cal, args.n_cal_other, args.cal_methods = 10, 2, 1, "normal"
        args.n_loc, args.n_crop, args.n_dtype, args.n_sim = 1, 1, 1, 2
    args.cal_methods = tuple(args.cal_methods.split(","))
    return args


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    bb = load_backbone(args.model)
    RUNTIMES.clear()
    t0 = time.perf_counter()
    cal = calibration(bb, args)
    loc, loc_diag = localization(bb, args)
    crops, dtypes = crops_without_objects(bb, args), dtype_agreement(bb, args)
    sim = noise_simulation(bb, args)
    text = report(args, argv if argv is not None else sys.argv[1:], source=source_version(),
                  cal=cal, loc=loc, loc_diag=loc_diag,
                  crops=crops, dtypes=dtypes, sim=sim, runtimes=RUNTIMES,
                  seconds=time.perf_counter() - t0, model_desc=bb.describe())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
