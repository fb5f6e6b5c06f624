"""Selections of the batched tail (probability-weighted moments) against scipy's likelihood fits.

    PYTHONPATH=src python benchmarks/tail_compare.py --side 1024 --n-boot 200 \
        --json benchmarks/results/tail_compare.json

On small tiled mosaics of both validation articles (planted objects, and pure noise), every
run's step-down statistics are computed twice from the same tiles and null maps: with the
package's tail (Hosking–Wallis fits, batched) and with the same procedure but each tail fitted
by ``scipy.stats.genpareto.fit`` (maximum likelihood, location fixed; a negative shape is
replaced by the exponential in both, and both are tested against the same Anderson–Darling
table, which was simulated for the moment estimator). Reported per mosaic: tiles selected by
Benjamini–Hochberg, significant steps under ForwardStop at α = 0.1, tail steps and fits
accepted, and the time each fit took; and where the two selections differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validation_articles import ARTICLES, HELD_OUT, mosaic, noise_image

import napari_attnreg.core.stats.stepdown_maps as maps_mod
from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.engine import RunConfig, drain, run_engine
from napari_attnreg.core.stats import tail
from napari_attnreg.core.stats.stepdown import family_selection, significant_steps


def mle_fit_tails(tops: torch.Tensor) -> tail.GPDFits:
    """:func:`tail.fit_tails` with each tail fitted by scipy's maximum likelihood instead."""
    tops = tops.double().cpu()
    threshold = tops[:, -1]
    excess = (tops[:, :-1] - threshold[:, None]).flip(-1)
    fitted = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in excess.numpy():
            c, _, scale = stats.genpareto.fit(row, floc=0.0)
            fitted.append((c, scale))
    estimated, scale = (torch.tensor(v, dtype=torch.float64) for v in zip(*fitted))
    shape, scale = tail.used_tail(excess, estimated, scale)
    valid = torch.isfinite(estimated) & torch.isfinite(scale) & (scale > 0)
    statistic = tail.anderson_darling(excess, shape, torch.where(valid, scale,
                                                                 torch.ones_like(scale)))
    critical = torch.from_numpy(tail.ad_critical_values(estimated.numpy(), excess.shape[1]))
    return tail.GPDFits(threshold=threshold, estimated_shape=estimated, shape=shape,
                        scale=scale, accepted=valid & (statistic <= critical),
                        n_exceedances=excess.shape[1])


class Twice:
    """Wraps the step-down call: the package's tail, then the likelihood fits, same inputs."""

    def __init__(self) -> None:
        self.real = maps_mod.step_down
        self.runs: list[dict] = []

    def __call__(self, observed, null, *, tail: str = "none"):
        out = {}
        for name, fitter in (("pwm", tail_module_fit), ("mle", mle_fit_tails)):
            seconds = []

            def timed(tops, fitter=fitter, seconds=seconds):
                t0 = time.perf_counter()
                fits = fitter(tops)
                seconds.append(time.perf_counter() - t0)
                return fits

            tail_module.fit_tails = timed
            try:
                out[name] = (self.real(observed, null, tail=tail), sum(seconds))
            finally:
                tail_module.fit_tails = tail_module_fit
        self.runs.append(out)
        return out["pwm"][0]


tail_module = tail
tail_module_fit = tail.fit_tails


def compare(out: dict, alpha: float) -> dict:
    """Selections and tail use of the two fits of one run."""
    row = {}
    picks = {}
    for name, (fam, seconds) in out.items():
        _, selected = family_selection(fam.family_p, alpha)
        steps = significant_steps(fam.step_p, fam.adjusted_p, fam.group_end, "forwardstop", alpha)
        picks[name] = (selected, steps)
        row[name] = {"tiles_selected": int(selected.sum()), "significant_steps": int(steps.sum()),
                     "tail_steps": fam.tail.steps, "tail_rejected": fam.tail.rejected,
                     "tail_floored": fam.tail.floored, "fits": fam.tail.fits,
                     "fit_seconds": seconds,
                     "first_step_tail_used": int(fam.tail_used[:, 0].sum())}
    (sel_a, steps_a), (sel_b, steps_b) = picks["pwm"], picks["mle"]
    row["tiles_differ"] = np.flatnonzero(sel_a != sel_b).tolist()
    row["steps_differ"] = int((steps_a != steps_b).sum())
    row["same_selection"] = not row["tiles_differ"] and row["steps_differ"] == 0
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", type=int, default=1024)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--planted", type=int, default=2, help="planted mosaics per article")
    ap.add_argument("--noise", type=int, default=1, help="pure-noise mosaics per article")
    ap.add_argument("--articles", nargs="+", default=["demo", "phantom"])
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    twice = Twice()
    maps_mod.step_down = twice
    rows = []
    try:
        for name in args.articles:
            art = ARTICLES[name]
            bb = load_backbone(art.model)
            images = [(f"planted {i}", mosaic(art, i, args.side, 2, np.random.default_rng(
                [HELD_OUT["mosaic"], 7, i])).image) for i in range(args.planted)]
            for m in range(args.noise):
                ref = art.field(HELD_OUT["mosaic"], 95_000 + m, False).image
                images.append((f"noise {m}", noise_image(
                    ref, np.random.default_rng([HELD_OUT["mosaic"], 8, m]), args.side, rgb=False)))
            for i, (kind, image) in enumerate(images):
                cfg = RunConfig(tiled=True, n_boot=args.n_boot, seed=i, device="cpu", tail="gpd")
                drain(run_engine(image, bb, cfg))
                row = {"article": name, "mosaic": kind, "n_tiles": int(
                    twice.runs[-1]["pwm"][0].step_p.shape[0]), **compare(twice.runs[-1],
                                                                      args.alpha)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        maps_mod.step_down = twice.real
    same = sum(r["same_selection"] for r in rows)
    print(f"same selections on {same} of {len(rows)} mosaics; fit time "
          f"{sum(r['pwm']['fit_seconds'] for r in rows):.3f} s (moments) vs "
          f"{sum(r['mle']['fit_seconds'] for r in rows):.1f} s (likelihood)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
