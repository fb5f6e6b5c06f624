"""Preparing an in-memory field for a tiled run: on the device against the host's way.

    python benchmarks/bench_tiled_prepare.py --size 8192 --device cpu
    python benchmarks/bench_tiled_prepare.py --size 8192 --device cuda --json OUT/prepare.json

For a uint16 grey field (``bench_tiled.field``) and a uint8 RGB field of ``size``², in one
process, the median of ``--repeats`` runs of:

* ``device``: :func:`~napari_attnreg.core.run.tiled_engine.prepare_tiled` on ``--device``
  (raw pixels uploaded in their own dtype, percentiles and scaling there), synchronised;
* ``host``: the previous way, :func:`scale_large` in NumPy, then the float32 copy
  uploaded, channels first (what ``prepare_tiled`` did before round 7).

Both give the same float32 values bit for bit (checked here on every run); the ratio is
host / device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_tiled import field

from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.config import RunConfig
from napari_attnreg.core.run.device_scaling import scale_large
from napari_attnreg.core.run.tiled_engine import prepare_tiled


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _host_way(arr: np.ndarray, device: torch.device) -> torch.Tensor:
    chw = torch.from_numpy(scale_large(arr))
    chw = chw[None] if chw.ndim == 2 else chw.permute(2, 0, 1)
    return chw.contiguous().to(device)


def _timed(fn, device: torch.device, repeats: int) -> tuple[float, torch.Tensor]:
    times, out = [], None
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    backbone = load_backbone("vit_small_patch16_224", pretrained=False)
    config = RunConfig(tiled=True, device=str(device), tile_scale=1)
    grey = field(args.size)
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8)
    prepare_tiled(grey[:512, :512], backbone, config)  # warm-up (allocator, kernels)
    rows = []
    for name, arr in (("uint16 grey", grey), ("uint8 RGB", rgb)):
        device_s, tiled = _timed(lambda a=arr: prepare_tiled(a, backbone, config), device,
                                 args.repeats)
        host_s, host = _timed(lambda a=arr: _host_way(a, device), device, args.repeats)
        same = bool(torch.equal(tiled.source, host))
        rows.append({"image": name, "shape": list(arr.shape), "dtype": str(arr.dtype),
                     "device_s": device_s, "host_s": host_s, "host_over_device": host_s / device_s,
                     "bit_identical": same})
        print(f"{name:12s} {args.size}²  on the device {device_s:.3f} s, the host's way "
              f"{host_s:.3f} s  ({host_s / device_s:.1f}x), bit-identical: {same}")
        del tiled, host
    out = {"device": str(device), "threads": torch.get_num_threads(),
           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
           "size": args.size, "repeats": args.repeats, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
