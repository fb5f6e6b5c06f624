"""What the front ends show for a result: maps, names, legends, ranges, colours, text.

napari layers, notebook overlays and CLI figures all read these; a statistics map's name and
legend come from the procedure that made it (:mod:`napari_attnreg.core.stats.procedures`),
so each is written once. Under the directional preset the significance and posterior maps say
"above the null": bright means the model attends there *more* than it does to noise.

Every name, legend and colour bar also says which map was tested (:class:`MapInfo`, read from
the result's metadata): a class map names its target and, when signed (CDAM), the side tested
("for" or "against" the target); a signed map is drawn in a diverging colormap centred at 0,
and no map is rescaled per image (Grad-CAM's raw values are what the statistics test).

Example
-------
>>> [m.key for m in CONTINUOUS_MAPS]
['attention', 'pvalue', 'posterior', 'regularized']
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from napari_attnreg.core.results.map_info import MapInfo
from napari_attnreg.core.results.result import AttentionResult, scaling_caption, slide_downsample
from napari_attnreg.core.results.tissue_grid import tissue_token_grid
from napari_attnreg.core.stats.presets import presets
from napari_attnreg.core.stats.procedures import get_procedure

#: One colour for every significant-region outline (napari Labels, notebook, figures).
SIGNIFICANT_COLOR = "#00e5ff"
#: The same colour as 0–255 RGB (for front ends that paint pixels themselves).
SIGNIFICANT_RGB = tuple(int(SIGNIFICANT_COLOR[i:i + 2], 16) for i in (1, 3, 5))
#: Colormap of signed maps (CDAM): blue against the target, white at 0, red for it.
SIGNED_COLORMAP = "RdBu_r"


def preset_help(preset: str) -> str:
    """What a preset answers (tooltips of the preset controls), as its procedure says."""
    return get_procedure(preset).help


#: What each built-in preset answers (read :func:`preset_help` for one registered later).
PRESET_HELP = {name: preset_help(name) for name in presets()}
#: What each rule means (tooltips of the rule choices; their labels are the option metadata's).
RULE_HELP = {
    "forwardstop": "ForwardStop at α: the patches of largest attention, in order, as long as "
                   "their step p-values stay small on average (about α of them may be noise)",
    "fwer": "step-down adjusted p ≤ α (chance of any false patch at most α)",
    "q": "q ≤ threshold (FDR: about that share of the kept patches may be noise)",
    "p": "p ≤ threshold (per patch, no multiple-testing correction)",
    "lfdr": "lfdr ≤ threshold (posterior ≥ 1 − threshold)",
    "pi0": "drop the π0 share of patches with the largest p",
    "soft": "soft: attention × evidence (posterior; 1 − adjusted p under step-down), outlined "
            "where the evidence reaches 0.5",
    "base": "z ≥ threshold only",
}
RULE_THRESHOLD = {"q": "q_th", "p": "p_th", "lfdr": "l_th", "forwardstop": "q_th",
                  "fwer": "p_th"}
_RULE_SYMBOL = {"q": "q", "p": "p", "lfdr": "lfdr", "fwer": "adjusted p"}


def neg_log10_p(result: AttentionResult) -> np.ndarray:
    """``−log10 p`` of the map a result's significance layer shows.

    Step-down: the adjusted p (floored at the tail's ``1/(100·(B + 1))``); otherwise ``p``, a
    p of 0 (the paper's pooled top token) floored at the pool's resolution.
    """
    n_null = int(result.null_summary.get("B", result.metadata.get("n_boot", 1)))
    return result.procedure.neg_log10_p(result.maps, n_null)


def family_noun(metadata: Any) -> str:
    """What one step-down family of a run is: a head of ``map="heads"``, else a tile (a
    per-head run of one image said "in any of 6 tiles")."""
    return "head" if (metadata or {}).get("map") == "heads" else "tile"


def map_level_text(result: AttentionResult) -> str:
    """``"is anything here? p = 0.01 (resolution 1/101)"`` for a step-down result, else ``""``."""
    if result.p_map is None:
        return ""
    n_boot = int(result.null_summary.get("B", result.metadata.get("n_boot", 0)) or 0)
    tiles = int(result.null_summary.get("n_families", 1))
    where = f" in any of {tiles} {family_noun(result.metadata)}s" if tiles > 1 else ""
    return (f"is anything here{where}? p = {result.p_map:.2g} "
            f"(resolution 1/{n_boot + 1})")


def with_thresholds(result: AttentionResult, thresholds: dict[str, Any] | None) -> AttentionResult:
    """A copy of ``result`` whose default thresholds are ``thresholds`` (maps shared).

    A ``z_th`` of ``None`` turns the z mask off, as a front end's "z mask" box does (as it
    does in ``result.regularized(z_th=None)``).
    """
    used = result.thresholds_used
    given = {k: v for k, v in (thresholds or {}).items() if k in used}
    return replace(result, thresholds={**used, **given})


@dataclass(frozen=True)
class MapDisplay:
    """How one continuous map is shown.

    Attributes
    ----------
    key : str
        ``attention``, ``pvalue``, ``posterior`` or ``regularized``.
    colormap : str
        A colormap name both matplotlib and napari know.
    info : MapInfo
        The tested map (:meth:`for_result` sets it; the default is attention).
    """

    key: str
    colormap: str
    _values: Callable[[AttentionResult, dict[str, Any]], np.ndarray]
    info: MapInfo = MapInfo()

    def for_result(self, result: AttentionResult | None) -> MapDisplay:
        """This display for ``result``'s map: its names, and a diverging colormap centred at
        0 for the raw and regularized values of a signed map."""
        if result is None:
            return self
        info = MapInfo.of(result)
        colormap = SIGNED_COLORMAP if info.signed and self.signed_values else self.colormap
        return replace(self, info=info, colormap=colormap)

    @property
    def signed_values(self) -> bool:
        """Whether this display shows the map's own values (signed for a signed map)."""
        return self.key in ("attention", "regularized")

    @property
    def diverging(self) -> bool:
        """Drawn centred at 0 (a signed map's values)."""
        return self.info.signed and self.signed_values

    def title(self, preset: str, thresholds: dict[str, Any] | None = None) -> str:
        """Short name (layer suffix, panel title); names the map unless it is attention."""
        if self.key == "attention":
            return self.info.raw_title()
        if self.key in ("pvalue", "posterior"):
            text = get_procedure(preset).map_text(self.key).title
        else:
            text = f"regularized ({rule_text(thresholds)})" if thresholds else "regularized"
        return text if self.info.is_default else f"{self.info.caption()}: {text}"

    def legend(self, preset: str) -> str:
        """One sentence that says how to read the colours."""
        if self.key == "attention":
            return self.info.raw_legend()
        if self.key in ("pvalue", "posterior"):
            text = get_procedure(preset).map_text(self.key).legend
        elif self.diverging:
            text = (f"{self.info.label} kept where the rule calls it significant (the "
                    f"{self.info.sign} side), zero elsewhere.")
        else:
            what = "Attention" if self.info.is_default else self.info.label
            text = f"{what[:1].upper()}{what[1:]} kept where the rule calls it significant, zero elsewhere."
        return text if self.info.is_default else f"Tested map: {self.info.caption()}. {text}"

    def values(self, result: AttentionResult, thresholds: dict[str, Any] | None = None) -> np.ndarray:
        """The token map to show."""
        return self._values(result, thresholds or {})

    def limits(self, result: AttentionResult) -> tuple[float, float]:
        """Contrast limits that keep the scale stable while thresholds move."""
        if self.key == "posterior":
            return (0.0, 1.0)
        if self.key == "pvalue":  # NaN: a token never tested (glass, a sink) has no p
            shown = neg_log10_p(result)
            finite = shown[np.isfinite(shown)]
            return (0.0, max(1.0, float(finite.max()) if finite.size else 1.0))
        if self.diverging or (self.signed_values and MapInfo.of(result).signed):
            top = _top(np.abs(result.attention))
            return (-top, top)  # centred at 0: white is "neither for nor against"
        return (0.0, _top(result.attention))


def _top(values: np.ndarray) -> float:
    """The top of a map's scale: its largest value; 1 for a map that is 0 everywhere (a
    class map with no evidence), whose colour bar would otherwise run from 0 to a
    meaningless 1e-12."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    top = float(finite.max()) if finite.size else 0.0
    return top if top > 0 else 1.0


CONTINUOUS_MAPS = (
    MapDisplay("attention", "inferno", lambda r, t: r.attention),
    MapDisplay("pvalue", "viridis", lambda r, t: neg_log10_p(r)),
    MapDisplay("posterior", "plasma", lambda r, t: r.evidence),
    MapDisplay("regularized", "magma", lambda r, t: with_thresholds(r, t).regularized()),
)
MAPS_BY_KEY = {m.key: m for m in CONTINUOUS_MAPS}


def map_display(key: str, result: AttentionResult | None = None) -> MapDisplay:
    """How map ``key`` of ``result`` is shown (its tested map named, signed maps diverging)."""
    return MAPS_BY_KEY[key].for_result(result)


def rule_text(thresholds: dict[str, Any]) -> str:
    """``"q ≤ 0.1"``, ``"lfdr ≤ 0.3, z ≥ 0"``, ``"soft"``, ... for titles and summaries."""
    rule = thresholds.get("rule", "?")
    parts = []
    if rule == "forwardstop" and thresholds.get("q_th") is not None:
        parts.append(f"ForwardStop, α = {thresholds['q_th']:g}")
    elif rule in RULE_THRESHOLD and thresholds.get(RULE_THRESHOLD[rule]) is not None:
        parts.append(f"{_RULE_SYMBOL[rule]} ≤ {thresholds[RULE_THRESHOLD[rule]]:g}")
    elif rule == "pi0":
        parts.append("drop the π0 share with largest p")
    elif rule == "soft":  # the procedure's evidence: posterior, or 1 − adjusted p (step-down)
        parts.append("attention × evidence")
    else:
        parts.append(str(rule))
    if thresholds.get("z_th") is not None and rule != "soft":
        parts.append(f"z ≥ {thresholds['z_th']:g}")
    return ", ".join(parts)


def tissue_tokens(result: AttentionResult) -> np.ndarray | None:
    """Boolean token grid of the tokens a tiled run with a tissue mask tested (those of its
    tissue tiles, less the glass in them by the mask); None for a run without a mask. The
    others were never run or were left out as glass: their p, q, lfdr and posterior are NaN
    (files of earlier versions hold p = 1 there) and their attention 0, a fill that says
    nothing about them. Read-only: the grid is kept for the
    next caller."""
    tiles = result.null_summary.get("tissue_tiles")
    glass = result.null_summary.get("tissue_glass_tokens")  # glass of the run tiles
    if not isinstance(tiles, np.ndarray):
        return tissue_token_grid(tiles, result.metadata, result.patch_size, result.grid_shape,
                                 glass)
    md = result.metadata
    # the records that place the tiles, by value (a few hundred numbers); the run tiles by
    # identity, alive through the weak reference (a result and its re-thresholded copies
    # share them), and so the glass left out of them, which they are saved with
    key = (id(tiles), id(glass), *(repr(md.get(k)) for k in ("tile_origins_y",
                                                             "tile_origins_x", "tile_shape")),
           tuple(result.patch_size), tuple(result.grid_shape))
    for old in [k for k, (ref, _) in _TISSUE_TOKENS.items() if ref() is None]:
        del _TISSUE_TOKENS[old]  # a closed result's grid (a slide's is megabytes) goes with it
    hit = _TISSUE_TOKENS.get(key)
    if hit is not None and hit[0]() is tiles:
        return hit[1]
    tested = tissue_token_grid(tiles, md, result.patch_size, result.grid_shape, glass)
    if tested is not None:
        tested.setflags(write=False)  # shared by every caller from now on
    if len(_TISSUE_TOKENS) >= _TISSUE_TOKENS_KEPT:
        _TISSUE_TOKENS.pop(next(iter(_TISSUE_TOKENS)))
    _TISSUE_TOKENS[key] = (weakref.ref(tiles), tested)
    return tested


#: :func:`tissue_tokens` of the last few results: every caption, figure and status redraw
#: asks again, and a slide's grid takes some 15 ms to derive.
_TISSUE_TOKENS: dict[tuple, tuple[weakref.ref, np.ndarray | None]] = {}
_TISSUE_TOKENS_KEPT = 8


#: What a front end says of a patch no tissue tile holds.
GLASS_TEXT = "not tested: glass outside the tissue mask, never run"
#: What it says of a patch of a tissue tile that is glass by the mask (the tile was run).
TILE_GLASS_TEXT = "not tested: glass outside the tissue mask, left out of its tissue tile"


def glass_text(result: AttentionResult, i: int, j: int) -> str:
    """:data:`GLASS_TEXT`, or :data:`TILE_GLASS_TEXT` for glass of a run tile, for a token
    :func:`is_glass` says is glass."""
    left_out = result.null_summary.get("tissue_glass_tokens")
    flat = i * result.grid_shape[1] + j
    if isinstance(left_out, np.ndarray) and left_out.size:
        k = int(np.searchsorted(left_out, flat))  # ascending, as the run stores them
        if k < left_out.size and int(left_out[k]) == flat:
            return TILE_GLASS_TEXT
    return GLASS_TEXT


def is_glass(result: AttentionResult, i: int, j: int) -> bool:
    """Whether token ``(i, j)`` is glass a tiled run's tissue mask left out (NaN statistics
    in a run with a tissue mask; a file of an earlier version holds p = 1 there and reads
    as before)."""
    return "tissue_tiles" in result.null_summary and bool(np.isnan(result.evidence[i, j]))


def significance_caption(result: AttentionResult | Sequence[AttentionResult],
                         thresholds: dict[str, Any] | None = None) -> str:
    """``"12/256 patches significant (q ≤ 0.1), above the null"`` for status lines; under the
    soft rule, which tests nothing, ``"12/256 patches with evidence ≥ 0.5 (attention ×
    evidence)"``.

    A sequence of results (the planes of a stack) is counted together; with a tissue mask
    the count is of the patches tested (``"12/3,600 tissue patches significant"``).
    """
    results = [result] if isinstance(result, AttentionResult) else list(result)
    shown = [with_thresholds(r, thresholds) for r in results]
    masks = [r.significant() for r in shown]
    tissue = [tissue_tokens(r) for r in results]
    kept = sum(int(m.sum()) for m in masks)
    total = sum(int(t.sum()) if t is not None else m.size for m, t in zip(masks, tissue))
    what = "tissue patches" if any(t is not None for t in tissue) else "patches"
    side = results[0].procedure.side
    planes = f" in {len(results)} planes" if len(results) > 1 else ""
    rule = shown[0].thresholds_used
    # the soft rule weighs every patch by its evidence and tests none: its outline is where
    # the evidence reaches one half, which is what the count says
    verdict = "significant"
    if rule.get("rule") == "soft":
        z_th = rule.get("z_th")
        verdict = "with evidence ≥ 0.5" + (f" and z ≥ {z_th:g}" if z_th is not None else "")
    caption = f"{kept}/{total} {what} {verdict}{planes} ({rule_text(rule)}), {side}"
    if len(results) == 1 and results[0].p_map is not None:  # the map-level answer
        caption += f" · {map_level_text(results[0])}"
    return caption


def diagnostics_lines(result: AttentionResult, *, include_info: bool = True) -> list[str]:
    """The result's diagnostics as sentences, warnings first (``⚠`` marks a warning).

    An outline covering most of the image under a pooled-null preset leads, saying what it
    means there (:func:`.meaning.broad_outline_warning`); no line then advises trusting it.
    """
    from napari_attnreg.core.results.meaning import broad_outline_warning

    significant = result.significant()
    tested = tissue_tokens(result)  # the share of the patches tested: glass was never run
    broad = broad_outline_warning(result.preset, float(
        np.mean(significant) if tested is None else significant[tested].mean()))
    lines = [("⚠ " if d.severity == "warning" else "") + d.message
             for d in result.diagnostics if include_info or d.severity == "warning"]
    return ([f"⚠ {broad}"] if broad else []) + lines


def model_caption(result: AttentionResult) -> str:
    """``"demo (fluorescence nuclei)"``: the model and its declared domain, when it has one."""
    md = result.metadata
    domain = md.get("model_domain")
    return f"{md.get('model', '?')}" + (f" ({domain})" if domain else "")


def run_caption(result: AttentionResult, *, planes: int = 1) -> str:
    """``"demo · directional · normal B=200 · grid 28x28 · π0=0.93 · 1.2 s on cpu"``; a map
    other than attention follows the model (``"demo · CDAM for concept · stepdown ..."``)."""
    md = result.metadata
    gh, gw = result.grid_shape
    parts = [model_caption(result), result.preset, f"{md.get('method', '?')} B={md.get('n_boot', '?')}",
             f"grid {gh}x{gw}"]
    info = MapInfo.of(result)
    if not info.is_default:  # the tested map right after the model: "demo · CDAM for concept"
        parts.insert(1, info.caption())
    window = scaling_caption(md.get("intensity_scaling"))
    if window is not None:  # what the model saw: a CT's lung window is another question
        parts.append(window)
    if md.get("tiled"):
        masked = md.get("n_tissue_tiles") is not None and md.get("n_tiles_total") is not None
        parts.append(f"tiled: {md.get('n_tiles', '?')} of {md['n_tiles_total']} tiles (tissue)"
                     if masked else f"tiled: {md.get('n_tiles', '?')} tiles")
    if planes > 1:
        parts.append(f"{planes} planes")
    else:
        parts.append(f"p_map={result.p_map:.2g}" if result.p_map is not None
                     else f"π0={result.pi0:.3f}")
    total = md.get("timings", {}).get("total_s")
    if total is not None and planes == 1:
        parts.append(f"{total:.1f} s on {md.get('device', '?')}")
    return " · ".join(parts)


def unique_diagnostics(results: Sequence[AttentionResult], *, include_info: bool = True) -> list[str]:
    """:func:`diagnostics_lines` of several results (planes of a stack), each sentence once."""
    lines = [line for r in results for line in diagnostics_lines(r, include_info=include_info)]
    return sorted(dict.fromkeys(lines), key=lambda line: not line.startswith("⚠"))


#: Column headers of the ROI statistics table (keys of :func:`~.roi.roi_table`), in order.
ROI_COLUMNS = {
    "plane": "Plane",
    "label": "ROI",
    "area_px": "Area (px)",
    "area_um2": "Area (µm²)",
    "n_tokens": "Patches",
    "mean_attention": "Mean attention",
    "attention_enrichment": "Attention in/out",
    "attention_enrichment_low": "in/out 95% low",
    "attention_enrichment_high": "in/out 95% high",
    "mean_regularized": "Mean regularized",
    "mean_posterior": "Mean posterior",
    "frac_significant": "Significant share",
    "mean_pct_raw": "Attention percentile",
    "mean_pct_regularized": "Regularized percentile",
    "odds_ratio": "Odds ratio",
    "odds_ratio_low": "OR 95% low",
    "odds_ratio_high": "OR 95% high",
    "fisher_p": "Fisher p",
    "enrichment_test_note": "Enrichment test",
}
#: What each ROI column means (header tooltips).
ROI_COLUMN_HELP = {
    "area_um2": "Area in square micrometres, from the image's pixel size (napari: the image "
                "layer's scale and units; a slide's microns per pixel; a DICOM's spacing); "
                "empty when the image has none.",
    "n_tokens": "Patches whose footprint lies at least half inside the ROI (of a slide run "
                "with a tissue mask, its tissue patches: glass was never run, and no column "
                "counts it, inside or outside the ROI).",
    "mean_posterior": "Mean of the soft map over the ROI's patches: evidence 1 − adjusted p "
                      "(step-down), P(above null) (directional), 1 − lfdr (paper). The CSV and "
                      "napari's features table name this column mean_posterior for every "
                      "preset.",
    "frac_significant": "Share of the ROI's patches kept by the significance rule.",
    "mean_pct_raw": "Mean percentile of the ROI's attention among the patches outside it "
                    "(rank-based, 50 = typical). It can point the other way from the mean "
                    "attention: a few very high patches raise a mean while most patches of "
                    "the ROI rank low.",
    "mean_pct_regularized": "The same for the regularized attention.",
    "odds_ratio": "Odds of a patch being significant inside vs outside the ROI (conditional "
                  "maximum likelihood; 0 when no patch inside is significant).",
    "fisher_p": "Two-sided Fisher exact test of significant patches inside vs outside.",
    "attention_enrichment": "Mean attention inside the ROI over mean attention outside it "
                            "(1 = no enrichment). Needs no significant patch, so it holds "
                            "for any result.",
    "attention_enrichment_low": "95 % interval of the ratio over the image's patches (delta "
                                "method on its log). Neighbouring patches are correlated: it "
                                "is narrower than a between-image interval.",
    "attention_enrichment_high": "Upper end of the ratio's 95 % interval.",
    "enrichment_test_note": "'too few significant patches' when fewer than 5 patches of the "
                            "map are significant: the odds ratio and Fisher p then say little; "
                            "'not tested' for a region wholly on glass the tissue mask left "
                            "out; 'covers no pixel' for a region smaller than one pixel of the "
                            "level analysed (or off the image); 'covered by the regions drawn "
                            "over it' where others take all its pixels: no statistic then.",
}


#: Columns the ROI tables lead with: what any result supports (evidence, attention and its
#: enrichment with an interval), before the enrichment test, which needs significant patches.
ROI_LEAD_COLUMNS = ("label", "area_px", "area_um2", "n_tokens", "mean_posterior", "mean_attention",
                    "attention_enrichment", "attention_enrichment_low",
                    "attention_enrichment_high")


def roi_table_columns() -> list[str]:
    """The row keys of :func:`~napari_attnreg.core.stats.roi.roi_table` in the order the
    front ends show them (:data:`ROI_LEAD_COLUMNS` first; the CSV keeps the core's order)."""
    from napari_attnreg.core.stats.roi import ROI_COLUMNS as ROW_KEYS

    return [k for k in ROI_LEAD_COLUMNS if k in ROW_KEYS] + [k for k in ROW_KEYS
                                                             if k not in ROI_LEAD_COLUMNS]


#: ROI columns of the tested map's own values: named after the map when it is not attention.
_MAP_VALUE_COLUMNS = {"mean_attention": "Mean {}", "attention_enrichment": "{} in/out",
                      "mean_pct_raw": "{} percentile"}


def roi_header(key: str, preset: str, info: MapInfo | None = None) -> str:
    """Header of ROI column ``key``; the soft map's column is named as ``preset`` computes it
    (the generic name when there is no result yet: ``preset`` empty), and the map's value
    columns after the tested map (``info``: ``"Mean CDAM"``)."""
    if key == "mean_posterior" and preset in presets():
        return get_procedure(preset).evidence_header
    if info is not None and not info.is_default and key in _MAP_VALUE_COLUMNS:
        return _MAP_VALUE_COLUMNS[key].format(info.label)
    return ROI_COLUMNS.get(key, key)


def summary_text(results: AttentionResult | Sequence[AttentionResult],
                 thresholds: Mapping[str, Any] | None = None) -> str:
    """The one status line of a run: significance count, rule, side, B and time.

    ``"12/256 patches significant (q ≤ 0.1), above the null · B = 200 · 3.1 s on cpu"``
    """
    results = [results] if isinstance(results, AttentionResult) else list(results)
    if not results:
        return "No result yet."
    md = results[0].metadata
    parts = [significance_caption(results, thresholds), f"B = {md.get('n_boot', '?')}"]
    total = sum(r.metadata.get("timings", {}).get("total_s", 0.0) for r in results)
    if total:
        parts.append(f"{total:.1f} s on {md.get('device', '?')}")
    return " · ".join(parts)


def token_at(result: AttentionResult, row: float, col: float) -> tuple[int, int] | None:
    """The patch (token row, column) under original-image pixel ``(row, col)``, or None."""
    r, c = round(row), round(col)
    h0, w0 = result.image_shape
    if not (0 <= r < h0 and 0 <= c < w0):
        return None
    sy, sx = result.token_scale
    gh, gw = result.grid_shape
    return min(int((r + 0.5) / sy), gh - 1), min(int((c + 0.5) / sx), gw - 1)


def pixel_text(row: float, col: float, full_resolution_per_pixel: float = 1.0) -> str:
    """``"x=12 y=40"`` for pixel ``(row, col)`` of the image a run analysed; for a slide
    analysed at a coarser level, its place in the full-resolution (level 0) frame where
    QuPath, napari's cursor and exported outlines put it (``"x=49153 y=12801 (level 0)"``):
    analysed pixel ``i`` is centred on level-0 pixel ``f·i + (f − 1)/2``."""
    f = float(full_resolution_per_pixel)
    if f == 1.0:
        return f"x={round(col)} y={round(row)}"
    y, x = (int(np.floor(f * round(v) + (f - 1) / 2)) for v in (row, col))
    return f"x={x} y={y} (level 0)"


def describe_pixel(result: AttentionResult, row: float, col: float) -> str:
    """``"x=12 y=40 · patch (2,0) attention=0.031 z=2.10 p=0.004 q=0.04 posterior=0.97"``
    (the tested map's name in place of ``attention``: ``CDAM=-0.002``)."""
    token = token_at(result, row, col)
    if token is None:
        return ""
    i, j = token
    name = MapInfo.of(result).label
    xy = pixel_text(row, col, slide_downsample(result.metadata))
    if is_glass(result, i, j):  # its attention 0 is a fill, its statistics NaN
        return f"{xy} · patch ({i},{j}) {glass_text(result, i, j)}"
    where = f"{xy} · patch ({i},{j}) {name}={result.attention[i, j]:.4g}"
    if result.procedure.uses_step_p:
        maps = result.maps
        return (f"{where} step p={maps['step_p'][i, j]:.3g} "
                f"adjusted p={maps['adjusted_p'][i, j]:.3g} evidence={maps['evidence'][i, j]:.3g}")
    return (f"{where} z={result.z[i, j]:.2f} p={result.p[i, j]:.3g} q={result.q[i, j]:.3g} "
            f"posterior={result.posterior[i, j]:.3g}")
