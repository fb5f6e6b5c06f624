"""Tissue tiles the automatic mask keeps on ``validate_slides.py``'s slides (no model run).

    PYTHONPATH=src python benchmarks/bench_mask_tiles.py --models demo,phantom,dinov2 --n 6

Each slide is the Aperio SVS that ``validate_slides.py`` runs (object-free tissue of a test
article under 0 %, 35 % and 70 % glass), opened at level 0 and prepared for a tiled run with
``tissue_mask="auto"``: the tiles the mask keeps are compared with the truth the slide was
made from (a tile is tissue when at least 10 % of it is, glass when at most 1 %). Prints,
per slide and glass share: tiles kept, tissue tiles left out, glass tiles run, the mask's
record; a refused slide (no tissue found) says so.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_slides as vs
from validation_articles import ARTICLES

from napari_attnreg.core.run.config import RunConfig
from napari_attnreg.core.run.tiled_engine import prepare_tiled
from napari_attnreg.io.slides import open_slide

GLASS = (0.0, 0.35, 0.7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,phantom,dinov2")
    parser.add_argument("--n", type=int, default=6, help="slides per article")
    args = parser.parse_args()
    totals: dict[tuple[str, float], np.ndarray] = {}
    for name in args.models.split(","):
        article = ARTICLES[name]
        backbone = article.backbone()
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.n):
                t0 = time.time()
                for glass, slide in vs.make_slides(article, i, vs.SIDE[name], GLASS).items():
                    path = Path(tmp) / "slide.svs"
                    vs.write_svs(path, slide.image)
                    count = totals.setdefault((name, glass), np.zeros(5, int))
                    try:
                        tiled = prepare_tiled(open_slide(path, level=0), backbone,
                                              RunConfig(tiled=True, n_boot=10,
                                                        tissue_mask="auto"))
                    except ValueError as err:
                        count[4] += 1
                        print(f"{name} {i} glass {glass:.0%}: refused ({str(err)[:80]})")
                        continue
                    (th, tw), (ys, xs) = tiled.layout.tile, tiled.layout.starts
                    share = np.array([slide.tissue[y:y + th, x:x + tw].mean()
                                      for y in ys for x in xs])
                    kept, truth = tiled.tissue.tiles, share >= 0.10
                    row = [int(kept.sum()), int(truth.sum()), int((truth & ~kept).sum()),
                           int((kept & (share <= 0.01)).sum())]
                    count[:4] += row
                    print(f"{name} {i} glass {glass:.0%}: kept {row[0]} of {row[1]} tissue "
                          f"tiles; left out {row[2]}, glass run {row[3]}; "
                          f"{tiled.tissue.source}", flush=True)
                print(f"  ({time.time() - t0:.1f} s)", flush=True)
    print("\n| article | glass | tiles kept / tissue tiles | tissue left out | glass run | "
          "slides refused |\n|---|---:|---:|---:|---:|---:|")
    for (name, glass), (kept, truth, out, run, refused) in totals.items():
        print(f"| {name} | {glass:.0%} | {kept}/{truth} | {out} | {run} | {refused} |")


if __name__ == "__main__":
    main()
