"""Is the step-down's first step exact on white noise at the model's size?

    python benchmarks/noise_ranks.py --article demo --colour grey --n 1500 --n-boot 19
    python benchmarks/noise_ranks.py --article demo --colour grey --n 1000 --n-boot 100

For white noise at the model's input size the half-patch block null is exchangeable with the
image: a random order of the blocks of independent pixels has the pixels' own distribution.
Then the rank of the image's first-step statistic among its B null maps is uniform on
0..B, and the map-level p is an exact Monte-Carlo p-value. This script runs the engine on
``--n`` such images (grey or RGB, each with a held-out field's mean and sd, as the validation's
noise section makes them) and reports the ranks' chi-square test of uniformity, the share
with a map-level p at or below 1 − e^(−0.1) (where ForwardStop at α = 0.1 keeps the first
step), and the share with any significant patch under the default rule. Use a generator
stream no other run used (``--stream``): the validation's noise inputs come from 22.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate import run
from validation_articles import ARTICLES, noise_image
from validation_common import progress

from napari_attnreg.core.models.backbones import load_backbone


def first_step_ranks(article: str, colour: str, n: int, n_boot: int, stream: int,
                     device: str = "cpu") -> dict:
    """Ranks (nulls at or above the image) of the first step, and the rule's discoveries."""
    art = ARTICLES[article]
    bb = load_backbone(art.model)
    args = argparse.Namespace(n_boot=n_boot, device=device)
    side = bb.input_size[1]
    ranks, any_sig = [], []
    for i in range(n):
        reference = art.field(stream, i, False).image
        image = noise_image(reference, np.random.default_rng([stream, i]), side, colour == "rgb")
        r = run(bb, image, "stepdown", args, seed=i)
        ranks.append(int(round(r.p_map * (n_boot + 1))) - 1)
        any_sig.append(bool(r.significant().any()))
        if (i + 1) % 250 == 0:
            progress(f"{i + 1}/{n}")
    counts = np.bincount(ranks, minlength=n_boot + 1)
    # ForwardStop keeps step 1 alone iff -log(1 - p_1) <= alpha, i.e. p_1 <= 1 - e^-alpha
    first = np.asarray(ranks) + 1 <= (1 - math.exp(-0.1)) * (n_boot + 1)
    level = int(np.floor((1 - math.exp(-0.1)) * (n_boot + 1))) / (n_boot + 1)
    return {"article": article, "colour": colour, "n": n, "n_boot": n_boot, "stream": stream,
            "rank_counts": counts.tolist(), "chi2_p": float(stats.chisquare(counts).pvalue),
            "first_step_rate": float(first.mean()), "first_step_expected": level,
            "any_significant_rate": float(np.mean(any_sig))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--article", choices=tuple(ARTICLES), default="demo")
    ap.add_argument("--colour", choices=("grey", "rgb"), default="grey")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--n-boot", type=int, default=19)
    ap.add_argument("--stream", type=int, default=81)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    out = first_step_ranks(args.article, args.colour, args.n, args.n_boot, args.stream,
                           args.device)
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
