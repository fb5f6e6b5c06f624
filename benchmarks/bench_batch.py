"""A batch on a local Dask cluster: 2 worker processes against 1, measured in one run.

    python benchmarks/bench_batch.py --images 8 --n-boot 100

Writes ``--images`` synthetic cell images (``napari_attnreg.testing.synthetic``) to a temporary
folder and runs ``run_batch`` with the demo model on a LocalCluster of 1 and then 2 worker
processes (one torch thread each), cluster start-up included. Prints both wall times and
the speed-up; it cannot exceed the number of free cores.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import tifffile

from napari_attnreg.batch.items import collect_inputs
from napari_attnreg.batch.run import run_batch
from napari_attnreg.testing.synthetic import make_cell_image


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--n-boot", type=int, default=100)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    opts = {"n_boot": args.n_boot, "device": "cpu", "seed": 0}
    out: dict = {"images": args.images, "size": args.size, "n_boot": args.n_boot,
                 "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "in"
        folder.mkdir()
        for i in range(args.images):
            tifffile.imwrite(folder / f"cells_{i:02d}.tif",
                             make_cell_image([5, i], size=args.size).image)
        items = collect_inputs([folder])
        for workers in (1, 2):
            t0 = time.perf_counter()
            report = run_batch(items, Path(tmp) / f"out{workers}", "demo", None, opts,
                               quiet=True, workers=workers)
            out[f"workers_{workers}_s"] = time.perf_counter() - t0
            assert not report.failed, report.failed
    out["speedup"] = out["workers_1_s"] / out["workers_2_s"]
    print(f"demo model, {args.images} images of {args.size}x{args.size}, B={args.n_boot}, "
          f"{out['cpus']} CPUs on this machine")
    print(f"1 worker   {out['workers_1_s']:7.2f} s")
    print(f"2 workers  {out['workers_2_s']:7.2f} s")
    print(f"speed-up 2 workers vs 1 = {out['speedup']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
