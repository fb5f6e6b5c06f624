"""What one patch's numbers are and which null they were compared with (patch inspectors).

:func:`patch_report` reads only what a result stores: its token maps and ``null_summary``.

- step-down: the patch's step (its rank by attention), how many null maps reached its step
  statistic (``p_k = (1 + n)/(1 + B)``; the tail fit where fewer than 10 did), and why its
  adjusted p is what it is (the largest step p up to its step; a tile's BH floor);
- directional / paper: its z, the pooled null z it was ranked in (quantiles, share below)
  and the null z at its own position.

Example
-------
>>> report = patch_report(result, 40.0, 12.0)      # doctest: +SKIP
>>> print(report.text())                           # doctest: +SKIP
patch (5, 1) · x=12 y=40 · significant (ForwardStop, α = 0.1)
attention 0.0312 · step p 0.0588 · adjusted p 0.0588 · evidence 0.941
step 2 of 168: 0 of 16 null maps reached its step statistic → p = (1 + 0)/(16 + 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from napari_attnreg.core.results.display import (
    GLASS_TEXT,
    MapInfo,
    family_noun,
    glass_text,
    is_glass,
    map_level_text,
    pixel_text,
    rule_text,
    token_at,
)
from napari_attnreg.core.results.result import AttentionResult, slide_downsample
from napari_attnreg.core.stats.tail import MIN_EXCEEDING

#: Quantiles of the pooled null named in the report.
NULL_QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True)
class PatchReport:
    """One patch of a result, as an inspector shows it.

    Attributes
    ----------
    token : (int, int)
        Token row and column.
    pixel : (int, int)
        The image pixel (row, column) that was asked about.
    values : tuple of (str, str)
        ``(name, formatted value)`` of the patch's maps, in reading order.
    significant : bool
        Whether the result's rule (at its thresholds) keeps the patch.
    tested : bool
        False for glass a tiled run's tissue mask left out: never run, no statistics.
    rule : str
        That rule in words (``"ForwardStop, α = 0.1"``).
    null_lines : tuple of str
        How the patch was compared with the null, in sentences.
    null_histogram : (counts, edges) or None
        The pooled null z the patch's z was ranked in (directional, paper); None for step-down,
        whose null step statistics are not stored.
    statistic : float or None
        The patch's z on that histogram.
    """

    token: tuple[int, int]
    pixel: tuple[int, int]
    values: tuple[tuple[str, str], ...]
    significant: bool
    rule: str
    null_lines: tuple[str, ...]
    null_histogram: tuple[np.ndarray, np.ndarray] | None = field(default=None, compare=False)
    statistic: float | None = None
    tested: bool = True
    full_resolution_per_pixel: float = 1.0

    @property
    def headline(self) -> str:
        """``"patch (5, 1) · x=12 y=40 · significant (q ≤ 0.1)"``; a slide analysed at a
        coarser level gives x, y at full resolution (``"x=49153 y=12801 (level 0)"``)."""
        i, j = self.token
        verdict = ("significant" if self.significant else "not significant") if self.tested \
            else "not tested"
        where = pixel_text(*self.pixel, self.full_resolution_per_pixel)
        return f"patch ({i}, {j}) · {where} · {verdict} ({self.rule})"

    def text(self) -> str:
        """The whole report as plain lines (status bars, tooltips, logs)."""
        values = " · ".join(f"{name} {value}" for name, value in self.values)
        return "\n".join([self.headline, *([values] if values else []), *self.null_lines])


def patch_report(result: AttentionResult, row: float, col: float) -> PatchReport | None:
    """The report of the patch under image pixel ``(row, col)`` (None: outside the image).

    ``result`` should carry the thresholds to judge significance by (e.g. a session's
    ``shown`` result).
    """
    token = token_at(result, row, col)
    if token is None:
        return None
    i, j = token
    significant = bool(result.significant()[i, j])
    common = {"token": token, "pixel": (round(row), round(col)), "significant": significant,
              "rule": rule_text(result.thresholds_used),
              "full_resolution_per_pixel": slide_downsample(result.metadata)}
    if is_glass(result, i, j):  # never run, or glass of a run tile: no value is reported
        text = glass_text(result, i, j)
        why = ("no tissue tile holds this patch." if text == GLASS_TEXT else
               "its tile was run, but the mask has no tissue within a few mask pixels of it.")
        return PatchReport(values=(), null_lines=(f"{text[:1].upper()}{text[1:]}: {why}",),
                           tested=False, **common)
    if result.procedure.uses_step_p:
        return PatchReport(values=_stepdown_values(result, i, j),
                           null_lines=tuple(_stepdown_lines(result, i, j)), **common)
    hist = _null_histogram(result)
    return PatchReport(values=_pooled_values(result, i, j),
                       null_lines=tuple(_pooled_lines(result, i, j)), null_histogram=hist,
                       statistic=float(result.z[i, j]), **common)


def _g(value: float) -> str:
    return f"{float(value):.3g}"


def _map_value(result: AttentionResult, i: int, j: int) -> tuple[tuple[str, str], ...]:
    """The patch's value of the tested map under its name, after the map itself when it is
    not attention (``("map", "CDAM for concept"), ("CDAM", "-0.0021")``)."""
    info = MapInfo.of(result)
    value = (info.label, f"{result.attention[i, j]:.4g}")
    return (value,) if info.is_default else (("map", info.caption()), value)


def _n_null(result: AttentionResult) -> int:
    return int(result.null_summary.get("B", result.metadata.get("n_boot", 0)) or 0)


# ---- step-down ---------------------------------------------------------------------------
def _stepdown_values(result: AttentionResult, i: int, j: int) -> tuple[tuple[str, str], ...]:
    maps = result.maps
    values = (*_map_value(result, i, j), ("step p", _g(maps["step_p"][i, j])),
              ("adjusted p", _g(maps["adjusted_p"][i, j])),
              ("evidence", _g(maps["evidence"][i, j])))
    # the step-down uses z only through an optional z mask: shown only when one is set
    if result.thresholds_used.get("z_th") is not None:
        values += (("z", f"{result.z[i, j]:.2f}"),)
    return values


def _stepdown_step(result: AttentionResult, flat: int) -> tuple[int, int, float] | None:
    """(family, step, adjusted p) of the step that gives the token its adjusted p."""
    summary = result.null_summary
    if "stepdown_step_token" not in summary:
        return None
    families, steps = np.nonzero(np.asarray(summary["stepdown_step_token"]) == flat)
    if families.size == 0:
        return None
    adjusted = np.asarray(summary["stepdown_adjusted_p"])[families, steps]
    floor = summary.get("stepdown_family_adjusted_p")
    if floor is not None:
        adjusted = np.maximum(adjusted, np.asarray(floor)[families])
    best = int(np.argmin(adjusted))
    return int(families[best]), int(steps[best]), float(adjusted[best])


def _stepdown_lines(result: AttentionResult, i: int, j: int) -> list[str]:
    summary = result.null_summary
    gh, gw = result.grid_shape
    found = _stepdown_step(result, i * gw + j)
    if found is None:
        return ["The result does not store its step-down steps (an older file)."]
    fam, step, adjusted = found
    n_boot = _n_null(result)
    step_p = float(np.asarray(summary["stepdown_step_p"])[fam, step])
    n_steps = int(np.asarray(summary["stepdown_step_p"]).shape[1])
    n_fam = int(summary.get("n_families", 1))
    where = f" in {family_noun(result.metadata)} {fam + 1} of {n_fam}" if n_fam > 1 else ""
    lines = [f"Step {step + 1} of {n_steps}{where}: its share of the attention left at this "
             "step is compared with the largest share any null map gives to the same "
             "remaining patches."]
    if bool(np.asarray(summary["stepdown_tail"])[fam, step]):
        lines.append(f"Fewer than {MIN_EXCEEDING} of {n_boot} null maps reached its step "
                     f"statistic; step p = {_g(step_p)} from the generalized Pareto tail fit.")
    else:
        reached = max(0, round(step_p * (n_boot + 1)) - 1)
        lines.append(f"{reached} of {n_boot} null maps reached its step statistic → step p = "
                     f"(1 + {reached})/(1 + {n_boot}) = {_g(step_p)}.")
    step_adjusted = float(np.asarray(summary["stepdown_adjusted_p"])[fam, step])
    floor = summary.get("stepdown_family_adjusted_p")
    if floor is not None and float(np.asarray(floor)[fam]) > step_adjusted:
        unit = family_noun(result.metadata)
        lines.append(f"Adjusted p {_g(adjusted)}: the {unit}'s Benjamini–Hochberg adjusted p "
                     f"({unit}s are selected first).")
    elif step_adjusted > step_p:
        lines.append(f"Adjusted p {_g(adjusted)}: the largest step p up to this step "
                     "(a patch never has more evidence than one with more attention).")
    else:
        lines.append(f"Adjusted p {_g(adjusted)}: its own step p.")
    level = map_level_text(result)
    if level:
        lines.append(f"Map level: {level}.")
    return lines


# ---- directional and paper: z against the pooled null ------------------------------------
def _pooled_values(result: AttentionResult, i: int, j: int) -> tuple[tuple[str, str], ...]:
    up, maps = result.procedure.one_sided, result.maps
    return (*_map_value(result, i, j), ("z", f"{maps['z'][i, j]:.2f}"),
            ("p⁺" if up else "p (two-sided)", _g(maps["p"][i, j])),
            ("q⁺" if up else "q", _g(maps["q"][i, j])),
            ("P(above null)" if up else "posterior", _g(maps["posterior"][i, j])),
            ("lfdr", _g(maps["lfdr"][i, j])))


def _null_histogram(result: AttentionResult) -> tuple[np.ndarray, np.ndarray] | None:
    summary = result.null_summary
    if "hist_counts" not in summary or "hist_edges" not in summary:
        return None
    return np.asarray(summary["hist_counts"]), np.asarray(summary["hist_edges"])


def _family_lines(result: AttentionResult, i: int, j: int) -> list[str]:
    """Which head speaks for the patch (``map="heads"``), or that it was left out."""
    if np.isnan(result.p[i, j]):
        return ["Not tested: left out of the test as an attention sink (exclude_sinks=True)."]
    families = result.null_summary.get("family_posterior")
    if families is None or np.shape(families)[0] < 2:
        return []
    heads = result.head_attention
    which = ("The head" if heads is None else
             f"Head {int(np.argmax(heads[:, i, j]))} of {np.shape(families)[0]}")
    return [f"{which} that gives this patch the most attention speaks for it: its z, p, "
            "local fdr and posterior are shown; q counts every head's patches."]


def _pooled_lines(result: AttentionResult, i: int, j: int) -> list[str]:
    summary = result.null_summary
    z = float(result.z[i, j])
    lines = _family_lines(result, i, j)
    if "mu0" in summary and "sigma0" in summary:
        lines.append(f"z = {z:.2f}: its log attention against the pooled null's "
                     f"(μ0 = {float(summary['mu0']):.3g}, σ0 = {float(summary['sigma0']):.3g}).")
    levels, quantiles = summary.get("quantile_levels"), summary.get("z_null_quantiles")
    if levels is not None and quantiles is not None:
        levels, quantiles = np.asarray(levels, float), np.asarray(quantiles, float)
        named = ", ".join(f"{round(100 * q)}% {np.interp(q, levels, quantiles):.2f}"
                          for q in NULL_QUANTILES)
        size = f"{_n_null(result)} × {summary.get('T', '?')}"
        if z > quantiles[-1]:
            rank = f"above every null z (largest {quantiles[-1]:.2f})"
        elif z < quantiles[0]:
            rank = f"below every null z (smallest {quantiles[0]:.2f})"
        else:
            rank = f"above {100 * float(np.interp(z, quantiles, levels)):.1f}% of them"
        lines.append(f"Pooled null z (B × patches = {size}): {named}; this patch is {rank}.")
    mean, std = summary.get("z_null_mean"), summary.get("z_null_std")
    flat = i * result.grid_shape[1] + j
    if mean is not None and std is not None and np.size(mean) == result.attention.size:
        lines.append(f"Null z at this patch's position: {float(np.ravel(mean)[flat]):.2f} "
                     f"± {float(np.ravel(std)[flat]):.2f} (mean ± sd over the null images).")
    side = ("one-sided: attention above the null" if result.procedure.one_sided
            else "two-sided: far from the null either way")
    lines.append(f"p is {side}.")
    return lines
