"""Tiled run of a large synthetic field against the forward passes it cannot avoid.

    python benchmarks/bench_tiled.py --size 8192 --n-boot 200
    python benchmarks/bench_tiled.py --size 10000 --n-boot 100 --cli   # the command line's RSS
    python benchmarks/bench_tiled.py --model vit_small_patch16_224 --size 1024 --n-boot 16 \
        --device cpu                                   # ViT-S/16 tiles (random init), aim <= 1.3
    python benchmarks/bench_tiled.py --model free-vits16 --size 8192 --n-boot 200 --device cpu
                                                       # the path's own work beside the model

Prints, measured in one run:
  * forward passes counted (a spy on the attention call) against n_tiles + B,
  * pipeline: the tiled ``run_engine`` (scaling, tiles, image-level null, statistics),
  * bare forward: timm ``forward_features`` over the same number of images at the same batch
    size, timed before and after the pipeline (their mean brackets a shared machine's
    drifting load), and the ratio pipeline / bare (aim ≤ 1.15),
  * peak RSS of this process after the pipeline (aim ≤ 3 GB), and with ``--cli`` the peak RSS
    of ``attnreg run --tiled`` on the field written as a TIFF (aim ≤ 1.5 GB).
The field is a 1024² synthetic cell image (``napari_attnreg.testing.synthetic``) repeated to size.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_pipeline import bare_forward_seconds

import napari_attnreg.core.run.tiled_engine as tiled_mod
from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.engine import (
    RunConfig,
    autocast_dtype,
    drain,
    resolve_device,
    run_engine,
)
from napari_attnreg.core.run.tiled_engine import tiled_chunk_size
from napari_attnreg.core.run.tiling import make_layout, work_shape
from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image


def field(size: int) -> np.ndarray:
    """A size² uint16 field: one 1024² synthetic cell image, repeated."""
    base = make_cell_image(7, size=1024, scale=TRAINING_SCALE, abnormal=True).image
    reps = -(-size // 1024)
    return np.ascontiguousarray(np.tile(base, (reps, reps))[:size, :size])


#: A model with ViT-S/16's tokens (224² input, 16² patches, a CLS token) whose forward costs
#: next to nothing (one block, 16 wide, one head): a run of it is the tiled path's own work
#: (scaling, tiles, normalisation, nulls, statistics), which a GPU's forward cannot hide.
FREE_VITS16 = "free-vits16"


def load_model(name: str):
    """``"demo"``, :data:`FREE_VITS16`, or a timm name (random init)."""
    if name == "demo":
        return load_backbone("demo")
    if name == FREE_VITS16:
        from timm.models.vision_transformer import VisionTransformer

        torch.manual_seed(0)
        return load_backbone(VisionTransformer(img_size=224, patch_size=16, embed_dim=16,
                                               depth=1, num_heads=1, num_classes=0))
    return load_backbone(name, pretrained=False)


def peak_rss_gb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024**2  # Linux reports KiB


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo",
                    help="'demo', a timm name, random-initialised (e.g. vit_small_patch16_224), "
                         "or 'free-vits16' (ViT-S/16's tokens, a forward that costs next to "
                         "nothing: the tiled path's own work)")
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--chunk-size", type=int, default=None)
    ap.add_argument("--tail", default=None, choices=["none", "gpd"],
                    help="tail approximation (default: the tiled default)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="time the pipeline this many times and report the median (the "
                         "first run also pays first-use costs of the field's batch shapes)")
    ap.add_argument("--cli", action="store_true", help="also measure `attnreg run --tiled`")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    device = resolve_device(args.device)
    dtype = autocast_dtype(device, args.precision)
    bb = load_model(args.model).to(device)
    image = field(args.size)
    tail = {} if args.tail is None else {"tail": args.tail}
    config = RunConfig(tiled=True, n_boot=args.n_boot, device=str(device),
                       precision=args.precision, chunk_size=args.chunk_size, **tail)
    counted = []
    real = tiled_mod.cls_attention

    def spy(backbone, x, **kw):
        counted.append(int(x.shape[0]))
        return real(backbone, x, **kw)

    tile = tuple(bb.input_size[1:])
    chunk = tiled_chunk_size(config, bb, tile, device, dtype)
    # the engine's own layout: tiles overlap by a quarter, so there are more than per_axis²
    layout = make_layout(work_shape((args.size, args.size), bb.patch_size, config.tile_scale),
                         tile=tile, patch=bb.patch_size,
                         overlap=tiled_mod.tile_overlap(config, bb))
    n_images = layout.n_tiles + args.n_boot
    x = torch.randn(3, *bb.input_size[1:], device=device)
    # one small tiled run first, as the bare forward warms up too (kernels, autotuning)
    drain(run_engine(field(min(args.size, 1024)), bb,
                     RunConfig(**{**config.__dict__, "n_boot": min(8, args.n_boot)})))
    bare_before = bare_forward_seconds(bb, x, n_images, chunk, device, dtype)
    runs = []
    for _ in range(max(1, args.repeats)):
        counted.clear()
        tiled_mod.cls_attention = spy
        try:
            t0 = time.perf_counter()
            result = drain(run_engine(image, bb, config))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            runs.append(time.perf_counter() - t0)
        finally:
            tiled_mod.cls_attention = real
    pipeline = statistics.median(runs)
    rss = peak_rss_gb()
    md = result.metadata
    assert n_images == md["n_tiles"] + args.n_boot and chunk == md["chunk_size"]
    bare_after = bare_forward_seconds(bb, x, n_images, chunk, device, dtype)
    bare = (bare_before + bare_after) / 2
    out = {
        "model": args.model, "size": args.size, "grid": list(result.grid_shape), "n_tiles": md["n_tiles"],
        "n_boot": args.n_boot, "forward_passes_counted": sum(counted),
        "forward_passes_expected": n_images, "chunk_size": chunk, "device": str(device),
        "threads": torch.get_num_threads(), "pipeline_s": pipeline, "bare_forward_s": bare,
        "bare_before_s": bare_before, "bare_after_s": bare_after, "pipeline_runs_s": runs,
        "ratio": pipeline / bare, "peak_rss_gb": rss, "timings": md["timings"],
        "statistics_share": md["timings"]["statistics_s"] / pipeline,
        "tail": result.null_summary.get("tail"),
    }
    print(f"{args.model} model, {args.size}x{args.size} field, {md['n_tiles']} tiles of "
          f"{md['tile_shape']}, grid {result.grid_shape}, B={args.n_boot}, chunk {chunk}, "
          f"{device}, {out['threads']} threads")
    print(f"forward passes counted {sum(counted)} = n_tiles + B = {n_images}: "
          f"{sum(counted) == n_images}")
    if len(runs) > 1:
        print("pipeline runs " + ", ".join(f"{r:.2f}" for r in runs) + " s (median below; "
              "stages of the last run)")
    print(f"pipeline      {pipeline:8.2f} s  (observed tiles {md['timings']['observed_s']:.2f} s, "
          f"nulls {md['timings']['nulls_s']:.2f} s, statistics {md['timings']['statistics_s']:.2f} s)")
    print(f"statistics share of the pipeline = {100 * out['statistics_share']:.1f} %  "
          f"(aim <= 10 %); tail: {out['tail']}")
    print(f"bare forward  {bare:8.2f} s  (timm forward_features, {n_images} images, batch {chunk}; "
          f"{bare_before:.2f} s before and {bare_after:.2f} s after the pipeline)")
    print(f"ratio pipeline / bare forward = {out['ratio']:.3f}  (aim <= 1.15)")
    print(f"peak RSS of this process = {rss:.2f} GB  (aim <= 3 GB)")
    if args.cli:
        with tempfile.TemporaryDirectory() as tmp:
            import tifffile

            path = Path(tmp) / "field.tif"
            tifffile.imwrite(path, image)
            del image, result
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "napari_attnreg.cli", "run", str(path), "--tiled",
                            "--n-boot", str(args.n_boot), "--device", str(device), "--quiet",
                            "--out", str(Path(tmp) / "out")], check=True, stdout=subprocess.DEVNULL)
            out["cli_s"] = time.perf_counter() - t0
            out["cli_peak_rss_gb"] = peak_rss_gb(resource.RUSAGE_CHILDREN)
        print(f"attnreg run --tiled: {out['cli_s']:.1f} s, peak RSS {out['cli_peak_rss_gb']:.2f} GB "
              f"(aim <= 1.5 GB)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
