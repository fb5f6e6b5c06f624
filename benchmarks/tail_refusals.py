"""How often the tail's goodness-of-fit test refuses a tiled run's shared first-step fit.

    python benchmarks/tail_refusals.py --size 4096 --n-boot 200 --pool 2000

In a tiled run whose tiles share one null, every tile's p-value comes from one tail fit: the
largest null first-step statistics (a null map's largest share of its attention). When the
Anderson–Darling test refuses that fit, every tile keeps its count. This script runs the
demo model on ``bench_tiled.py``'s field with ``--pool`` null tiles (the same seed gives the
same null image ``b`` whatever B, so the first ``--n-boot`` of them are a run's null), then
reports:

* whether the run's own fit (the first ``--n-boot`` nulls) is refused, and its shape;
* the refusal rate over ``--draws`` draws of ``--n-boot`` from the pool (the test's level is
  0.05; a rate far above it would say the tail does not suit these nulls);
* the fit of the whole pool;
* with ``--simulate``, the refusal rate on generalized Pareto samples of known shape (the
  critical values are read at the *estimated* shape).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))

import napari_attnreg.core.stats.stepdown_maps as stepdown_maps
from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.engine import RunConfig, drain, run_engine
from napari_attnreg.core.stats import tail


def pooled_first_steps(size: int, pool: int, device: str) -> np.ndarray:
    """The first-step null statistic (largest share of each null map) of ``pool`` null tiles."""
    from bench_tiled import field

    seen: dict[str, np.ndarray] = {}
    real = stepdown_maps.step_down

    def spy(observed, null_scores, tail="none"):
        seen["null"] = torch.as_tensor(null_scores).double().cpu().numpy()
        return real(observed, null_scores, tail=tail)

    stepdown_maps.step_down = spy
    try:
        drain(run_engine(field(size), load_backbone("demo"),
                         RunConfig(tiled=True, n_boot=pool, device=device, tail="none")))
    finally:
        stepdown_maps.step_down = real
    null = seen["null"]
    if null.ndim != 2:
        raise RuntimeError("expected one null shared by every tile (null_scope='image')")
    return null.max(axis=1) / null.sum(axis=1)


def refused(samples: np.ndarray, n_boot: int) -> tuple[np.ndarray, np.ndarray]:
    """Refusals and estimated shapes of the tail fits of each row's ``n_boot`` values."""
    k = tail.tail_size(n_boot) + 1
    tops = -np.sort(-samples, axis=1)[:, :k]
    fits = tail.fit_tails(torch.from_numpy(np.ascontiguousarray(tops)))
    return (~fits.accepted).numpy(), fits.estimated_shape.numpy()


def simulate(n_boot: int, rows: int, seed: int) -> dict[str, float]:
    """Refusal rates on GPD samples whose top tenth is the tail (shapes -0.4 … 0.4)."""
    rng = np.random.default_rng(seed)
    n = tail.tail_size(n_boot)
    out = {}
    for shape in (-0.4, -0.2, 0.0, 0.2, 0.4):
        excess = stats.genpareto.rvs(shape, size=(rows, n), random_state=rng)
        samples = np.concatenate([excess, np.zeros((rows, 1))], axis=1)  # the threshold
        out[f"{shape:+.1f}"] = float(refused(samples, n_boot)[0].mean())
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--pool", type=int, default=2000)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--simulate", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    first = pooled_first_steps(args.size, args.pool, args.device)
    rng = np.random.default_rng(0)
    own_refused, own_shape = refused(first[None, :args.n_boot], args.n_boot)
    draws = np.stack([rng.choice(first, args.n_boot, replace=False) for _ in range(args.draws)])
    draw_refused, _ = refused(draws, args.n_boot)
    pool_refused, pool_shape = refused(first[None], args.pool)
    out = {"size": args.size, "n_boot": args.n_boot, "pool": args.pool,
           "run_fit_refused": bool(own_refused[0]), "run_fit_shape": float(own_shape[0]),
           "draws": args.draws, "draw_refusal_rate": float(draw_refused.mean()),
           "pool_fit_refused": bool(pool_refused[0]), "pool_fit_shape": float(pool_shape[0])}
    print(f"{args.size}² demo field: the run's fit (first {args.n_boot} nulls) "
          f"{'refused' if own_refused[0] else 'kept'} (shape {own_shape[0]:+.3f}); "
          f"{args.draws} draws of {args.n_boot} from {args.pool}: "
          f"{100 * out['draw_refusal_rate']:.1f} % refused; the pool's fit "
          f"{'refused' if pool_refused[0] else 'kept'} (shape {pool_shape[0]:+.3f})")
    if args.simulate:
        out["gpd_refusal_rates"] = simulate(args.n_boot, 20_000, seed=1)
        print("refusal rate on GPD samples by true shape (level 0.05): "
              + ", ".join(f"{k} {100 * v:.1f} %" for k, v in out["gpd_refusal_rates"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
