"""docs/validation.md from the harness's per-article results (benchmarks/results/*.json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy import stats

PRESETS = ("stepdown", "directional", "paper")
CASES = ("grey, native", "grey, resized", "RGB, native", "RGB, resized", "all noise inputs")


def _f(value, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and 0 < abs(value) < 10 ** -digits:
        return f"{value:.1e}"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _pct(value) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def _yes(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def _any_significant(noise: dict, n_boot: int, alpha: float = 0.1) -> str:
    """Noise inputs with a discovery, set against what a uniform map-level p implies.

    ForwardStop keeps the first step whenever ``p_map ≤ 1 − e^(−α)``; with counting p-values
    on the grid ``1/(B+1)`` a uniform ``p_map`` does so with probability
    ``⌊(1 − e^(−α))(B+1)⌋/(B+1)``. Discoveries beyond those inputs come from later steps.
    """
    n = noise["n"]
    cut = -np.expm1(-alpha)
    expected = np.floor(cut * (n_boot + 1)) / (n_boot + 1)
    first = sum(p <= cut for p in noise.get("map_p", []))
    ci = stats.binomtest(round(noise["any_sig"] * n), n).proportion_ci(0.95, "exact")
    return (f"{_pct(noise['any_sig'])} of {n} (95 % CI {_pct(ci.low)}–{_pct(ci.high)}); "
            f"{first} with map-level p ≤ {cut:.3f}; a uniform map-level p gives "
            f"{_pct(expected)} at B = {n_boot}")


def _found(planted: dict) -> str:
    """Objects found in the planted mosaics, the recall's CI and the model's own ceiling."""
    text = f"{planted['found']}/{planted['objects']} objects"
    if "mosaics" in planted:
        text += f" in {planted['mosaics']} mosaic{'s' if planted['mosaics'] != 1 else ''}"
    if "recall_ci" in planted:
        lo, hi = planted["recall_ci"]
        text += f" (recall {_pct(planted['recall'])}, 95 % CI {_pct(lo)}–{_pct(hi)})"
    if planted.get("under_top_patch") is not None:
        text += (f"; {planted['under_top_patch']} lie under the most attended patch of one of "
                 "their tiles")
    return text


def _kinds(crops: dict) -> str | None:
    """Where the significant patches of the empty crops lie, against all their patches."""
    every, sig = crops.get("patch_kinds"), crops.get("significant_kinds")
    if not every:
        return None
    total, n_sig = sum(every.values()), sum(sig.values())
    if not n_sig:
        return "Step-down: no significant patch on any empty crop."
    parts = [f"{kind} {sig.get(kind, 0)} ({_pct(sig.get(kind, 0) / n_sig)}; "
             f"{_pct(every[kind] / total)} of all patches)"
             for kind in sorted(every, key=lambda k: (-sig.get(k, 0), -every[k]))]
    return (f"Where the step-down's {n_sig} significant patches of the empty crops lie: "
            + ", ".join(parts) + ".")


def requirements(r: dict) -> list[tuple[str, bool, str]]:
    """The §16 requirements for the step-down default on one article: (what, met, numbers)."""
    noise = r["noise"]["all noise inputs|stepdown"]
    crops = r["crops"]["stepdown"]
    loc = r["localization"]["stepdown"]
    lo, hi = loc["delta_ci"]
    return [
        ("noise inputs: map-level p uniform (KS p > 0.05, ≥ 60 inputs)",
         noise["n"] >= 60 and (noise["ks_map_p"] or 0) > 0.05,
         f"KS p = {_f(noise['ks_map_p'])} over {noise['n']} inputs"),
        ("noise inputs: ≤ 10 % with any significant patch", noise["any_sig"] <= 0.10,
         _any_significant(noise, r["n_boot"])),
        ("empty crops: ≤ 1 % of patches significant on average", crops["mean_sig"] <= 0.01,
         _pct(crops["mean_sig"])),
        ("empty crops: ≤ 5 % in the worst crop", crops["worst_sig"] <= 0.05, _pct(crops["worst_sig"])),
        ("empty crops: evidence ≥ 0.5 on ≤ 5 % of patches", crops["evidence_half"] <= 0.05,
         _pct(crops["evidence_half"])),
        ("planted objects: ΔF1 vs Otsu, 95 % CI excludes 0 (≥ 48 fields)",
         loc["n"] >= 48 and lo > 0,
         f"ΔF1 = {loc['delta_f1']:+.3f} [{lo:+.3f}, {hi:+.3f}] over {loc['n']} fields"),
    ] + _tiled_requirements(r)


def _tiled_requirements(r: dict) -> list[tuple[str, bool, str]]:
    """The tiled requirements, where the article has the tiled section (dinov2 has not)."""
    if "tiled" not in r:
        return []
    planted, tiled_noise = r["tiled"]["planted|stepdown"], r["tiled"]["noise|stepdown"]
    return [
        ("tiled mosaics: every planted object found",
         planted["objects"] > 0 and planted["found"] == planted["objects"], _found(planted)),
        ("tiled noise mosaics: tile p uniform", (tiled_noise["tile_p_ks"] or 0) > 0.05,
         f"KS p = {_f(tiled_noise['tile_p_ks'])} over {tiled_noise['n_tile_p']} tiles"),
        ("tiled noise mosaics: ≤ 10 % with any significant patch", tiled_noise["any_sig"] <= 0.10,
         f"{_pct(tiled_noise['any_sig'])} of {tiled_noise['n']}"),
    ]


def _article_section(r: dict) -> list[str]:
    """One article's section; the subsections of sections it has no results for are left out
    (dinov2 has no tiled mosaics and no noise-ROI simulation)."""
    lines = _header(r)
    for part in (_noise_lines, _texture_lines, _crop_lines, _localization_lines, _tiled_lines,
                 _simulation_lines, _runtime_lines):
        lines += part(r)
    return lines


def _header(r: dict) -> list[str]:
    tiled = f" (tiled: {r['n_boot_tiled']})" if "tiled" in r else ""
    minutes = f"{r['seconds'] / 60:.1f} min; " if "seconds" in r else ""
    lines = [f"## Article `{r['article']}`: {r['description']}", "",
             f"Model: {r['model']}. B = {r['n_boot']}{tiled}; "
             f"{minutes}source {r['source']}; "
             f"`python benchmarks/validate.py {' '.join(r['argv'])}`.", "",
             "### Step-down requirements (METHOD §16)", "", "| requirement | result | |",
             "|---|---|---|"]
    for what, ok, numbers in requirements(r):
        lines.append(f"| {what} | {numbers} | {_yes(ok)} |")
    return lines


def _noise_lines(r: dict) -> list[str]:
    lines = ["", "### Noise inputs given as images", "",
              "White Gaussian noise with a held-out field's mean and sd, at the model's input size "
              "(native) or 2.5 times larger (resized: the preprocessing shrinks and smooths it). "
              "Step-down: KS of the map-level p (counting p randomized within its 1/(B+1) step). "
              "Other presets have no map-level p: KS statistic of their token p-values.", "",
              "| case | preset | inputs | KS p of map-level p | token-p KS statistic | "
              "any significant | patches significant |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for case in CASES:
        for preset in PRESETS:
            n = r["noise"][f"{case}|{preset}"]
            # step p-values are not uniform patch by patch (after the first steps most are 1)
            tokens = None if preset == "stepdown" else n.get("ks_tokens")
            lines.append(f"| {case} | {preset} | {n['n']} | {_f(n.get('ks_map_p'))} | "
                         f"{_f(tokens)} | {_pct(n['any_sig'])} | {_pct(n['frac_sig'])} |")
    return lines


def _texture_lines(r: dict) -> list[str]:
    if "texture" not in r:
        return []
    lines = ["", "### Structured noise (spectrum and grey levels of a field, random phases)", "",
              "| preset | inputs | KS p of map-level p | any significant | patches significant |",
              "|---|---:|---:|---:|---:|"]
    for preset in PRESETS:
        t = r["texture"][preset]
        lines.append(f"| {preset} | {t['n']} | {_f(t['ks_map_p'])} | {_pct(t['any_sig'])} | "
                     f"{_pct(t['frac_sig'])} |")
    return lines


def _crop_lines(r: dict) -> list[str]:
    lines = ["", "### Crops without decisive objects", "",
              "Evidence: 1 − adjusted p (step-down), posterior⁺ (directional), 1 − lfdr (paper).", "",
              "| preset | crops | patches significant (mean) | worst crop | evidence ≥ 0.5 (mean) | worst crop |",
              "|---|---:|---:|---:|---:|---:|"]
    for preset in PRESETS:
        c = r["crops"][preset]
        lines.append(f"| {preset} | {c['n']} | {_pct(c['mean_sig'])} | {_pct(c['worst_sig'])} | "
                     f"{_pct(c['evidence_half'])} | {_pct(c['worst_evidence_half'])} |")
    kinds = _kinds(r["crops"]["stepdown"])
    if kinds:
        lines += ["", kinds]
    return lines


def _localization_lines(r: dict) -> list[str]:
    loc = r["localization"]
    lines = ["", "### Planted objects: localization", "",
              "Truth: patches at least a quarter covered by a decisive object. ΔF1: paired "
              "difference to raw attention > Otsu, 95 % percentile bootstrap CI over fields.", "",
              "| method | precision | recall | F1 | ΔF1 vs Otsu [95 % CI] |", "|---|---:|---:|---:|---:|"]
    for preset in PRESETS:
        x = loc[preset]
        lo, hi = x["delta_ci"]
        lines.append(f"| {preset} (default rule) | {x['precision']:.3f} | {x['recall']:.3f} | "
                     f"{x['f1']:.3f} | {x['delta_f1']:+.3f} [{lo:+.3f}, {hi:+.3f}] |")
    o = loc["otsu"]
    lines.append(f"| raw attention > Otsu | {o['precision']:.3f} | {o['recall']:.3f} | {o['f1']:.3f} | |")
    return lines


def _tiled_lines(r: dict) -> list[str]:
    if "tiled" not in r:
        return []
    lines = ["", "### Tiled mosaics", "",
              "Mosaics of held-out fields, a few fields of each with decisive objects; pure-noise "
              "mosaics of the same size. Object tiles: tiles whose area holds a decisive pixel. "
              "Under the most attended patch: objects that the model's attention puts first in "
              "one of their tiles (a step-down reaches an object only after every patch its "
              "tile attends to more).", "",
              "| preset | mosaics | tiles each | objects found (recall, 95 % CI) | under the most "
              "attended patch | object tiles with a significant patch | object-free tiles with "
              "a significant patch | noise mosaics with any significant | tile p KS (noise) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for preset in PRESETS:
        p, n = r["tiled"][f"planted|{preset}"], r["tiled"][f"noise|{preset}"]
        obj = f"{p['object_tiles_sig']}/{p['object_tiles']}" if "object_tiles" in p else "–"
        empty = f"{p['empty_tiles_sig']}/{p['empty_tiles']}" if "empty_tiles" in p else "–"
        found = f"{p['found']}/{p['objects']}"
        if "recall_ci" in p:
            found += f" ({_pct(p['recall'])}, {_pct(p['recall_ci'][0])}–{_pct(p['recall_ci'][1])})"
        top = "–" if p.get("under_top_patch") is None else f"{p['under_top_patch']}/{p['objects']}"
        lines.append(f"| {preset} | {p.get('mosaics', 1)} | {p['n_tiles']} | {found} | {top} | "
                     f"{obj} | {empty} | {_pct(n['any_sig'])} of {n['n']} | {_f(n['tile_p_ks'])} |")
    return lines


def _simulation_lines(r: dict) -> list[str]:
    if "simulation" not in r:
        return []
    lines = ["", "### The paper's noise-ROI simulation", "",
              "D = Σ mean percentile of the regularized map in a pasted square of noise / the same "
              "for raw attention (< 1: regularization removes attention from the noise).", "",
              "| preset | fields | D ± error |", "|---|---:|---:|"]
    for preset in PRESETS:
        s = r["simulation"][preset]
        lines.append(f"| {preset} | {s['n']} | {s['d']:.3f} ± {s['d_err']:.3f} |")
    return lines


def _runtime_lines(r: dict) -> list[str]:
    rt = r.get("runtime_median_s", {})
    timed = r.get("runtime_sections")
    on = f" on the images of section(s) {', '.join(timed)}" if timed else ""
    return ["", f"Median run time per image{on} (s): " + ", ".join(
        f"{p} {rt[p]:.2f}" for p in PRESETS if p in rt) + ".", ""]


NOTES = Path(__file__).with_name("validation_notes.md")


def _summary_row(r: dict, preset: str) -> str:
    n = r["noise"][f"all noise inputs|{preset}"]
    c, x = r["crops"][preset], r["localization"][preset]
    lo, hi = x["delta_ci"]
    if "tiled" in r:
        p, tn = r["tiled"][f"planted|{preset}"], r["tiled"][f"noise|{preset}"]
        found, noise_mosaics = f"{p['found']}/{p['objects']}", _pct(tn["any_sig"])
    else:
        found = noise_mosaics = "not run (no tiled section)"
    d = f"{r['simulation'][preset]['d']:.3f}" if "simulation" in r else "not run"
    return (f"| {r['article']} | {preset} | {_pct(n['any_sig'])} | {_pct(c['mean_sig'])} / "
            f"{_pct(c['worst_sig'])} | {_pct(c['evidence_half'])} | {x['f1']:.3f} "
            f"({r['localization']['otsu']['f1']:.3f}) | {x['delta_f1']:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
            f"{found} | {noise_mosaics} | {d} |")


def load_results(results_dir: Path) -> tuple[list[dict], list[dict]]:
    """The per-preset article runs (``validation_<article>.json``) and the maps runs
    (``validation_maps_*.json``, the articles × maps table)."""
    articles, maps = [], []
    for path in sorted(results_dir.glob("validation_*.json")):
        data = json.loads(path.read_text())
        (maps if "articles" in data else articles).append(data)
    return articles, maps


def write_report(results_dir: Path, out: Path, explanations: str | None = None,
                 maps_notes: str | None = None) -> str:
    """Combine ``validation_*.json`` of every article into ``out``.

    ``explanations`` (default: ``validation_notes.md`` beside this file) follows the summary:
    what is not met and why, written after reading the numbers. ``maps_notes`` (default:
    ``validation_maps_notes.md``) does the same for the articles × maps table.
    """
    from validation_maps_report import maps_section

    if explanations is None:
        explanations = NOTES.read_text() if NOTES.is_file() else ""
    runs, maps = load_results(results_dir)
    if not runs and not maps:
        raise SystemExit(f"no results in {results_dir}; run validate.py --article NAME first")
    names = ", ".join(f"`--article {r['article']}`" for r in runs)
    lines = ["# Validation on the test articles", "",
             "Generated by `python benchmarks/validate.py --report` from the per-article runs "
             f"({names}) and the per-map runs of `benchmarks/validate_maps.py`. Every image "
             "comes from generator streams "
             "that neither the models' training nor any tuning of the statistics used. Each "
             "preset runs with its own defaults: `stepdown` (the default: share step-down, "
             "ForwardStop at α = 0.1, half-patch block nulls), `directional` (one-sided p⁺, "
             "q⁺ ≤ 0.1, Gaussian nulls) and `paper` (the published two-sided procedure).", ""]
    for m in maps:
        lines += maps_section(m, maps_notes)
    if runs:
        lines += ["## The three presets on the attention map: summary", "",
                  "| article | preset | noise inputs with any significant | empty crops: "
                  "significant (mean / worst) | empty crops: evidence ≥ 0.5 | F1 (Otsu) | "
                  "ΔF1 [95 % CI] | mosaic objects found | noise mosaics with any significant | "
                  "D |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [_summary_row(r, preset) for r in runs for preset in PRESETS]
        lines.append("")
    if explanations and runs:
        lines += [explanations.strip(), ""]
    for r in runs:
        lines += _article_section(r)
    text = "\n".join(lines)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text
