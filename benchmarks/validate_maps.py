"""Every map on the three test articles: the articles × maps table of docs/validation.md.

    python benchmarks/validate_maps.py --article demo --article phantom   # CPU-sized run
    python benchmarks/validate_maps.py --article dinov2 --n-noise 4 --n-boot 50
    python benchmarks/validate.py --report       # renders benchmarks/results/validation_maps_*.json

Rows: each map under the default preset (``stepdown``), and ``attention`` and ``cdam`` under
``paper`` and ``directional``. For each row, through the engine as a user's image goes:

1. noise inputs given as images (grey/RGB × the model's input size/2.5 times larger): the
   share with any significant token (exact binomial 95 % interval) and the KS p of the
   map-level p against uniform (counting p randomized within its 1/(B+1) step);
2. empty crops: mean and worst share of tokens significant, share with evidence ≥ 0.5;
3. images with objects (the planted fields; on dinov2 the composites): F1 of the
   significant set against the truth, set against the same raw map > Otsu (paired
   difference, 95 % bootstrap CI), the pointing game and the object recall.

Class maps (``cdam``, ``gradcam``) score ``target="predicted"`` on a model with a
classification head (demo, phantom); on dinov2, which has none, a concept built with
:func:`napari_attnreg.concept_from` from example crops of the object kind: for a composite,
crops of that kind's other objects in their source image (the other coins; the cell and the
cat's head in the images they were cut from), never the composite itself; noise inputs and
empty crops cycle through the three kinds' concepts.

The run makes passes over the rows, each pass adding a few images to every section of every
row, and writes every row (its summary and its per-image records) after each pass (rows of
other articles in the file are kept): when ``--budget-s`` is spent, every row has the images
it got, and a row that got none is recorded as not run with the reason.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from scipy import ndimage, stats
from skimage.filters import threshold_otsu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate import _ks, bootstrap_ci
from validation_articles import ARTICLES, HELD_OUT, noise_image
from validation_common import most_significant, overlap, progress, source_version

from napari_attnreg.core.run.engine import RunConfig, drain, run_engine
from napari_attnreg.core.stats.paper import StatisticsWarning

#: (map, preset) rows of the table, in the order they run (and are dropped when time runs out)
ROWS = (("attention", "stepdown"), ("cdam", "stepdown"), ("gradcam", "stepdown"),
        ("heads", "stepdown"), ("rollout", "stepdown"), ("attention", "directional"),
        ("attention", "paper"), ("cdam", "directional"), ("cdam", "paper"))
CLASS_MAPS = ("cdam", "gradcam")
CASES = {"grey, native": (False, 1.0), "grey, resized": (False, 2.5),
         "RGB, native": (True, 1.0), "RGB, resized": (True, 2.5)}
RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_JSON = RESULTS / "validation_maps_cpu.json"


def binomial(k: int, n: int) -> dict:
    """A rate ``k/n`` with its exact (Clopper–Pearson) 95 % interval."""
    if n == 0:
        return {"k": 0, "n": 0, "rate": None, "ci": None}
    ci = stats.binomtest(k, n).proportion_ci(0.95, "exact")
    return {"k": int(k), "n": int(n), "rate": k / n, "ci": [float(ci.low), float(ci.high)]}


# ---------------------------------------------------------------- targets


def _object_concepts(bb) -> dict[str, np.ndarray]:
    """dinov2: one concept per pasted object, from crops of other objects of its kind."""
    from validation_real import objects, sources

    from napari_attnreg import concept_from

    coins = objects()[0]
    concepts = {}
    for k, (name, _pixels, _mask) in enumerate(coins):
        concepts[name] = concept_from([pixels for j, (_n, pixels, _m) in enumerate(coins)
                                       if j != k], bb)
    # one cell and one cat's head: a crop around each in the image it was cut from
    for name, (image, mask) in sources().items():
        concepts[name] = concept_from(image, bb, mask=mask)
    concepts["coins (all)"] = concept_from([pixels for _n, pixels, _m in coins], bb)
    return concepts


class Targets:
    """What a class map scores for each image of an article (``{}`` for other maps)."""

    def __init__(self, art, bb):
        from napari_attnreg.core.models.scorers.target import num_classes

        self.art = art
        self.has_head = num_classes(bb) > 0
        self.concepts = None if self.has_head else _object_concepts(bb)

    def describe(self) -> str:
        if self.has_head:
            return "target='predicted' (the model's classification head)"
        return ("concepts from example crops of the object kind (other coins; the cell and the "
                "cat's head in their source images), never the evaluated image")

    def null_image(self, map_name: str, i: int) -> dict:
        """Noise inputs and empty crops: the three kinds' concepts in turn."""
        if map_name not in CLASS_MAPS:
            return {}
        if self.has_head:
            return {"target": "predicted"}
        names = ("coins (all)", "cell", "cat's head")
        return {"target": self.concepts[names[i % 3]]}

    def object_image(self, map_name: str, i: int) -> dict:
        """An image with objects: the concept of the object pasted into it."""
        if map_name not in CLASS_MAPS:
            return {}
        if self.has_head:
            return {"target": "predicted"}
        from validation_real import object_name

        return {"target": self.concepts[object_name(HELD_OUT["fields"], i)]}


# ---------------------------------------------------------------- one row


def run(bb, image, map_name: str, preset: str, n_boot: int, seed: int, options: dict):
    cfg = RunConfig(preset=preset, map=map_name, n_boot=n_boot, seed=seed, device="cpu",
                    **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StatisticsWarning)
        warnings.simplefilter("ignore", UserWarning)
        return drain(run_engine(image, bb, cfg))


def noise_one(art, bb, row: tuple[str, str], targets: Targets, args, k: int) -> list:
    """Noise input ``k``: case ``k % 4``, input ``k // 4`` of that case."""
    map_name, preset = row
    c, i = k % len(CASES), k // len(CASES)
    rgb, scale = list(CASES.values())[c]
    reference = art.field(HELD_OUT["noise"], i, False).image
    rng = np.random.default_rng([HELD_OUT["noise"], c, i])
    image = noise_image(reference, rng, int(scale * bb.input_size[1]), rgb)
    r = run(bb, image, map_name, preset, args.n_boot, i, targets.null_image(map_name, i))
    return [c, i, bool(r.significant().any()), r.p_map]


def crop_one(art, bb, row: tuple[str, str], targets: Targets, args, i: int) -> list:
    """Empty crop ``i``: its share of tokens significant and of evidence ≥ 0.5."""
    map_name, preset = row
    r = run(bb, art.empty_crop(i, int(0.6 * art.field_size)), map_name, preset, args.n_boot, i,
            targets.null_image(map_name, i))
    return [i, float(r.significant().mean()), float((np.asarray(r.posterior) >= 0.5).mean())]


def _objects_found(r, decisive: np.ndarray) -> tuple[int, int]:
    labels, n = ndimage.label(decisive)
    sig_px = r.to_pixels(r.significant())
    return int(sum(sig_px[labels == k].any() for k in range(1, n + 1))), n


def _raw_otsu(raw: np.ndarray) -> np.ndarray:
    """The same raw map above its Otsu threshold (nothing for a constant map)."""
    raw = np.asarray(raw, dtype=np.float64)
    if np.ptp(raw) == 0:
        return np.zeros(raw.shape, bool)
    return raw > threshold_otsu(raw)


def localization_one(art, bb, row: tuple[str, str], targets: Targets, args, i: int) -> list:
    """Image with objects ``i``: F1 of the significant set and of the raw map > Otsu, the
    pointing game (most significant token; the raw map's top token) and objects found."""
    map_name, preset = row
    f = art.field(HELD_OUT["fields"], i, True)
    r = run(bb, f.image, map_name, preset, args.n_boot, i, targets.object_image(map_name, i))
    truth = r.token_coverage(f.decisive) >= 0.25
    raw = np.asarray(r.attention)
    top = most_significant(r)
    hit = top is not None and bool(r.to_pixels(top)[f.decisive].any())
    top_hit = bool(r.to_pixels(raw == raw.max())[f.decisive].any())
    return [i, overlap(r.significant(), truth)[2], overlap(_raw_otsu(raw), truth)[2], hit,
            top_hit, *_objects_found(r, f.decisive)]


SECTIONS: dict[str, Callable] = {"noise": noise_one, "crops": crop_one,
                                 "localization": localization_one}


# ---------------------------------------------------------------- summaries


def summarize(raw: dict, n_boot: int) -> dict:
    """The table's numbers from one row's per-image records."""
    return {"noise": _noise_summary(raw["noise"], n_boot), "crops": _crop_summary(raw["crops"]),
            "localization": _localization_summary(raw["localization"])}


def _noise_summary(records: list, n_boot: int) -> dict:
    out = {}
    for c, case in enumerate([*CASES, "all"]):
        mine = [r for r in records if case == "all" or r[0] == c]
        p_maps = [r[3] for r in mine if r[3] is not None]
        out[case] = {"any_sig": binomial(sum(r[2] for r in mine), len(mine)), "map_p": p_maps,
                     "ks_map_p": _ks(p_maps, n_boot) if len(p_maps) >= 2 else None}
    return out


def _crop_summary(records: list) -> dict:
    if not records:
        return {"n": 0}
    sig = np.array([r[1] for r in records])
    return {"n": len(records), "mean_sig": float(sig.mean()), "worst_sig": float(sig.max()),
            "evidence_half": float(np.mean([r[2] for r in records])),
            "crops_with_any": binomial(int((sig > 0).sum()), len(records))}


def _localization_summary(records: list) -> dict:
    if not records:
        return {"n": 0}
    f1, f1_otsu = (np.array([r[k] for r in records], dtype=float) for k in (1, 2))
    rng = np.random.default_rng(7)
    found, total = sum(r[5] for r in records), sum(r[6] for r in records)
    return {"n": len(records), "f1": float(f1.mean()), "f1_ci": bootstrap_ci(f1, rng),
            "f1_otsu": float(f1_otsu.mean()), "f1_otsu_ci": bootstrap_ci(f1_otsu, rng),
            "delta_f1": float((f1 - f1_otsu).mean()),
            "delta_ci": bootstrap_ci(f1 - f1_otsu, rng),
            "pointing": binomial(sum(r[3] for r in records), len(records)),
            "pointing_raw_top": binomial(sum(r[4] for r in records), len(records)),
            "object_recall": binomial(found, total)}


# ---------------------------------------------------------------- results file


@contextmanager
def _locked(path: Path):
    """Read-modify-write of the results file, one process at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(Path(tempfile.gettempdir()) / f"{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text()) if path.is_file() else {"articles": {}}
        yield data
        path.write_text(json.dumps(data, indent=1, default=float) + "\n")


def record(path: Path, article: str, header: dict, key: str, value: dict) -> None:
    with _locked(path) as data:
        entry = data["articles"].setdefault(article, {})
        entry.update(header)
        entry.setdefault("rows", {})[key] = value


def row_key(row: tuple[str, str]) -> str:
    return f"{row[0]}|{row[1]}"


def _wanted(args) -> dict[str, int]:
    return {"noise": 4 * args.n_noise, "crops": args.n_crop, "localization": args.n_loc}


def _per_pass(args) -> dict[str, int]:
    return {"noise": args.noise_per_pass, "crops": args.crops_per_pass,
            "localization": args.loc_per_pass}


def validate_article(name: str, args) -> None:
    """Passes over every row, each adding a few images per section, until the sizes are
    reached or ``--budget-s`` is spent: every row gets images before any row gets many."""
    art = ARTICLES[name]
    bb = art.backbone()
    targets = Targets(art, bb)
    header = {"description": art.description, "model": bb.describe(), "n_boot": args.n_boot,
              "planned": _wanted(args), "class_target": targets.describe(),
              "source": source_version(), "argv": sys.argv[1:], "device": "cpu"}
    deadline = time.perf_counter() + args.budget_s
    rows = [row for row in ROWS if row in args.rows]
    raw = {row: {section: [] for section in SECTIONS} for row in rows}
    seconds = dict.fromkeys(rows, 0.0)
    while any(len(raw[row][s]) < n for row in rows for s, n in _wanted(args).items()):
        for row in rows:
            t0 = time.perf_counter()
            for section, fn in SECTIONS.items():
                done = raw[row][section]
                for k in range(len(done), min(len(done) + _per_pass(args)[section],
                                              _wanted(args)[section])):
                    if time.perf_counter() > deadline:
                        break
                    done.append(fn(art, bb, row, targets, args, k))
            seconds[row] += time.perf_counter() - t0
            record(args.json, name, header, row_key(row),
                   _row_value(raw[row], seconds[row], args))
            progress(f"{name}: {row_key(row)} " + ", ".join(
                f"{s} {len(v)}" for s, v in raw[row].items()))
        if time.perf_counter() > deadline:
            break


def _row_value(raw: dict, seconds: float, args) -> dict:
    if not any(raw.values()):
        return {"not_run": f"the run's CPU time ({args.budget_s / 60:.0f} min on a shared "
                           "2-core CPU) was spent on the rows before it"}
    return {**summarize(raw, args.n_boot), "raw": raw, "seconds": seconds}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--article", action="append", choices=tuple(ARTICLES), required=True)
    ap.add_argument("--n-boot", type=int, default=100)
    ap.add_argument("--n-noise", type=int, default=25, help="noise inputs per case")
    ap.add_argument("--n-crop", type=int, default=10)
    ap.add_argument("--n-loc", type=int, default=20, help="images with objects")
    ap.add_argument("--noise-per-pass", type=int, default=4,
                    help="noise inputs each row gets per pass (they cycle through the cases)")
    ap.add_argument("--crops-per-pass", type=int, default=1)
    ap.add_argument("--loc-per-pass", type=int, default=2)
    ap.add_argument("--rows", default=",".join(row_key(r) for r in ROWS),
                    help="map|preset rows to run (comma-separated)")
    ap.add_argument("--budget-s", type=float, default=3600.0,
                    help="per article: no image is started after this; each row keeps what "
                         "it has (a row with none is recorded as not run)")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = ap.parse_args(argv)
    wanted = {tuple(k.split("|")) for k in args.rows.split(",") if k}
    if wanted - set(ROWS):
        ap.error(f"--rows takes {', '.join(row_key(r) for r in ROWS)}")
    args.rows = wanted
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for name in args.article:
        validate_article(name, args)


if __name__ == "__main__":
    main()
