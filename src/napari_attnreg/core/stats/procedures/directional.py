"""The directional procedure: is a patch's attention *higher* than noise input gives?

One-sided p⁺, Benjamini–Hochberg q⁺ (π0 = 1) and a Grenander lfdr⁺, computed by
:mod:`napari_attnreg.core.stats.directional`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from napari_attnreg.core.stats.procedures.base import MapText, Procedure

_ONE_SIDED = ("{key}={value} belongs to the paper's two-sided procedure; the directional "
              "preset is one-sided by construction. Pass preset='paper' to use {key}={value}.")


class Directional(Procedure):
    """One-sided tests of each patch against the pooled (or per-position) null."""

    name = "directional"
    title = "directional"
    label = "directional (above null)"
    help = ("directional: is this patch's attention HIGHER than noise input gives? One-sided "
            "p⁺, q⁺ and posterior⁺; significant at q⁺ ≤ 0.1, no z mask.")
    defaults = {
        "method": "normal", "null_resolution": "model",
        "p_method": "null", "alternative": "greater", "pi0_method": "bh",
        "null": "theoretical", "null_pool": "pooled",
        "rule": "q", "z_th": None, "p_th": 0.05, "l_th": 0.2, "q_th": 0.1,
    }
    rules = ("q", "p", "lfdr", "pi0", "soft", "base")
    reads = ("null_pool", "pi0_method", "l_th")
    fixed = {"p_method": ("null", _ONE_SIDED), "alternative": ("greater", _ONE_SIDED),
             "null": ("theoretical", _ONE_SIDED)}
    side = "above the null"
    evidence_header = "Mean P(above null)"
    map_texts = {
        "pvalue": MapText(
            "−log10 p, above null",
            "−log10 of the one-sided p-value: bright = attention above what noise input "
            "gives; 1 = p 0.1, 2 = p 0.01.",
            "−log10 p"),
        "posterior": MapText(
            "P(above null)",
            "Probability that the patch's attention is above the null (1 − local fdr).",
            "probability, 0–1"),
    }

    def statistics(self, observed: Any, null_scores: Any, options: Mapping[str, Any], *,
                   positions: np.ndarray | None = None, families: Any = None,
                   owner: tuple[np.ndarray, np.ndarray] | None = None,
                   family_tokens: np.ndarray | None = None) -> Any:
        from functools import partial

        from napari_attnreg.core.stats.directional import directional_statistics

        # heads, or tokens left out: each family alone, q⁺ over all of them (base class)
        test = partial(directional_statistics, null_pool=options["null_pool"],
                       pi0_method=options["pi0_method"])
        return self.pooled_statistics(test, observed, null_scores, options,
                                      positions=positions, families=families, owner=owner,
                                      family_tokens=family_tokens)

    def smallest_p(self, null_summary: Mapping[str, Any],
                   options: Mapping[str, Any]) -> float | None:
        """``1 / (1 + B·T_null)`` of the pooled test (None for the per-position null)."""
        if options.get("null_pool") != "pooled":
            return None
        pool = int(null_summary.get("B", 0)) * int(null_summary.get("T", 0))
        return 1.0 / (1 + pool) if pool else None

    def significance_meaning(self) -> str:
        return "the patch's attention is higher than noise input gives (false discovery rate)"


    def compared_with(self, nulls: str, count: str, what: str = "attention") -> str:
        return f"{what} higher here than the model gives to {nulls}{count}"

PROCEDURE = Directional()
