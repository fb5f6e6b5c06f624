"""Tabulate the Anderson–Darling 5 % critical values of the GPD fit the tail approximation uses.

The step-down tail approximation (``core/stats/tail.py``) fits a generalized Pareto distribution
to the exceedances of the null step statistics with scipy's maximum likelihood (location
fixed at the threshold) and keeps the counting p-value where an Anderson–Darling test
rejects that fit at 0.05. With both parameters estimated, the statistic's null
distribution depends on the shape and on the number of exceedances, not on the scale
(Choulakian & Stephens 2001 tabulate it the same way). A parametric bootstrap per step
would cost about a second each; this table is made once, with the same estimator::

    python scripts/make_gpd_table.py          # ~6 min on one core

and written to ``src/napari_attnreg/core/stats/gpd_ad_critical.json``.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import stats

SHAPES = [round(v, 2) for v in np.arange(-0.5, 0.51, 0.1)]
SIZES = [10, 15, 20, 30, 50, 100, 200, 500, 1000]
REPLICATES = 400
OUT = Path(__file__).resolve().parents[1] / "src" / "napari_attnreg" / "core" / "stats" / "gpd_ad_critical.json"


def ad_statistic(sample: np.ndarray) -> float:
    """A² of a GPD fitted to ``sample`` (location 0) by scipy's maximum likelihood."""
    shape, _, scale = stats.genpareto.fit(sample, floc=0.0)
    u = np.sort(stats.genpareto.cdf(sample, shape, 0.0, scale))
    u = np.clip(u, 1e-12, 1 - 1e-12)
    n = u.size
    i = np.arange(1, n + 1)
    return float(-n - np.mean((2 * i - 1) * (np.log(u) + np.log1p(-u[::-1]))))


def main() -> None:
    rng = np.random.default_rng(20261123)
    table = []
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for shape in SHAPES:
            row = []
            for n in SIZES:
                values = [ad_statistic(stats.genpareto.rvs(shape, size=n, random_state=rng))
                          for _ in range(REPLICATES)]
                row.append(float(np.quantile(values, 0.95)))
            table.append(row)
            print(f"shape {shape:+.1f}: {np.round(row, 3).tolist()}  ({time.perf_counter() - t0:.0f} s)")
    OUT.write_text(json.dumps({
        "about": "Anderson-Darling 0.95 quantiles for a GPD fitted by scipy MLE with the "
                 "location fixed; rows: shapes, columns: sample sizes. Made by "
                 "scripts/make_gpd_table.py.",
        "replicates": REPLICATES, "shapes": SHAPES, "sizes": SIZES, "critical_05": table,
    }, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
