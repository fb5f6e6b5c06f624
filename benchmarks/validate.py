"""Validation harness: the three presets side by side on the test articles (docs/validation.md).

    python benchmarks/validate.py --article demo      # one article → benchmarks/results/*.json
    python benchmarks/validate.py --article phantom
    python benchmarks/validate.py --article dinov2    # real model (built on first use), real images
    python benchmarks/validate.py --report            # docs/validation.md from the JSON files
    python benchmarks/validate_maps.py --article demo # every map: the articles × maps table
    python benchmarks/validate.py --article demo --quick --json /tmp/q.json   # smoke run

Every image goes through the engine as a user's image does (an ndarray, once per preset),
drawn from generator streams nothing else used (validation_articles.HELD_OUT):

1. Noise inputs given as images: white noise, grey and RGB, at the model's input size and
   larger (the preprocessing shrinks them). A true null: the map-level p should be uniform,
   and at most 10 % of inputs should have any significant patch.
2. Structured noise: a field's spectrum and grey levels with random phases (no objects).
3. Crops without decisive objects: share of patches significant, and of evidence ≥ 0.5.
4. Planted objects: F1 of each preset's default rule against raw attention > Otsu, with a
   95 % bootstrap CI of the paired difference; the pointing game (share of images whose
   most significant patch lies on an object; raw attention's top patch beside it) and the
   object recall (objects with a significant patch on them). On dinov2 these images are
   the composites: a real object pasted into an object-free region of another image.
5. Tiled mosaics (≥ 2048²): objects planted in a few fields of several mosaics (recall
   with its 95 % CI, and how many objects the model's own attention puts first in a tile),
   and pure noise.
6. The paper's noise-ROI simulation: D for a square of noise pasted into a field.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import ndimage, stats
from skimage.filters import threshold_otsu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validation_articles import ARTICLES, HELD_OUT, mosaic, noise_image, texture_like
from validation_common import most_significant, overlap, progress, source_version

from napari_attnreg.core.run.engine import RunConfig, drain, run_engine
from napari_attnreg.core.stats.paper import StatisticsWarning
from napari_attnreg.core.stats.roi import d_ratio, roi_percentiles

PRESETS = ("stepdown", "directional", "paper")
RESULTS = Path(__file__).resolve().parent / "results"
RUNTIMES: dict[str, list[float]] = defaultdict(list)


def run(bb, image, preset: str, args, seed: int, **options):
    """One engine run of an ndarray image under ``preset`` (its defaults)."""
    cfg = RunConfig(preset=preset, n_boot=options.pop("n_boot", args.n_boot), seed=seed,
                    device=args.device, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StatisticsWarning)
        result = drain(run_engine(image, bb, cfg))
    RUNTIMES[preset].append(result.metadata["timings"]["total_s"])
    return result


def _map_p(result) -> float:
    """The map-level p of a result; the other presets: their smallest token p (no KS)."""
    return result.p_map if result.p_map is not None else float(result.p.min())


def _ks(values, n_boot: int | None = None) -> float | None:
    """KS p-value of p-values against U(0, 1).

    Counting p-values ``(1 + c)/(B + 1)`` are discrete (and conservative); with ``n_boot``
    they are randomized first, ``p − U/(B + 1)``, which is exactly uniform under the null.
    Tail p-values (not on that grid) are continuous and stay as they are.
    """
    if len(values) < 2:
        return None
    p = np.asarray(values, dtype=np.float64)
    if n_boot:
        grid = np.isclose(p * (n_boot + 1), np.round(p * (n_boot + 1)), rtol=0, atol=1e-6)
        jitter = np.random.default_rng(12345).random(p.size) / (n_boot + 1)
        p = np.where(grid, p - jitter, p)
    return float(stats.kstest(p, "uniform").pvalue)


def _n(args, preset: str, count: int) -> int:
    """Stepdown gets the full count; the presets it is compared with a third (at least 2)."""
    return count if preset == "stepdown" else max(2, count // 3)


# ---------------------------------------------------------------- 1-2. null inputs


def noise_inputs(art, bb, args) -> dict:
    side = bb.input_size[1]
    cases = {"grey, native": (False, side), "grey, resized": (False, int(2.5 * side)),
             "RGB, native": (True, side), "RGB, resized": (True, int(2.5 * side))}
    out = {}
    for preset in args.presets:
        for c, (case, (rgb, size)) in enumerate(cases.items()):
            rows = []
            for i in range(_n(args, preset, args.n_noise)):
                reference = art.field(args.noise_stream, i, False).image
                rng = np.random.default_rng([args.noise_stream, c, i])
                r = run(bb, noise_image(reference, rng, size, rgb), preset, args, seed=i)
                rows.append((_map_p(r), bool(r.significant().any()), float(r.significant().mean()),
                             r.p.ravel()))
            out[f"{case}|{preset}"] = null_summary(rows, preset, args.n_boot)
        progress(f"{art.name}: noise inputs under {preset}")
    for preset in args.presets:  # pooled over the four cases
        parts = [out[f"{case}|{preset}"] for case in cases]
        out[f"all noise inputs|{preset}"] = {
            "n": sum(p["n"] for p in parts), "map_p": sum((p["map_p"] for p in parts), []),
            "any_sig": float(np.average([p["any_sig"] for p in parts], weights=[p["n"] for p in parts])),
            "frac_sig": float(np.mean([p["frac_sig"] for p in parts]))}
        if preset == "stepdown":
            out[f"all noise inputs|{preset}"]["ks_map_p"] = _ks(
                out[f"all noise inputs|{preset}"]["map_p"], args.n_boot)
    return out


def null_summary(rows, preset: str, n_boot: int) -> dict:
    """Null-input summary; a map-level p (and its KS) only where the preset has one."""
    map_p = [r[0] for r in rows]
    tokens = np.concatenate([r[3] for r in rows])
    return {"n": len(rows), "map_p": map_p,
            "ks_map_p": _ks(map_p, n_boot) if preset == "stepdown" else None,
            "ks_tokens": float(stats.kstest(tokens, "uniform").statistic),
            "any_sig": float(np.mean([r[1] for r in rows])),
            "frac_sig": float(np.mean([r[2] for r in rows]))}


def structured_noise(art, bb, args) -> dict:
    out = {}
    for preset in args.presets:
        rows = []
        for i in range(_n(args, preset, args.n_texture)):
            field = art.field(HELD_OUT["texture"], i, False).image
            image = texture_like(field, np.random.default_rng([HELD_OUT["texture"], i]))
            r = run(bb, image, preset, args, seed=i)
            rows.append((_map_p(r), bool(r.significant().any()), float(r.significant().mean()),
                         r.p.ravel()))
        out[preset] = null_summary(rows, preset, args.n_boot)
    progress(f"{art.name}: structured noise")
    return out


# ---------------------------------------------------------------- 3. empty crops


def patch_kinds(art, result, labels: np.ndarray) -> np.ndarray:
    """What lies under each patch of an empty crop (the article's kinds of region)."""
    coverage = {int(v): result.token_coverage(labels == v) for v in np.unique(labels)}
    return art.kinds(coverage)


def empty_crops(art, bb, args) -> dict:
    out = {}
    side = int(0.6 * art.field_size)
    for preset in args.presets:
        sig, evidence = [], []
        kinds_all, kinds_sig = defaultdict(int), defaultdict(int)
        for i in range(_n(args, preset, args.n_crop)):
            r = run(bb, art.empty_crop(i, side), preset, args, seed=i)
            mask = r.significant()
            sig.append(float(mask.mean()))
            evidence.append(float((r.posterior >= 0.5).mean()))
            kinds = patch_kinds(art, r, art.empty_crop_regions(i, side))
            for kind, n in zip(*np.unique(kinds, return_counts=True)):
                kinds_all[str(kind)] += int(n)
            for kind in kinds[mask]:
                kinds_sig[str(kind)] += 1
        out[preset] = {"n": len(sig), "mean_sig": float(np.mean(sig)), "worst_sig": float(np.max(sig)),
                       "evidence_half": float(np.mean(evidence)),
                       "worst_evidence_half": float(np.max(evidence)),
                       "patch_kinds": dict(kinds_all), "significant_kinds": dict(kinds_sig)}
    progress(f"{art.name}: crops without decisive objects ({art.crop_label(side)})")
    return out


# ---------------------------------------------------------------- 4. localization


def bootstrap_ci(values: np.ndarray, rng: np.random.Generator, n: int = 4000) -> tuple[float, float]:
    """95 % percentile bootstrap CI of the mean."""
    means = rng.choice(values, size=(n, values.size), replace=True).mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def _on_object(r, tokens: np.ndarray | None, decisive: np.ndarray) -> bool:
    """Does any pixel of these tokens lie on a decisive object? (False for no token)"""
    return tokens is not None and bool(r.to_pixels(tokens)[decisive].any())


def _objects_found(r, decisive: np.ndarray) -> tuple[int, int]:
    """Objects (connected parts of the mask) with a significant patch on them, and all."""
    labels, n = ndimage.label(decisive)
    sig_px = r.to_pixels(r.significant())
    return int(sum(sig_px[labels == k].any() for k in range(1, n + 1))), n


def _pointing(rows: list[tuple[bool, int, int]]) -> dict:
    """Pointing game and object recall, each with its exact 95 % binomial CI."""
    hits = sum(row[0] for row in rows)
    found, total = sum(row[1] for row in rows), sum(row[2] for row in rows)
    ci = stats.binomtest(hits, len(rows)).proportion_ci(0.95, "exact")
    out = {"pointing": hits / len(rows), "pointing_ci": [ci.low, ci.high],
           "objects": total, "objects_found": found}
    if total:
        rci = stats.binomtest(found, total).proportion_ci(0.95, "exact")
        out.update(object_recall=found / total, object_recall_ci=[rci.low, rci.high])
    return out


def localization(art, bb, args) -> dict:
    fields = [art.field(HELD_OUT["fields"], i, True) for i in range(args.n_loc)]
    otsu, top_att, out = [], [], {}
    for preset in args.presets:
        scores, deltas, pointing = [], [], []
        for i, f in enumerate(fields):
            r = run(bb, f.image, preset, args, seed=i)
            truth = r.token_coverage(f.decisive) >= 0.25
            mine = overlap(r.significant(), truth)
            if preset == args.presets[0]:
                att = r.attention
                otsu.append(overlap(att > threshold_otsu(att), truth))
                top_att.append(_on_object(r, att == att.max(), f.decisive))
            scores.append(mine)
            deltas.append(mine[2] - otsu[i][2])
            pointing.append((_on_object(r, most_significant(r), f.decisive),
                             *_objects_found(r, f.decisive)))
        deltas = np.asarray(deltas)
        out[preset] = {"n": len(fields), "precision": float(np.mean([s[0] for s in scores])),
                       "recall": float(np.mean([s[1] for s in scores])),
                       "f1": float(np.mean([s[2] for s in scores])),
                       "delta_f1": float(deltas.mean()),
                       "delta_ci": bootstrap_ci(deltas, np.random.default_rng(7)),
                       **_pointing(pointing)}
        progress(f"{art.name}: localization under {preset}")
    out["otsu"] = {"precision": float(np.mean([s[0] for s in otsu])),
                   "recall": float(np.mean([s[1] for s in otsu])),
                   "f1": float(np.mean([s[2] for s in otsu])),
                   "pointing_top_attention": float(np.mean(top_att))}
    return out


# ---------------------------------------------------------------- 5. tiled mosaics


def _tiles_with_objects(r, decisive: np.ndarray) -> np.ndarray:
    """Per tile of a tiled result: does its region hold any decisive pixel?"""
    md = r.metadata
    th, tw = md["tile_shape"]
    ys, xs = md["tile_origins_y"], md["tile_origins_x"]
    sy, sx = r.image_shape[0] / r.model_shape[0], r.image_shape[1] / r.model_shape[1]
    return np.array([decisive[int(y * sy):int((y + th) * sy), int(x * sx):int((x + tw) * sx)].any()
                     for y in ys for x in xs])


def _under_top_patch(r, labels: np.ndarray, n_objects: int) -> int | None:
    """How many objects lie under the most attended patch of some tile that holds them.

    The model's own ceiling for a tiled run: a step-down can only reach an object after
    every patch its tile attends to more. ``None`` for presets without tile families.
    """
    steps = r.null_summary.get("stepdown_step_token")
    if steps is None:
        return None
    top = np.zeros(r.significant().size, bool)
    top[np.asarray(steps)[:, 0]] = True
    top_px = r.to_pixels(top.reshape(r.significant().shape))
    return int(sum(top_px[labels == k].any() for k in range(1, n_objects + 1)))


def _planted_mosaic(art, args, index: int):
    # the first mosaic keeps the stream of the single-mosaic validation it replaced
    key = [HELD_OUT["mosaic"], 1] if index == 0 else [HELD_OUT["mosaic"], 1, index]
    return mosaic(art, index, args.mosaic, args.mosaic_objects, np.random.default_rng(key))


def _planted_row(r, planted) -> dict:
    """Objects found, and significant tiles with and without objects, in one planted mosaic."""
    labels, n_objects = ndimage.label(planted.decisive)
    sig_px = r.to_pixels(r.significant())
    row = {"objects": n_objects,
           "found": int(sum(sig_px[labels == k].any() for k in range(1, n_objects + 1))),
           "n_tiles": r.metadata["n_tiles"], "sig_tokens": int(r.significant().sum()),
           "seconds": r.metadata["timings"]["total_s"]}
    family = r.null_summary.get("stepdown_family")
    if family is not None:
        has_obj = _tiles_with_objects(r, planted.decisive)
        tile_sig = np.zeros(r.metadata["n_tiles"], bool)
        tile_sig[np.unique(np.asarray(family).reshape(-1)[r.significant().reshape(-1)])] = True
        row.update(object_tiles=int(has_obj.sum()), object_tiles_sig=int((tile_sig & has_obj).sum()),
                   empty_tiles=int((~has_obj).sum()), empty_tiles_sig=int((tile_sig & ~has_obj).sum()),
                   under_top_patch=_under_top_patch(r, labels, n_objects))
    return row


def _sum_rows(rows: list[dict]) -> dict:
    """Totals over the planted mosaics, the per-mosaic rows kept, and the recall's 95 % CI."""
    total = {k: sum(row[k] for row in rows) for k in rows[0]
             if k != "n_tiles" and all(isinstance(row.get(k), (int, float)) for row in rows)}
    total.update(mosaics=len(rows), n_tiles=rows[0]["n_tiles"], per_mosaic=rows)
    if total["objects"]:
        ci = stats.binomtest(total["found"], total["objects"]).proportion_ci(0.95, "exact")
        total["recall"], total["recall_ci"] = total["found"] / total["objects"], [ci.low, ci.high]
    return total


def tiled(art, bb, args) -> dict:
    out = {}
    planted = [_planted_mosaic(art, args, i) for i in range(args.n_mosaics)]
    for preset in args.presets:
        rows = []
        for i, image in enumerate(planted[:_n(args, preset, args.n_mosaics)]):
            r = run(bb, image.image, preset, args, seed=i, tiled=True, n_boot=args.n_boot_tiled)
            rows.append(_planted_row(r, image))
        out[f"planted|{preset}"] = _sum_rows(rows)
        tile_p, any_sig = [], []
        for m in range(_n(args, preset, args.n_noise_mosaics)):
            ref = art.field(HELD_OUT["mosaic"], 90_000 + m, False).image
            noise = noise_image(ref, np.random.default_rng([HELD_OUT["mosaic"], 2, m]),
                                args.mosaic, rgb=False)
            rn = run(bb, noise, preset, args, seed=m, tiled=True, n_boot=args.n_boot_tiled)
            any_sig.append(bool(rn.significant().any()))
            tile_p.extend(np.asarray(rn.null_summary.get("stepdown_family_p", [])).tolist())
        out[f"noise|{preset}"] = {"n": len(any_sig), "any_sig": float(np.mean(any_sig)),
                                  "tile_p_ks": _ks(tile_p, args.n_boot_tiled),
                                  "n_tile_p": len(tile_p),
                                  "tile_p_min": float(min(tile_p)) if tile_p else None}
        progress(f"{art.name}: tiled mosaics under {preset}")
    return out


# ---------------------------------------------------------------- 6. noise-ROI simulation


def simulation(art, bb, args) -> dict:
    rng = np.random.default_rng([HELD_OUT["simulation"], 0])
    acc = defaultdict(list)
    for i in range(args.n_sim):
        image = art.field(HELD_OUT["simulation"], i, False).image.astype(np.float64)
        k = image.shape[0] // 4
        y, x = rng.integers(0, image.shape[0] - k, size=2)
        roi = np.zeros(image.shape, bool)
        roi[y:y + k, x:x + k] = True
        noisy = image.copy()
        noisy[roi] = rng.normal(image.mean(), image.std(), size=int(roi.sum()))
        for preset in args.presets:
            r = run(bb, np.clip(noisy, 0, None).astype(np.float32), preset, args, seed=i)
            roi_tok = r.token_coverage(roi) >= 0.5
            raw = roi_percentiles(r.attention, r.attention, roi_tok).mean()
            reg = roi_percentiles(r.regularized(), r.attention, roi_tok).mean()
            acc[preset].append((reg, raw))
    progress(f"{art.name}: noise-ROI simulation")
    return {p: dict(zip(("d", "d_err"), d_ratio(*np.array(v).T))) | {"n": len(v)}
            for p, v in acc.items()}


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--article", choices=tuple(ARTICLES))
    ap.add_argument("--report", action="store_true", help="write docs/validation.md from the "
                    "results in benchmarks/results (articles and maps)")
    ap.add_argument("--n-boot", type=int, default=100)
    ap.add_argument("--n-boot-tiled", type=int, default=200)
    ap.add_argument("--n-noise", type=int, default=20, help="noise inputs per case (stepdown)")
    ap.add_argument("--noise-stream", type=int, default=HELD_OUT["noise"],
                    help="generator stream of the noise inputs (another stream re-measures "
                         "with fresh images; write it elsewhere with --json)")
    ap.add_argument("--n-texture", type=int, default=15)
    ap.add_argument("--n-crop", type=int, default=20)
    ap.add_argument("--n-loc", type=int, default=48)
    ap.add_argument("--n-sim", type=int, default=8)
    ap.add_argument("--mosaic", type=int, default=2048)
    ap.add_argument("--mosaic-objects", type=int, default=3,
                    help="fields with decisive objects in each planted mosaic")
    ap.add_argument("--n-mosaics", type=int, default=12,
                    help="planted mosaics (stepdown; the other presets a third, at least 2)")
    ap.add_argument("--n-noise-mosaics", type=int, default=10)
    ap.add_argument("--presets", default=",".join(PRESETS),
                    help="presets to run (comma-separated; a subset is for re-measures "
                         "written elsewhere with --json: the report needs all three)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="a smoke run (B = 20, few images)")
    ap.add_argument("--json", type=Path, help="where the article's results go")
    ap.add_argument("--sections", default=None,
                    help="run only these sections and keep the others of an existing result "
                         f"file (comma-separated from {', '.join(SECTIONS)}; default: all "
                         "that apply to the article)")
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parents[1] / "docs" / "validation.md")
    args = ap.parse_args(argv)
    if args.quick:
        args.n_boot, args.n_boot_tiled, args.n_noise, args.n_texture = 20, 20, 3, 3
        args.n_crop, args.n_loc, args.n_sim, args.mosaic, args.n_noise_mosaics = 3, 3, 3, 1024, 3
        args.n_mosaics = 2
    args.presets = tuple(p for p in args.presets.split(",") if p)
    if not args.presets or set(args.presets) - set(PRESETS):
        ap.error(f"--presets takes names from {', '.join(PRESETS)}")
    if not args.report and not args.article:
        ap.error("give --article NAME (or --report)")
    return args


SECTIONS = {"noise": noise_inputs, "texture": structured_noise, "crops": empty_crops,
            "localization": localization, "tiled": tiled, "simulation": simulation}


def validate_article(args) -> dict:
    art = ARTICLES[args.article]
    applicable = art.sections or tuple(SECTIONS)
    bb = art.backbone()
    RUNTIMES.clear()
    path = args.json or RESULTS / f"validation_{art.name}.json"
    wanted = [name for name in (args.sections or ",".join(applicable)).split(",") if name]
    unknown = set(wanted) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown sections {sorted(unknown)}; use {', '.join(SECTIONS)}")
    if set(wanted) - set(applicable):
        raise SystemExit(f"the {art.name} article has no {sorted(set(wanted) - set(applicable))} "
                         f"section; it has {', '.join(applicable)}")
    partial = set(wanted) != set(applicable)
    results = json.loads(path.read_text()) if partial and path.is_file() else {}
    t0 = time.perf_counter()
    results.update({"article": art.name, "description": art.description, "model": bb.describe(),
                    "n_boot": args.n_boot, "n_boot_tiled": args.n_boot_tiled,
                    "source": source_version()})
    results["argv" if not partial else "argv_" + "_".join(wanted)] = sys.argv[1:]
    for name in wanted:
        results[name] = SECTIONS[name](art, bb, args)
    results["seconds" if not partial else "seconds_" + "_".join(wanted)] = time.perf_counter() - t0
    # the images differ by section: the medians say which sections they were timed on
    results["runtime_median_s"] = {p: float(np.median(v)) for p, v in RUNTIMES.items()}
    results["runtime_sections"] = wanted
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=float) + "\n")
    progress(f"wrote {path}")
    return results


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.article:
        validate_article(args)
    if args.report:
        from validation_report import write_report

        write_report(RESULTS, args.out)


if __name__ == "__main__":
    main()
