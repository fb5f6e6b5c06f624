"""The step-down procedure (the default): share step-down p-values and ForwardStop.

"Does this image's attention concentrate on anything more than null images made of its own
half-patch blocks do, and on which patches?" The numbers come from
:mod:`napari_attnreg.core.stats.stepdown_maps`; this module says how to run and read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from napari_attnreg.core.stats.procedures.base import MapText, Procedure


class StepDown(Procedure):
    """Share step-down inference with a map-level p (METHOD §16)."""

    name = "stepdown"
    title = "step-down"
    label = "step-down (default)"
    help = ("step-down (default): does the attention concentrate on anything more than null "
            "images made of the image's own half-patch blocks, and on which patches? "
            "Evidence = 1 − step-down adjusted p; significant by ForwardStop at α = 0.1; "
            "one map-level p answers 'is anything here?'.")
    defaults = {
        "p_method": None, "alternative": None, "pi0_method": None, "null": None,
        "null_pool": None, "method": "patch", "null_resolution": "source",
        "rule": "forwardstop", "z_th": None, "p_th": 0.05, "l_th": 0.2, "q_th": 0.1,
    }
    rules = ("forwardstop", "fwer", "soft")
    reads = ("tail",)
    refused = ("p_method", "alternative", "pi0_method", "null", "null_pool")
    refused_message = ("belong(s) to the pooled-null procedures; the step-down preset "
                       "compares re-normalized shares step by step and has no such option. "
                       "Pass preset='directional' or preset='paper' to use them.")
    uses_step_p = True
    half_patch_blocks = True
    offers_tail = True
    side = "step-down"
    evidence_header = "Mean evidence"
    # the step p, the step-down adjusted p and the evidence 1 − adjusted p; no lfdr: the
    # statistics' lfdr field only repeats the adjusted p, it is not a local fdr
    stored_maps = {"z": "z", "step_p": "p", "adjusted_p": "q", "evidence": "posterior"}
    evidence_map = "evidence"
    map_texts = {
        "pvalue": MapText(
            "−log10 adjusted p (step-down)",
            "−log10 of the step-down adjusted p: bright = this patch, and every patch with "
            "more attention, draw more of the attention than null images made of the image's "
            "own half-patch blocks; 1 = p 0.1, 2 = p 0.01.",
            "−log10 adjusted p"),
        "posterior": MapText(
            "evidence (1 − adjusted p)",
            "evidence: 1 − step-down adjusted p. Never lower for a patch with more attention; "
            "0.9 = adjusted p 0.1.",
            "evidence, 0–1"),
    }

    def statistics(self, observed: Any, null_scores: Any, options: Mapping[str, Any], *,
                   positions: np.ndarray | None = None, families: Any = None,
                   owner: tuple[np.ndarray, np.ndarray] | None = None,
                   family_tokens: np.ndarray | None = None) -> Any:
        from napari_attnreg.core.stats.stepdown_maps import stepdown_statistics

        return stepdown_statistics(observed, null_scores, tail=options.get("tail") or "none",
                                   families=families, owner=owner, family_tokens=family_tokens)

    def neg_log10_p(self, maps: Mapping[str, np.ndarray], n_null: int) -> np.ndarray:
        # the adjusted p, floored at the tail fit's 1/(100·(B + 1))
        return -np.log10(np.maximum(maps["adjusted_p"], 1.0 / (100.0 * (1 + n_null))))

    def significance_meaning(self) -> str:
        return ("the patch is among the most attended patches that, step by step, draw more "
                "of the attention than null images made of the image's own half-patch blocks")


    def compared_with(self, nulls: str, count: str, what: str = "attention") -> str:
        return f"{what} more concentrated here than on {nulls}{count}"

PROCEDURE = StepDown()
