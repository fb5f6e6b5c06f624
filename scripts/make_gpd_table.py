"""Tabulate the Anderson–Darling 5 % critical values of the tail the approximation uses.

The step-down tail approximation (``core/stats/tail.py``) fits a generalized Pareto
distribution to the exceedances of the null step statistics by Hosking–Wallis
probability-weighted moments, replaces a negative shape by the exponential tail with the
exceedances' mean as its scale, and keeps the counting p-value where an Anderson–Darling test
rejects *that* tail at 0.05. With the parameters estimated, the statistic's null distribution
depends on the true shape and on the number of exceedances, not on the scale (Choulakian &
Stephens 2001 tabulate theirs the same way), so it is simulated here for a grid of both,
running the package's own estimator, replacement and statistic on every replicate::

    PYTHONPATH=src python scripts/make_gpd_table.py    # ~3 min on one core (99 cells × 20,000)

and written to ``src/napari_attnreg/core/stats/gpd_ad_critical.json``. The code reads the
table at the *estimated* shape; the script also reports the rejection rate that lookup gives
on fresh samples of each true shape (it should be near 0.05).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from napari_attnreg.core.stats.tail import (
    ad_critical_values,
    anderson_darling,
    pwm_fit,
    used_tail,
)

SHAPES = [round(float(v), 2) for v in np.arange(-0.5, 0.51, 0.1)]
SIZES = [10, 15, 20, 30, 50, 100, 200, 500, 1000]
REPLICATES = 20_000
SEED = 20261126
OUT = (Path(__file__).resolve().parents[1] / "src" / "napari_attnreg" / "core" / "stats"
       / "gpd_ad_critical.json")


def gpd_samples(rng: np.random.Generator, shape: float, size: tuple[int, int]) -> torch.Tensor:
    """GPD(shape, 0, 1) draws by inversion, each row sorted ascending."""
    u = rng.random(size)
    x = -np.log1p(-u) if abs(shape) < 1e-12 else np.expm1(-shape * np.log1p(-u)) / shape
    return torch.from_numpy(np.sort(x, axis=1))


def simulate(excess: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """A² of the tail used and the estimated shape, for every row (the package's code)."""
    estimated, scale = pwm_fit(excess)
    shape, scale = used_tail(excess, estimated, scale)
    return anderson_darling(excess, shape, scale).numpy(), estimated.numpy()


def main() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(SEED)
    t0 = time.perf_counter()
    table = []
    for shape in SHAPES:
        row = []
        for n in SIZES:
            statistic, _ = simulate(gpd_samples(rng, shape, (REPLICATES, n)))
            row.append(float(np.quantile(statistic[np.isfinite(statistic)], 0.95)))
        table.append(row)
        print(f"shape {shape:+.1f}: {np.round(row, 3).tolist()}  "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    OUT.write_text(json.dumps({
        "about": "Anderson-Darling 0.95 quantiles of the tail used by core/stats/tail.py: a "
                 "GPD fitted by Hosking-Wallis probability-weighted moments (location fixed), a "
                 "negative shape replaced by the exponential with the exceedances' mean; rows: "
                 "true shapes, columns: numbers of exceedances. Made by "
                 "scripts/make_gpd_table.py.",
        "replicates": REPLICATES, "seed": SEED, "shapes": SHAPES, "sizes": SIZES,
        "critical_05": table,
    }, indent=1) + "\n")
    print(f"wrote {OUT}", flush=True)
    _check_rejection_rates(np.random.default_rng(SEED + 1))
    print(f"done in {time.perf_counter() - t0:.0f} s on one core", flush=True)


def _check_rejection_rates(rng: np.random.Generator, replicates: int = 4000) -> None:
    """Rejection rate of the lookup at the estimated shape, on fresh samples."""
    from napari_attnreg.core.stats import tail

    tail._critical_table.cache_clear()  # the table just written
    print("rejection rate at the estimated shape (target 0.05); columns:", SIZES)
    for shape in SHAPES:
        rates = []
        for n in SIZES:
            statistic, estimated = simulate(gpd_samples(rng, shape, (replicates, n)))
            rates.append(float(np.mean(statistic > ad_critical_values(estimated, n))))
        print(f"  shape {shape:+.1f}: {np.round(rates, 3).tolist()}", flush=True)


if __name__ == "__main__":
    main()
