"""What the front ends show for a result: maps, names, legends, ranges, colours, text.

napari layers, notebook overlays and CLI figures all read these, so a map's name or legend
is written once. Under the directional preset the significance and posterior maps say
"above the null": bright means the model attends there *more* than it does to noise.

Example
-------
>>> [m.key for m in CONTINUOUS_MAPS]
['attention', 'pvalue', 'posterior', 'regularized']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .result import AttentionResult

#: One colour for every significant-region outline (napari Labels, notebook, figures).
SIGNIFICANT_COLOR = "#00e5ff"
RULE_THRESHOLD = {"q": "q_th", "p": "p_th", "lfdr": "l_th"}
_RULE_SYMBOL = {"q": "q", "p": "p", "lfdr": "lfdr"}


def neg_log10_p(result: AttentionResult) -> np.ndarray:
    """``−log10 p``, a p of 0 (the paper's pooled top token) floored at the pool's resolution."""
    n_null = int(result.null_summary.get("B", result.metadata.get("n_boot", 1)))
    floor = 1.0 / ((1 + n_null) * result.attention.size)
    return -np.log10(np.maximum(result.p, floor))


def _directional(preset: str) -> bool:
    return preset != "paper"


@dataclass(frozen=True)
class MapDisplay:
    """How one continuous map is shown.

    Attributes
    ----------
    key : str
        ``attention``, ``pvalue``, ``posterior`` or ``regularized``.
    colormap : str
        A colormap name both matplotlib and napari know.
    """

    key: str
    colormap: str
    _values: Callable[[AttentionResult, dict[str, Any]], np.ndarray]

    def title(self, preset: str, thresholds: dict[str, Any] | None = None) -> str:
        """Short name (layer suffix, panel title)."""
        up = _directional(preset)
        if self.key == "attention":
            return "attention"
        if self.key == "pvalue":
            return "−log10 p, above null" if up else "−log10 p (two-sided)"
        if self.key == "posterior":
            return "P(above null)" if up else "posterior 1 − lfdr (two-sided)"
        return f"regularized ({rule_text(thresholds or {})})"

    def legend(self, preset: str) -> str:
        """One sentence that says how to read the colours."""
        up = _directional(preset)
        if self.key == "attention":
            return "CLS attention of each patch (bright = the model looks here)."
        if self.key == "pvalue":
            return ("−log10 of the one-sided p-value: bright = attention above what noise "
                    "input gives; 1 = p 0.1, 2 = p 0.01." if up else
                    "−log10 of the paper's two-sided p-value: bright = far from the null in "
                    "either direction (also BELOW it).")
        if self.key == "posterior":
            return ("Probability that the patch's attention is above the null (1 − local fdr)."
                    if up else "1 − local fdr on z, two-sided: high also for attention far "
                    "below the null.")
        return "Attention kept where the rule calls it significant, zero elsewhere."

    def values(self, result: AttentionResult, thresholds: dict[str, Any] | None = None) -> np.ndarray:
        """The token map to show."""
        return self._values(result, thresholds or {})

    def limits(self, result: AttentionResult) -> tuple[float, float]:
        """Contrast limits that keep the scale stable while thresholds move."""
        if self.key == "posterior":
            return (0.0, 1.0)
        if self.key == "pvalue":
            return (0.0, max(1.0, float(neg_log10_p(result).max())))
        return (0.0, max(float(result.attention.max()), 1e-12))


CONTINUOUS_MAPS = (
    MapDisplay("attention", "inferno", lambda r, t: r.attention),
    MapDisplay("pvalue", "viridis", lambda r, t: neg_log10_p(r)),
    MapDisplay("posterior", "plasma", lambda r, t: r.posterior),
    MapDisplay("regularized", "magma", lambda r, t: r.regularized(**t)),
)
MAPS_BY_KEY = {m.key: m for m in CONTINUOUS_MAPS}


def rule_text(thresholds: dict[str, Any]) -> str:
    """``"q ≤ 0.1"``, ``"lfdr ≤ 0.3, z ≥ 0"``, ``"soft"``, ... for titles and summaries."""
    rule = thresholds.get("rule", "?")
    parts = []
    if rule in RULE_THRESHOLD and thresholds.get(RULE_THRESHOLD[rule]) is not None:
        parts.append(f"{_RULE_SYMBOL[rule]} ≤ {thresholds[RULE_THRESHOLD[rule]]:g}")
    elif rule == "pi0":
        parts.append("drop the π0 share with largest p")
    elif rule == "soft":
        parts.append("attention × posterior")
    else:
        parts.append(str(rule))
    if thresholds.get("z_th") is not None and rule != "soft":
        parts.append(f"z ≥ {thresholds['z_th']:g}")
    return ", ".join(parts)


def significance_caption(result: AttentionResult, thresholds: dict[str, Any] | None = None) -> str:
    """``"12/256 patches significant (q ≤ 0.1), above the null"`` for status lines."""
    t = {**result._thresholds(), **(thresholds or {})}
    mask = result.significant(**t)
    side = "above the null" if _directional(result.preset) else "paper's two-sided test"
    return f"{int(mask.sum())}/{mask.size} patches significant ({rule_text(t)}), {side}"


def diagnostics_lines(result: AttentionResult, *, include_info: bool = True) -> list[str]:
    """The result's diagnostics as sentences, warnings first (``⚠`` marks a warning)."""
    return [("⚠ " if d.severity == "warning" else "") + d.message for d in result.diagnostics
            if include_info or d.severity == "warning"]


def model_caption(result: AttentionResult) -> str:
    """``"demo · demo domain"``: the model and its declared domain."""
    md = result.metadata
    domain = md.get("model_domain")
    return f"{md.get('model', '?')}" + (f" ({domain})" if domain else "")
