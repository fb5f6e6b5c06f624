"""The paper's procedure (Chung & Laletin, AISTATS 2026), unchanged.

Two-sided pooled p-values, the reference π0, Efron/Lindsey local fdr on z and the lfdr rule
at 0.3 with z ≥ 0, computed by :mod:`napari_attnreg.core.stats.paper`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from napari_attnreg.core.stats.procedures.base import MapText, Procedure


class Paper(Procedure):
    """The published two-sided procedure; bit-exact to the paper's reference code."""

    name = "paper"
    title = "paper"
    label = "paper (two-sided)"
    help = ("paper: the published procedure (Chung & Laletin): two-sided p-values and the "
            "local fdr on z; significant at lfdr ≤ 0.3 with z ≥ 0. Also flags attention far "
            "BELOW the null.")
    defaults = {
        "method": "normal", "null_resolution": "model",
        "p_method": "pooled", "alternative": "two-sided", "pi0_method": "reference",
        "null": "theoretical", "null_pool": "pooled",
        "rule": "lfdr", "z_th": 0.0, "p_th": 0.3, "l_th": 0.3, "q_th": 0.1,
    }
    rules = ("q", "p", "lfdr", "pi0", "soft", "base")
    reads = ("pi0_method", "p_method", "alternative", "null", "l_th")
    fixed = {"null_pool": ("pooled", "null_pool='position' is part of the directional "
                                     "inference; use preset='directional' with it (the paper "
                                     "pools every null token).")}
    one_sided = False
    clamps_nulls = False
    pi0_on_pixel_grid = True
    side = "paper's two-sided test"
    map_texts = {
        "pvalue": MapText(
            "−log10 p (two-sided)",
            "−log10 of the paper's two-sided p-value: bright = far from the null in either "
            "direction (also BELOW it).",
            "−log10 p"),
        "posterior": MapText(
            "posterior 1 − lfdr (two-sided)",
            "1 − local fdr on z, two-sided: high also for attention far below the null.",
            "probability, 0–1"),
    }

    def statistics(self, observed: Any, null_scores: Any, options: Mapping[str, Any], *,
                   positions: np.ndarray | None = None, families: Any = None,
                   owner: tuple[np.ndarray, np.ndarray] | None = None,
                   family_tokens: np.ndarray | None = None) -> Any:
        from functools import partial

        from napari_attnreg.core.stats.paper import compute_statistics

        # heads, or tokens left out: each family alone, q over all of them (base class)
        test = partial(compute_statistics, p_method=options["p_method"],
                       alternative=options["alternative"], pi0_method=options["pi0_method"],
                       null=options["null"])
        return self.pooled_statistics(test, observed, null_scores, options,
                                      positions=positions, families=families, owner=owner,
                                      family_tokens=family_tokens)

    def significance_meaning(self) -> str:
        return ("the patch's attention is far from the null in either direction (local false "
                "discovery rate on z)")


    def compared_with(self, nulls: str, count: str, what: str = "attention") -> str:
        return (f"{what} differing from the model's on {nulls}{count}, above or below "
                "(the published two-sided test)")

PROCEDURE = Paper()
