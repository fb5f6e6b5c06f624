"""The step-down statistics of a tiled field alone, on synthetic tile maps (no model).

    python benchmarks/bench_tiled_statistics.py --size 32768 --n-boot 2 --device cpu
    python benchmarks/bench_tiled_statistics.py --size 32768 --n-boot 200 --device cuda

A field of ``size``² in the demo model's 128² tiles of 8-pixel patches (a quarter overlap,
every tile run, image-level null): ``size = 32768`` is 116,281 tiles and 30 M tile tokens.
The tile maps and the null are log-normal noise. Prints the median over ``--repeats`` of
``stepdown_statistics`` in full, of its ``step_down`` (counting pass, tail, adjusted p) and
of the token maps built from the steps (host work: the steps put back in token order, the
best adjusted p of each image token). With a small ``--n-boot`` the host work dominates;
it is the same on a GPU, where the counting pass is fast.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from napari_attnreg.core.run.tiling import make_layout, run_tiles
from napari_attnreg.core.stats import stepdown_maps


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16384)
    parser.add_argument("--n-boot", type=int, default=20)
    parser.add_argument("--tail", default="none", choices=("none", "gpd"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    layout = make_layout((args.size, args.size), tile=(128, 128), patch=(8, 8), overlap=32)
    owned = run_tiles(layout, None)
    n_fam, n_tok = int(owned.order.size), 256
    rng = np.random.default_rng(0)
    families = torch.from_numpy(np.exp(rng.normal(0, 0.5, (n_fam, n_tok))).astype(np.float32))
    null = torch.from_numpy(np.exp(rng.normal(0, 0.5, (args.n_boot, n_tok))).astype(np.float32))
    observed = torch.from_numpy(np.exp(rng.normal(0, 0.5, owned.n_image)).astype(np.float32))
    families, null = families.to(device), null.to(device)

    spent: dict[str, list[float]] = {"step_down": [], "token_maps": []}
    for name in spent:  # time the two parts inside the full call
        real = getattr(stepdown_maps, "step_down" if name == "step_down" else "_token_maps")

        def timed(*a, _real=real, _name=name, **k):
            t0 = time.perf_counter()
            out = _real(*a, **k)
            spent[_name].append(time.perf_counter() - t0)
            return out

        setattr(stepdown_maps, "step_down" if name == "step_down" else "_token_maps", timed)
    totals = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        stepdown_maps.stepdown_statistics(observed, null, tail=args.tail, families=families,
                                          owner=(owned.family, owned.local),
                                          family_tokens=owned.family_tokens)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        totals.append(time.perf_counter() - t0)
    out = {"size": args.size, "tiles": n_fam, "tile_tokens": n_fam * n_tok,
           "n_boot": args.n_boot, "tail": args.tail, "device": str(device),
           "threads": torch.get_num_threads(), "statistics_s": statistics.median(totals),
           "step_down_s": statistics.median(spent["step_down"]),
           "token_maps_s": statistics.median(spent["token_maps"])}
    print(f"{args.size}² field, {n_fam} tiles ({n_fam * n_tok / 1e6:.1f} M tile tokens), "
          f"B={args.n_boot}, tail={args.tail}, {device}: statistics {out['statistics_s']:.2f} s "
          f"(step_down {out['step_down_s']:.2f} s, token maps {out['token_maps_s']:.2f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
