"""The map checks of one image: the last block run from its kept input, or two whole passes.

    PYTHONPATH=src python benchmarks/bench_map_checks.py --models vit_small_patch16_224,vit_base_patch16_224
    PYTHONPATH=src python benchmarks/bench_map_checks.py --models DIR --device cuda   # a folder: a saved model

Every untiled run makes two checks of its map after the null images (the sanity check with the
last block re-drawn, and the attention-sink check). Both need only what entered the last block,
which the run's observed pass keeps (``entering``); without it each check runs the image through
the whole model at batch 1. This times :func:`~napari_attnreg.core.run.maps.map_checks` both
ways on the same image, interleaved, and reports the median of ``--repeats`` (after one
warm-up each) and whether the two gave the same numbers. On a GPU each timing ends with a
synchronisation, so it is the device's time for the checks' work. Timm names are
random-initialised (the arithmetic is the trained model's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from napari_attnreg.core.models.attention import cls_attention_entering
from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.models.scorers import make_scorer
from napari_attnreg.core.run.maps import map_checks


def time_checks(name: str, device: str, repeats: int) -> dict:
    """Median seconds of the checks with and without the kept input, and their agreement."""
    backbone = load_backbone(name) if Path(name).exists() else load_backbone(name, pretrained=False)
    backbone = backbone.on(device)
    x = torch.randn(1, backbone.in_chans, *backbone.input_size[1:],
                    generator=torch.Generator().manual_seed(0)).to(device)
    scorer = make_scorer("attention")
    with torch.inference_mode():
        heads, entering = cls_attention_entering(backbone, x, layer=-1, head="all")
    given = {"seed": 0, "original": scorer.from_heads(heads.flatten(2))[0],
             "share": heads[0].mean(0)}
    ways = {"whole_passes": None, "kept_input": entering}
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    numbers: dict[str, tuple] = {}
    for rep in range(repeats + 1):
        for way, kept in ways.items():
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            _, found, sinks = map_checks(scorer, backbone, x[0], entering=kept, **given)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if rep:  # the first round pays for the block's draw and first-use costs
                seconds[way].append(time.perf_counter() - t0)
            numbers[way] = (found["map_sanity_rho"], sinks.tokens, sinks.norm_ratio)
    same = (numbers["whole_passes"][:2] == numbers["kept_input"][:2]
            and np.array_equal(numbers["whole_passes"][2], numbers["kept_input"][2]))
    median = {way: statistics.median(v) for way, v in seconds.items()}
    return {"model": name, "device": device, "threads": torch.get_num_threads(),
            "median_s": median, "all_s": seconds, "same_numbers": bool(same),
            "saved_fraction": 1 - median["kept_input"] / median["whole_passes"]}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="vit_small_patch16_224,vit_base_patch16_224",
                    help="comma-separated timm names or model folders")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    rows = [time_checks(name, args.device, args.repeats) for name in args.models.split(",")]
    for row in rows:
        med = row["median_s"]
        print(f"{row['model']} on {row['device']}: whole passes {1e3 * med['whole_passes']:.1f} ms, "
              f"kept input {1e3 * med['kept_input']:.1f} ms ({100 * row['saved_fraction']:.0f} % "
              f"saved), same numbers: {row['same_numbers']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
