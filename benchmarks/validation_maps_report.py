"""The articles × maps table of docs/validation.md, from ``validate_maps.py``'s results file."""

from __future__ import annotations

import math
from pathlib import Path

ARTICLES = ("demo", "phantom", "dinov2")
#: the rows every article's table has, in order (as ``validate_maps.ROWS``)
ROWS = (("attention", "stepdown"), ("heads", "stepdown"), ("rollout", "stepdown"),
        ("cdam", "stepdown"), ("gradcam", "stepdown"), ("attention", "directional"),
        ("attention", "paper"), ("cdam", "directional"), ("cdam", "paper"))
CASES = ("grey, native", "grey, resized", "RGB, native", "RGB, resized")
ALPHA = 0.1
#: fewer images than this give no bootstrap interval worth a verdict
MIN_BOOTSTRAP = 5
NOTES = Path(__file__).with_name("validation_maps_notes.md")


def design_rate(n_boot: int, alpha: float = ALPHA) -> float:
    """Share of noise inputs whose first ForwardStop step is kept when the map-level p is
    uniform on the counting grid ``1/(B+1)``: ``⌊(1 − e^(−α))(B+1)⌋/(B+1)``."""
    return math.floor(-math.expm1(-alpha) * (n_boot + 1)) / (n_boot + 1)


def _pct(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{100 * x:.1f} %" if 0 < x < 0.1 else f"{100 * x:.0f} %"


def _rate(b: dict | None) -> str:
    """``k/n = x % [lo–hi]`` with its exact binomial 95 % interval."""
    if not b or not b.get("n"):
        return "–"
    lo, hi = b["ci"]
    return f"{b['k']}/{b['n']} = {_pct(b['rate'])} [{_pct(lo)}–{_pct(hi)}]"


def _p(x: float | None) -> str:
    if x is None:
        return "no map-level p"
    return f"{x:.1e}" if x < 0.001 else f"{x:.3f}"


def _ci(value: float, ci: list[float], signed: bool = False) -> str:
    fmt = "{:+.2f}" if signed else "{:.2f}"
    return f"{fmt.format(value)} [{fmt.format(ci[0])}, {fmt.format(ci[1])}]"


def aims(row: dict) -> tuple[list[str], list[str]]:
    """The METHOD §17 aims a default-preset row misses, and those its sizes cannot settle.

    A rate misses its aim when its whole 95 % interval lies above it, and is undecided when
    the interval holds the aim; ΔF1 likewise against 0. The crop shares are judged as
    measured (they have no interval here). A section without images settles nothing.
    """
    missed, open_ = [], []
    for check in (_noise_aims, _crop_aims, _localization_aims):
        m, o = check(row)
        missed += m
        open_ += o
    return missed, open_


def _noise_aims(row: dict) -> tuple[list[str], list[str]]:
    noise = row["noise"]["all"]
    if not noise["any_sig"]["n"]:
        return [], ["noise not run"]
    missed, open_ = [], []
    lo, hi = noise["any_sig"]["ci"]
    if lo > 0.10:
        missed.append(f"noise {_pct(noise['any_sig']['rate'])} > 10 %")
    elif hi > 0.10:
        open_.append(f"noise ≤ 10 % (interval up to {_pct(hi)})")
    if noise["ks_map_p"] is not None and noise["ks_map_p"] <= 0.05:
        missed.append("p_map not uniform")
    return missed, open_


def _crop_aims(row: dict) -> tuple[list[str], list[str]]:
    crops = row["crops"]
    if not crops["n"]:
        return [], ["crops not run"]
    missed = []
    if crops["mean_sig"] > 0.01:
        missed.append(f"crops mean {_pct(crops['mean_sig'])} > 1 %")
    if crops["worst_sig"] > 0.05:
        missed.append(f"worst crop {_pct(crops['worst_sig'])} > 5 %")
    return missed, []


def _localization_aims(row: dict) -> tuple[list[str], list[str]]:
    loc = row["localization"]
    if not loc["n"]:
        return [], ["localization not run"]
    if loc["n"] < MIN_BOOTSTRAP:
        return [], [f"F1 against Otsu ({loc['n']} images: too few for an interval)"]
    lo, hi = loc["delta_ci"]
    if hi < 0:
        return ["F1 below Otsu"], []
    return ([], ["F1 above Otsu (ΔF1 interval holds 0)"]) if lo <= 0 else ([], [])


def _verdict(row: dict, preset: str) -> str:
    if preset != "stepdown":
        return "comparison (the aims are for the default)"
    missed, open_ = aims(row)
    parts = ([f"**not met:** {', '.join(missed)}"] if missed else []) + (
        [f"undecided at this size: {', '.join(open_)}"] if open_ else [])
    return "; ".join(parts) or "all met"


def _row_cells(row: dict, preset: str) -> list[str]:
    noise, crops, loc = row["noise"]["all"], row["crops"], row["localization"]
    cells = [_rate(noise["any_sig"]), _p(noise["ks_map_p"]) if noise["any_sig"]["n"] else "–"]
    if crops["n"]:
        cells += [f"{_pct(crops['mean_sig'])} / {_pct(crops['worst_sig'])} of {crops['n']}",
                  _pct(crops["evidence_half"])]
    else:
        cells += ["not run (time)", "–"]
    if loc["n"]:
        cells += [_ci(loc["f1"], loc["f1_ci"]), _ci(loc["f1_otsu"], loc["f1_otsu_ci"]),
                  _ci(loc["delta_f1"], loc["delta_ci"], True), _rate(loc["pointing"]),
                  _rate(loc["object_recall"])]
    else:
        cells += ["not run (time)"] + ["–"] * 4
    return cells + [_verdict(row, preset)]


def _sizes(name: str, a: dict) -> str:
    planned = a["planned"]
    return (f"`{name}`: B = {a['n_boot']} (a uniform map-level p keeps the first step in "
            f"{_pct(design_rate(a['n_boot']))} of noise inputs at this B); planned at most "
            f"{planned['noise']} noise inputs, {planned['crops']} empty crops and "
            f"{planned['localization']} images with objects per row, run in passes that give "
            "every row a few images of each kind until the time was spent (the counts in the "
            f"table are what each row got); class maps: {a['class_target']}; source "
            f"{a['source']}; `python benchmarks/validate_maps.py {' '.join(a['argv'])}`.")


def main_table(data: dict) -> list[str]:
    head = ["article", "map", "preset", "noise: any significant (k/n, 95 % CI)",
            "noise: KS p of p_map", "empty crops: significant mean / worst of n",
            "empty crops: evidence ≥ 0.5", "F1 significant [95 % CI]",
            "F1 same raw map > Otsu [95 % CI]", "ΔF1 [95 % CI]",
            "pointing game (k/n, 95 % CI)", "object recall (k/n, 95 % CI)", "METHOD §17 aims"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * 9 + "---|"]
    for name in ARTICLES:
        a = data["articles"].get(name)
        for map_name, preset in ROWS:
            row = (a or {}).get("rows", {}).get(f"{map_name}|{preset}")
            if row is None or "not_run" in row:
                why = row["not_run"] if row else "the run's time limit came first"
                lines.append(f"| {name} | {map_name} | {preset} | not run ({why}) |"
                             + " |" * 9)
                continue
            cells = _row_cells(row, preset)
            lines.append(f"| {name} | {map_name} | {preset} | " + " | ".join(cells) + " |")
    return lines


def case_table(data: dict) -> list[str]:
    lines = ["| article | map | preset | " + " | ".join(CASES) + " |",
             "|---|---|---|" + "---:|" * len(CASES)]
    for name in ARTICLES:
        rows = data["articles"].get(name, {}).get("rows", {})
        for map_name, preset in ROWS:
            row = rows.get(f"{map_name}|{preset}")
            if row is None or "not_run" in row:
                continue
            cells = [f"{row['noise'][c]['any_sig']['k']}/{row['noise'][c]['any_sig']['n']} "
                     f"(KS p {_p(row['noise'][c]['ks_map_p'])})" if row["noise"][c]["ks_map_p"]
                     is not None else
                     f"{row['noise'][c]['any_sig']['k']}/{row['noise'][c]['any_sig']['n']}"
                     for c in CASES]
            lines.append(f"| {name} | {map_name} | {preset} | " + " | ".join(cells) + " |")
    return lines


def maps_section(data: dict, notes: str | None = None) -> list[str]:
    """The articles × maps section: how it was measured, the table, per-case noise, notes."""
    if notes is None:
        notes = NOTES.read_text() if NOTES.is_file() else ""
    sizes = [f"- {_sizes(name, data['articles'][name])}" for name in ARTICLES
             if name in data["articles"]]
    lines = ["## Every map on the three articles (2-core CPU, reduced sizes)", "",
             "Made by `python benchmarks/validate_maps.py` on a 2-core CPU shared with other "
             "work, so every size is small and every rate carries its exact binomial 95 % "
             "interval. Rows: each map under the default preset (`stepdown`), and `attention` "
             "and `cdam` under `directional` and `paper`. Noise inputs: white noise as images, "
             "grey and RGB, at the model's input size and 2.5 times larger (pooled here, per "
             "case below). Empty crops: crops of object-free fields (dinov2: hand-picked real "
             "regions). Images with objects: the planted fields (dinov2: composites, a real "
             "object pasted into an object-free real region). F1: the significant tokens "
             "against the tokens at least a quarter covered by an object, set against the same "
             "raw map above its Otsu threshold (ΔF1: the paired difference; 95 % percentile "
             "bootstrap intervals over images). Pointing game: the most significant token lies "
             "on the object (an image with nothing significant misses). Object recall: objects "
             "with a significant token on them. Sizes:", "", *sizes, "",
             *main_table(data), "",
             "Noise inputs by case (inputs with any significant token; KS p of the map-level "
             "p where the preset has one):", "", *case_table(data), ""]
    if notes:
        lines += [notes.strip(), ""]
    return lines
