"""Calibration and detection of tiled runs of slides with the automatic tissue mask.

    python benchmarks/validate_slides.py --quick                      # a small CPU run
    python benchmarks/validate_slides.py --json benchmarks/results/slide_calibration_cpu.json
    python benchmarks/validate_slides.py --report benchmarks/results/slide_calibration_cpu.json

A slide here is an Aperio SVS written with tifffile (level 0, a thumbnail, a level at 1/4):
tissue made of a test article's own native-scale fields without decisive objects, laid out
as the tiled mosaics of ``validate.py`` are, cut to an irregular region (a smoothed random
field thresholded to the wanted area: lobes, islands and ragged edges that cross tiles), the
rest glass (near-white with mild noise). It is run as a user runs a slide:
``napari_attnreg.regularize(path, tiled=True, level=0, tissue_mask="auto")``, through the
slide reader (:func:`~napari_attnreg.io.slides.open_slide`) and the lazy tiled path, so only
the tiles the automatic mask keeps are run and enter the BH family, and the null tiles of
the default "image" scope are drawn with their centre on tissue.

The same tissue (the same mosaic) is run with every glass share, 0 % glass included, so
that the effect of the glass alone is seen. Per model, preset and glass share:

1. Null slides (no decisive object): the share of slides with ANY significant token and its
   exact 95 % binomial CI (the aim: at most 10 %), and the KS p of the tissue tiles'
   family p-values (step-down preset; counting p-values randomized onto U(0, 1) as in
   ``validate.py``). Presets without tile families: the KS distance of the tested tokens'
   p (tokens are correlated: a distance, not a test).
2. Planted slides (decisive objects in a few fields inside the tissue): objects found (a
   significant token on them) with the recall's CI, significant tokens on glass (must be 0).
3. Edge tiles (tissue and glass both at least 5 % of the tile) against interior tiles (at
   most 1 % glass) in the null slides: the share of tiles with a significant token.
Also the mask: truth-tissue tiles the automatic mask left out, glass tiles it kept.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import ndimage, stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validation_articles import ARTICLES
from validation_common import progress, source_version

PRESETS = ("stepdown", "directional", "paper")
#: generator stream of the slides' fields (training used 0, the held-out test split 2, the
#: directional validation 7-10, validate.py 21-26): nothing else draws from it
STREAM = 27
#: glass level and noise (8-bit): near-white, mild grain
GLASS, GLASS_SD = 232.0, 3.0
#: how each article's grey levels are stored as 8 bits: a fixed linear map, the same for every
#: slide, from its darkest to its brightest levels (air, background; the brightest nuclei of
#: the brightest fields: nothing is clipped, a mitotic figure of a bright field reaches 1,500)
#: to DARKEST..TISSUE_TOP: tissue darker than the glass and lighter than black, as on a
#: brightfield slide (the mask leaves pixels below 20 % of white out as ink or labels)
TO_8BIT = {"demo": (95.0, 2600.0), "phantom": (-1030.0, 700.0), "dinov2": (0.0, 255.0)}
DARKEST, TISSUE_TOP = 60.0, 200.0
#: slide side in pixels (whole tiles of each model with its default overlap)
SIDE = {"demo": 1024, "phantom": 1344, "dinov2": 1344}
EDGE_MIN = 0.05  # a tile is an edge tile when tissue and glass are each at least this share
INTERIOR_MAX_GLASS = 0.01


# ---------------------------------------------------------------- slides


def _as_8bit(image: np.ndarray, article: str) -> np.ndarray:
    lo, hi = TO_8BIT[article]
    scaled = DARKEST + (np.asarray(image, np.float64) - lo) / (hi - lo) * (TISSUE_TOP - DARKEST)
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def _cell(art, index: int, abnormal: bool, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A native field of the article as an RGB uint8 cell of ``size``² and its object mask."""
    from skimage.transform import resize

    f = art.native_field(STREAM, index, abnormal)
    image, mask = _as_8bit(f.image, art.name), f.decisive
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=-1)
    image = image[..., :3]
    if image.shape[:2] != (size, size):  # the real article's regions differ in size
        image = resize(image, (size, size), preserve_range=True, anti_aliasing=True)
        image = np.clip(np.rint(image), 0, 255).astype(np.uint8)
        mask = resize(mask.astype(float), (size, size), order=1) >= 0.5
    return image, mask


def tissue_mosaic(art, slide: int, side: int,
                  with_objects: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """A ``side``² RGB mosaic of the article's native fields (a grid of cells of the field's
    size, C order); the cells ``with_objects`` hold decisive objects."""
    fs = art.native_size
    n = -(-side // fs)
    image = np.zeros((n * fs, n * fs, 3), np.uint8)
    mask = np.zeros((n * fs, n * fs), bool)
    for cell in range(n * n):
        f, m = _cell(art, slide * 1000 + cell, cell in with_objects, fs)
        y, x = divmod(cell, n)
        image[y * fs:(y + 1) * fs, x * fs:(x + 1) * fs] = f
        mask[y * fs:(y + 1) * fs, x * fs:(x + 1) * fs] = m
    return image[:side, :side], mask[:side, :side]


def object_cells(tissue: np.ndarray, cell: int, planted: int,
                 rng: np.random.Generator) -> set[int]:
    """``planted`` cells of the mosaic grid drawn among those at least 30 % tissue (the ones
    with the most tissue when too few are): objects are planted in the tissue."""
    n = -(-tissue.shape[0] // cell)
    share = np.array([tissue[y * cell:(y + 1) * cell, x * cell:(x + 1) * cell].mean()
                      for y in range(n) for x in range(n)])
    candidates = np.flatnonzero(share >= 0.3)
    if candidates.size < planted:
        candidates = np.argsort(-share)[:planted]
    return set(rng.choice(candidates, size=min(planted, candidates.size), replace=False).tolist())


def tissue_region(side: int, glass: float, rng_key: list[int]) -> np.ndarray:
    """Tissue of an irregular shape covering ``1 - glass`` of the slide (all of it at 0).

    A smoothed random field thresholded at its quantile: one seed gives nested regions for
    every glass share (the same tissue, more or less of it under glass)."""
    if glass <= 0:
        return np.ones((side, side), bool)
    field = np.random.default_rng(rng_key).normal(size=(side // 8, side // 8))
    field = ndimage.gaussian_filter(field, side / 8 / 10, mode="wrap")
    # a centre bias, so the tissue is a section with lobes more than scattered islands
    yy, xx = np.mgrid[:field.shape[0], :field.shape[1]] / field.shape[0] - 0.5
    field = field / field.std() - 1.5 * np.hypot(yy, xx)
    small = field > np.quantile(field, glass)
    return np.kron(small, np.ones((8, 8), bool)).astype(bool)[:side, :side]


def glass_pixels(shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    glass = rng.normal(GLASS, GLASS_SD, (*shape, 1)) + rng.normal(0, 1.0, (*shape, 3))
    return np.clip(np.rint(glass), 0, 255).astype(np.uint8)


def write_svs(path: Path, img: np.ndarray, mpp: float = 0.5) -> None:
    """An Aperio SVS: level 0 tiled, a thumbnail, level 1/4 tiled."""
    import tifffile

    h, w = img.shape[:2]

    def desc(ww: int, hh: int) -> str:
        return (f"Aperio Image Library v10.0.50\n{ww}x{hh} [0,0 {ww}x{hh}] (256x256) RAW/RGB"
                f"|AppMag = 20|MPP = {mpp}")

    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=desc(w, h), photometric="rgb", metadata=None)
        tif.write(img[::16, ::16].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)
        small = img[::4, ::4].copy()
        tif.write(small, tile=(256, 256), description=desc(small.shape[1], small.shape[0]),
                  photometric="rgb", metadata=None)


class Slide:
    """One slide: its pixels, where the tissue truly is, and its decisive objects."""

    def __init__(self, image: np.ndarray, tissue: np.ndarray, objects: np.ndarray,
                 planted: bool) -> None:
        self.image, self.tissue, self.objects, self.planted = image, tissue, objects, planted


def make_slides(art, index: int, side: int, glass_shares: tuple[float, ...],
                planted: int = 0) -> dict[float, Slide]:
    """The same tissue (mosaic ``index``) under every glass share; ``planted`` fields with
    objects (planted slides use other fields than the null ones: their own index range)."""
    regions = {g: tissue_region(side, g, [STREAM, 1, index, planted]) for g in glass_shares}
    # the regions are nested: objects in the tissue of the most glass are in every one's
    cells = (object_cells(regions[max(glass_shares)], art.native_size, planted,
                          np.random.default_rng([STREAM, 0, index, planted])) if planted else set())
    mosaic, objects = tissue_mosaic(art, index + (500 if planted else 0), side, cells)
    glass = glass_pixels((side, side), np.random.default_rng([STREAM, 2, index, planted]))
    return {g: Slide(np.where(tissue[..., None], mosaic, glass), tissue, objects & tissue,
                     planted=bool(planted)) for g, tissue in regions.items()}


# ---------------------------------------------------------------- one run


def run_slide(bb, slide: Slide, preset: str, n_boot: int, seed: int, workdir: Path,
              in_memory: bool = False, **options) -> dict:
    """Write the slide as an SVS, run it as a user does, and measure it against the truth.

    ``in_memory``: the slide's array itself, tiled without a mask (the raw reference)."""
    from napari_attnreg import regularize
    from napari_attnreg.core.stats.paper import StatisticsWarning

    path = workdir / "slide.svs"
    if in_memory:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StatisticsWarning)
            r = regularize(slide.image, bb, tiled=True, tissue_mask="none", preset=preset,
                           n_boot=n_boot, seed=seed, device="cpu", **options)
        return _measure(r, slide, seed, 0.0)
    write_svs(path, slide.image)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StatisticsWarning)
            r = regularize(str(path), bb, tiled=True, level=0, tissue_mask="auto", preset=preset,
                           n_boot=n_boot, seed=seed, device="cpu", **options)
    except ValueError as error:  # the automatic mask found no tissue: the run is refused
        if "No tile is at least" not in str(error):
            raise
        path.unlink()
        return {"refused": str(error), "tissue_share": float(slide.tissue.mean())}
    seconds = time.perf_counter() - t0
    path.unlink()
    return _measure(r, slide, seed, seconds)


def _measure(r, slide: Slide, seed: int, seconds: float) -> dict:
    """A result against the slide's truth (tissue, objects)."""
    md, summary = r.metadata, r.null_summary
    sig = r.significant()
    (th, tw), ys, xs = md["tile_shape"], md["tile_origins_y"], md["tile_origins_x"]
    kept = np.asarray(summary.get("tissue_tiles", np.ones(len(ys) * len(xs))), bool)
    # the pixels of the analysed image per pixel of the tiled grid (level 0: 1)
    sy, sx = r.image_shape[0] / r.model_shape[0], r.image_shape[1] / r.model_shape[1]
    ph, pw = r.patch_size
    tissue = slide.tissue[:r.image_shape[0], :r.image_shape[1]]
    boxes = [(int(y * sy), int((y + th) * sy), int(x * sx), int((x + tw) * sx))
             for y in ys for x in xs]
    share = np.array([tissue[a:b, c:d].mean() for a, b, c, d in boxes])
    tile_sig = np.array([sig[int(a / sy) // ph:-(-int(b / sy) // ph),
                             int(c / sx) // pw:-(-int(d / sx) // pw)].any()
                         for a, b, c, d in boxes])
    tested = np.zeros(sig.shape, bool)
    for k in np.flatnonzero(kept):
        a, b, c, d = boxes[k]
        tested[int(a / sy) // ph:-(-int(b / sy) // ph), int(c / sx) // pw:-(-int(d / sx) // pw)] = True
    tested &= ~np.isnan(np.asarray(r.p))  # glass of a run tile is not measured (NaN p)
    glass_tok = r.token_coverage(~tissue) >= 0.9
    edge = kept & (share >= EDGE_MIN) & (share <= 1 - EDGE_MIN)
    interior = kept & (share >= 1 - INTERIOR_MAX_GLASS)
    row = {"seconds": seconds or md["timings"]["total_s"], "n_tiles": int(kept.size),
           "n_run": int(kept.sum()), "mask": md.get("tissue_mask"), "any_sig": bool(sig.any()),
           "sig_tokens": int(sig.sum()),
           "sig_on_glass": int((sig & glass_tok).sum()),
           "tissue_share": float(tissue.mean()),
           # the mask against the truth: tissue tiles (≥ 10 % tissue) left out, glass tiles run
           "tissue_tiles_left_out": int((~kept & (share >= 0.10)).sum()),
           "tissue_tiles": int((share >= 0.10).sum()),
           "glass_tiles_run": int((kept & (share <= 0.01)).sum()),
           "edge_tiles": int(edge.sum()), "edge_tiles_sig": int((edge & tile_sig).sum()),
           "interior_tiles": int(interior.sum()),
           "interior_tiles_sig": int((interior & tile_sig).sum()),
           "min_p": float(r.p[tested].min()) if tested.any() else None}
    family_p = summary.get("stepdown_family_p")
    row["family_p"] = (np.asarray(family_p, float).round(6).tolist() if family_p is not None
                       else None)
    if family_p is None:  # presets without tile families: the tested tokens' p (a sample)
        p = np.asarray(r.p)[tested]
        row["token_p_sample"] = np.random.default_rng(seed).choice(
            p, size=min(200, p.size), replace=False).round(6).tolist()
    if slide.planted:
        labels, n = ndimage.label(slide.objects)
        sizes = np.bincount(labels.ravel())[1:]
        sig_px = r.to_pixels(sig)[:labels.shape[0], :labels.shape[1]]
        big = [k for k in range(1, n + 1) if sizes[k - 1] >= 20]  # not a sliver the glass left
        on_obj = r.token_coverage(slide.objects[:r.image_shape[0], :r.image_shape[1]]) >= 0.25
        obj_tiles = np.array([slide.objects[a:b, c:d].any() for a, b, c, d in boxes])
        row.update(objects=len(big), found=int(sum(sig_px[labels == k].any() for k in big)),
                   object_tokens=int(on_obj.sum()), object_tokens_sig=int((on_obj & sig).sum()),
                   sig_off_object=int((sig & (r.token_coverage(
                       slide.objects[:r.image_shape[0], :r.image_shape[1]]) == 0)).sum()),
                   object_tiles_run=int((obj_tiles & kept).sum()),
                   object_tiles=int(obj_tiles.sum()))
    return row


# ---------------------------------------------------------------- summaries


def _ci(k: int, n: int) -> list[float]:
    ci = stats.binomtest(k, n).proportion_ci(0.95, "exact")
    return [float(ci.low), float(ci.high)]


def _ks_uniform(p: list[float], n_boot: int) -> float | None:
    """KS p of p-values against U(0, 1), counting p-values randomized (``validate._ks``)."""
    from validate import _ks

    return _ks(p, n_boot)


def summarize_null(rows: list[dict], n_boot: int) -> dict:
    """Share of slides with any significant token (exact CI), and the tissue tiles' p.
    Slides the mask refused (no tissue found) are counted apart and left out."""
    refused = sum("refused" in r for r in rows)
    rows = [r for r in rows if "refused" not in r]
    if not rows:
        return {"n": 0, "refused": refused}
    n, k = len(rows), sum(r["any_sig"] for r in rows)
    out = {"n": n, "any_sig": k, "any_sig_share": k / n, "any_sig_ci": _ci(k, n),
           "sig_on_glass": sum(r["sig_on_glass"] for r in rows),
           "run_tiles": sum(r["n_run"] for r in rows),
           "tissue_tiles_left_out": sum(r["tissue_tiles_left_out"] for r in rows),
           "tissue_tiles": sum(r["tissue_tiles"] for r in rows),
           "glass_tiles_run": sum(r["glass_tiles_run"] for r in rows),
           "masks": sorted({r["mask"] for r in rows}), "refused": refused}
    for kind in ("edge", "interior"):
        tiles, sig = sum(r[f"{kind}_tiles"] for r in rows), sum(r[f"{kind}_tiles_sig"] for r in rows)
        out[f"{kind}_tiles"], out[f"{kind}_tiles_sig"] = tiles, sig
        out[f"{kind}_fp_share"] = sig / tiles if tiles else None
        out[f"{kind}_fp_ci"] = _ci(sig, tiles) if tiles else None
    if rows[0]["family_p"] is not None:
        p = [v for r in rows for v in r["family_p"]]
        out.update(tile_p_n=len(p), tile_p_ks=_ks_uniform(p, n_boot),
                   tile_p_below_05=float(np.mean(np.asarray(p) < 0.05)))
    else:
        p = np.concatenate([r["token_p_sample"] for r in rows])
        out.update(token_p_n=int(p.size), token_p_ks_distance=float(stats.kstest(p, "uniform").statistic),
                   token_p_below_05=float(np.mean(p < 0.05)))
    return out


def summarize_planted(rows: list[dict]) -> dict:
    refused = sum("refused" in r for r in rows)
    rows = [r for r in rows if "refused" not in r]
    if not rows:
        return {"n": 0, "refused": refused, "objects": 0}
    objects, found = sum(r["objects"] for r in rows), sum(r["found"] for r in rows)
    tok, tok_sig = sum(r["object_tokens"] for r in rows), sum(r["object_tokens_sig"] for r in rows)
    sig = sum(r["sig_tokens"] for r in rows)
    return {"n": len(rows), "refused": refused, "objects": objects, "found": found,
            "recall": found / objects if objects else None,
            "recall_ci": _ci(found, objects) if objects else None,
            "object_tokens": tok, "object_tokens_sig": tok_sig,
            "sig_tokens": sig, "sig_off_object": sum(r["sig_off_object"] for r in rows),
            "sig_on_glass": sum(r["sig_on_glass"] for r in rows),
            "slides_sig_on_glass": sum(r["sig_on_glass"] > 0 for r in rows),
            "object_tiles": sum(r["object_tiles"] for r in rows),
            "object_tiles_run": sum(r["object_tiles_run"] for r in rows)}


# ---------------------------------------------------------------- main


def validate_model(name: str, args) -> dict:
    art = ARTICLES[name]
    bb = art.backbone()
    side = SIDE[name]
    presets = args.presets if name != "dinov2" else ("stepdown",)
    # a Hugging Face backbone's tiled CPU run needs its chunk given: the automatic one reads
    # timm's patch_embed (AttributeError; reported, /work/r11/calib/repro_hf_tiled_cpu.py)
    options = {"chunk_size": 16} if name == "dinov2" else {}
    out = {"model": bb.describe(), "article": art.description, "side": side, "presets": {}}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        workdir = Path(tmp)
        null_slides = [make_slides(art, i, side, args.glass) for i in range(args.n_null)]
        planted_slides = [make_slides(art, i, side, args.glass, planted=args.planted)
                          for i in range(args.n_planted)]
        progress(f"{name}: {len(null_slides)} null and {len(planted_slides)} planted tissues made")
        for preset in presets:
            count = 1.0 if preset == "stepdown" else args.other_share
            n_null = max(2, round(count * len(null_slides))) if count < 1 else len(null_slides)
            n_pl = max(2, round(count * len(planted_slides))) if count < 1 else len(planted_slides)
            per = {}
            for g in args.glass:
                null_rows = [run_slide(bb, s[g], preset, args.n_boot, seed=i, workdir=workdir,
                                     **options)
                             for i, s in enumerate(null_slides[:n_null])]
                pl_rows = [run_slide(bb, s[g], preset, args.n_boot, seed=1000 + i, workdir=workdir,
                                   **options)
                           for i, s in enumerate(planted_slides[:n_pl])]
                per[str(g)] = {"null": summarize_null(null_rows, args.n_boot),
                               "planted": summarize_planted(pl_rows) if pl_rows else None,
                               "null_rows": null_rows, "planted_rows": pl_rows,
                               "median_s": float(np.median([r["seconds"] for r in null_rows + pl_rows
                                                            if "seconds" in r] or [np.nan]))}
                nl = per[str(g)]["null"]
                pl = per[str(g)]["planted"] or {}
                progress(f"{name} {preset} glass {g}: any sig {nl.get('any_sig')}/{nl['n']} "
                         f"({nl['refused']} refused), tile KS {nl.get('tile_p_ks')}, planted "
                         f"{pl.get('found')}/{pl.get('objects')} ({pl.get('refused')} refused)")
            # the same tissue with and without glass: slides significant under each share
            any_by = {g: [r.get("any_sig", -1) for r in per[str(g)]["null_rows"]]
                      for g in args.glass}
            out["presets"][preset] = {"by_glass": per, "any_sig_by_slide": {
                str(g): [int(v) for v in any_by[g]] for g in args.glass}}
    return out


def raw_mosaic(art, index: int, side: int, planted: int) -> Slide:
    """The 0 %-glass tissue of :func:`make_slides` as the article's own values (no 8 bits)."""
    cells = (object_cells(tissue_region(side, 0.7, [STREAM, 1, index, planted]),
                          art.native_size, planted,
                          np.random.default_rng([STREAM, 0, index, planted])) if planted else set())
    fs, slide = art.native_size, index + (500 if planted else 0)
    n = -(-side // fs)
    image = np.zeros((n * fs, n * fs), np.float32)
    objects = np.zeros(image.shape, bool)
    for cell in range(n * n):
        f = art.native_field(STREAM, slide * 1000 + cell, cell in cells)
        y, x = divmod(cell, n)
        image[y * fs:(y + 1) * fs, x * fs:(x + 1) * fs] = f.image
        objects[y * fs:(y + 1) * fs, x * fs:(x + 1) * fs] = f.decisive
    return Slide(image[:side, :side], np.ones((side, side), bool), objects[:side, :side],
                 planted=bool(planted))


def raw_reference(name: str, args) -> dict:
    """The step-down on the 0 %-glass tissues as arrays of the article's own values, tiled
    without a mask: what the 8-bit storage and the slide path change."""
    art = ARTICLES[name]
    bb, side = art.backbone(), SIDE[name]
    null = [_measure_raw(bb, raw_mosaic(art, i, side, 0), i, args) for i in range(args.n_null)]
    planted = [_measure_raw(bb, raw_mosaic(art, i, side, args.planted), 1000 + i, args)
               for i in range(args.n_planted)]
    progress(f"{name}: raw reference done")
    return {"null": summarize_null(null, args.n_boot),
            "planted": summarize_planted(planted) if planted else None,
            "null_rows": null, "planted_rows": planted}


def _measure_raw(bb, slide: Slide, seed: int, args) -> dict:
    return run_slide(bb, slide, "stepdown", args.n_boot, seed, Path("."), in_memory=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="demo,phantom",
                    help="articles to run, comma-separated from demo, phantom, dinov2 (the "
                         "real DINOv2 article: the step-down preset only)")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--glass", default="0,0.35,0.7",
                    help="glass shares of the slide (the same tissue under each)")
    ap.add_argument("--n-null", type=int, default=30, help="slides without objects (step-down)")
    ap.add_argument("--n-planted", type=int, default=12, help="slides with planted objects")
    ap.add_argument("--planted", type=int, default=2, help="fields with objects per planted slide")
    ap.add_argument("--other-share", type=float, default=1 / 3,
                    help="share of the slides the other presets run (at least 2)")
    ap.add_argument("--n-boot", type=int, default=100)
    ap.add_argument("--raw-reference", action="store_true",
                    help="only the step-down on the 0 %%-glass tissues as in-memory arrays of "
                         "the article's own values, no mask (kept beside the slide results)")
    ap.add_argument("--quick", action="store_true",
                    help="a small CPU run: the demo model, 2 null and 1 planted slide, B = 20")
    ap.add_argument("--json", type=Path, help="results file; models not run are kept from it")
    ap.add_argument("--report", type=Path,
                    help="write the Markdown table of the --json file's results here (runs nothing)")
    ap.add_argument("--workdir", type=Path, default=None, help="where the SVS files are written")
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.n_null, args.n_planted, args.n_boot = "demo", 2, 1, 20
        args.glass = "0,0.7"
    args.models = tuple(m for m in args.models.split(",") if m)
    args.presets = tuple(p for p in args.presets.split(",") if p)
    args.glass = tuple(float(g) for g in args.glass.split(","))
    if set(args.models) - set(SIDE):
        ap.error(f"--models takes names from {', '.join(SIDE)}")
    if not args.presets or set(args.presets) - set(PRESETS):
        ap.error(f"--presets takes names from {', '.join(PRESETS)}")
    if any(not 0 <= g < 1 for g in args.glass):
        ap.error("--glass takes shares from 0 up to (not including) 1")
    if args.n_null < 1 or args.n_planted < 0 or args.n_boot < 10:
        ap.error("give --n-null ≥ 1, --n-planted ≥ 0 and --n-boot ≥ 10")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    results = json.loads(args.json.read_text()) if args.json and args.json.is_file() else {}
    if args.report:  # a table of what --json holds, nothing run
        if not results:
            raise SystemExit(f"--report reads the results of --json; {args.json} has none")
        args.report.write_text(report(results))
        progress(f"wrote {args.report}")
        return results
    results.setdefault("models", {})
    for name in args.models:
        t0 = time.perf_counter()
        if args.raw_reference:
            results.setdefault("raw_reference", {})[name] = raw_reference(name, args)
            results["raw_reference"][name].update(n_boot=args.n_boot, argv=list(
                argv if argv is not None else sys.argv[1:]), source=source_version())
            continue
        results["models"][name] = validate_model(name, args)
        results["models"][name].update(seconds=time.perf_counter() - t0,
                                       argv=list(argv if argv is not None else sys.argv[1:]),
                                       n_boot=args.n_boot, source=source_version())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=float) + "\n")
        progress(f"wrote {args.json}")
    print(report(results))
    return results


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f} %"


def _ci_text(ci: list[float] | None) -> str:
    return "" if ci is None else f" [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]"


def report(results: dict) -> str:
    """The Markdown table: model × preset × glass share."""
    lines = ["| model | preset | glass | B | null slides with any sig. [95 % CI] | "
             "tissue p: KS | edge / interior tiles with a sig. token | sig. tokens on glass "
             "(null; planted) | planted objects found [95 % CI] | tiles run / tissue tiles "
             "left out / glass tiles run (null) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in results.get("models", {}).items():
        for preset, pr in m["presets"].items():
            for g, cell in pr["by_glass"].items():
                nl, pl = cell["null"], cell["planted"]
                refused = f" ({nl['refused']} refused: no tissue found)" if nl["refused"] else ""
                if not nl["n"]:
                    lines.append(f"| {name} | {preset} | {float(g):.0%} | {m['n_boot']} | "
                                 f"0 run{refused} | | | | | |")
                    continue
                if "tile_p_ks" in nl:
                    ks = (f"tile p KS p = {nl['tile_p_ks']:.3g} (n = {nl['tile_p_n']}; "
                          f"{_pct(nl['tile_p_below_05'])} < 0.05)")
                else:
                    ks = (f"token p KS D = {nl['token_p_ks_distance']:.2f} "
                          f"({_pct(nl['token_p_below_05'])} < 0.05)")
                edge = (f"{nl['edge_tiles_sig']}/{nl['edge_tiles']} / "
                        f"{nl['interior_tiles_sig']}/{nl['interior_tiles']}")
                found = ("–" if pl is None or not pl.get("objects") else
                         f"{pl['found']}/{pl['objects']} = {_pct(pl['recall'])}"
                         f"{_ci_text(pl['recall_ci'])}")
                glass = f"{nl['sig_on_glass']}; {pl['sig_on_glass'] if pl and pl['n'] else '–'}"
                mask = f"{nl['run_tiles']} / {nl['tissue_tiles_left_out']} / {nl['glass_tiles_run']}"
                lines.append(f"| {name} | {preset} | {float(g):.0%} | {m['n_boot']} | "
                             f"{nl['any_sig']}/{nl['n']} = {_pct(nl['any_sig_share'])}"
                             f"{_ci_text(nl['any_sig_ci'])}{refused} | {ks} | {edge} | {glass} | {found} "
                             f"| {mask} |")
    raw = results.get("raw_reference", {})
    if raw:
        lines += ["", "Raw reference (step-down, the 0 %-glass tissues as in-memory arrays of the "
                  "article's own values, tiled without a mask):", "",
                  "| model | B | null slides with any sig. [95 % CI] | tile p KS p (share < 0.05) "
                  "| planted objects found [95 % CI] |", "|---|---|---|---|---|"]
        for name, ref in raw.items():
            nl, pl = ref["null"], ref["planted"]
            found = ("–" if not pl or not pl.get("objects") else
                     f"{pl['found']}/{pl['objects']} = {_pct(pl['recall'])}{_ci_text(pl['recall_ci'])}")
            lines.append(f"| {name} | {ref['n_boot']} | {nl['any_sig']}/{nl['n']} = "
                         f"{_pct(nl['any_sig_share'])}{_ci_text(nl['any_sig_ci'])} | "
                         f"{nl['tile_p_ks']:.3g} ({_pct(nl['tile_p_below_05'])}) | {found} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
