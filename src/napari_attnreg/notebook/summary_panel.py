"""What a result says in words: the significance count, the map-level p or π0, the run and its
diagnostics."""

from __future__ import annotations

import html
import math

import ipywidgets as W
import numpy as np

from napari_attnreg.core.results.display import (
    MapInfo,
    diagnostics_lines,
    run_caption,
    summary_text,
)
from napari_attnreg.core.results.meaning import result_meaning
from napari_attnreg.core.results.result import AttentionResult

WARNING_COLOR = "#b26a00"


def timing_text(result: AttentionResult) -> str:
    """``"in 3.1 s on cpu (model 0.2 s, observed 0.05 s, 200 nulls 2.4 s, statistics 0.4 s)"``."""
    md = result.metadata
    tm = md.get("timings", {})
    load = md.get("model_load_s", 0.0)
    parts = [f"model {load:.1f} s"] if load >= 0.05 else []
    observed = f"{md['n_tiles']} tiles" if md.get("tiled") else "observed"
    parts += [f"{observed} {tm.get('observed_s', math.nan):.2f} s",
              f"{md.get('n_boot', '?')} nulls {tm.get('nulls_s', math.nan):.1f} s",
              f"statistics {tm.get('statistics_s', math.nan):.2f} s"]
    total = tm.get("total_s", math.nan) + load
    return f"in {total:.1f} s on {md.get('device', '?')} ({', '.join(parts)})"


def done_text(result: AttentionResult, plane: tuple[int, ...],
              viewing: tuple[int, ...]) -> tuple[str, str]:
    """Status line and level of a finished run; says which plane it was computed for."""
    n_warnings = len(diagnostics_lines(result, include_info=False))
    note = f" ⚠ {n_warnings} warning(s) below." if n_warnings else ""
    where = f" (plane {plane})" if plane else ""
    if plane != viewing:
        note += (f" You are looking at plane {viewing}: move the slider back to {plane} to "
                 "see this result.")
    return f"Done{where} {timing_text(result)}.{note}", "warning" if n_warnings else "success"


def kept_share(result: AttentionResult) -> tuple[float, str]:
    """The share of the tested map the regularized map keeps, and what it is a share of
    (a signed map: its tested side, ``"the evidence for concept"``)."""
    info = MapInfo.of(result)
    values, kept = result.attention, result.regularized()
    if info.signed:  # a sum of signed values is no amount: the side the statistics test
        flip = -1.0 if info.sign == "against" else 1.0
        values, kept = np.maximum(flip * values, 0.0), np.maximum(flip * kept, 0.0)
        what = f"the evidence {info.sign} {info.target_text}".rstrip()
    else:
        what = "the attention" if info.is_default else f"the {info.label}"
    total = float(values.sum())
    return (float(kept.sum()) / total if total > 0 else math.nan), what


class SummaryPanel(W.VBox):
    """Two lines under the image: the count at the current thresholds, then the run."""

    def __init__(self) -> None:
        self.summary = W.HTML().add_class("attnreg-summary")
        self.diagnostics = W.HTML().add_class("attnreg-diagnostics")
        super().__init__([self.summary, self.diagnostics])

    def show(self, result: AttentionResult | None) -> None:
        """The count and words of ``result``, at the thresholds it applies (None: nothing)."""
        if result is None:
            self.summary.value = self.diagnostics.value = ""
            return
        kept, what = kept_share(result)
        info = MapInfo.of(result)
        caption = html.escape(("" if info.is_default else f"{info.caption()}: ")
                              + summary_text(result, result.thresholds), quote=False)
        # the step-down caption carries its map-level p; π0 belongs to the pooled presets
        pi0 = "" if result.p_map is not None else f" · π0 = {result.pi0:.3f}"
        meaning = html.escape(result_meaning(result.preset, result.metadata), quote=False)
        self.summary.value = (f"<b>{caption}</b>{pi0} · regularized map keeps "
                              f"{100 * kept:.1f}% of {what}<br><i>{meaning}</i>")
        lines = [html.escape(run_caption(result), quote=False)]
        for line in diagnostics_lines(result):
            text = html.escape(line, quote=False)
            lines.append(f"<span style='color:{WARNING_COLOR}'>{text}</span>"
                         if line.startswith("⚠") else text)
        self.diagnostics.value = "<br>".join(lines)
