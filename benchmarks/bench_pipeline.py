"""Pipeline cost against the forward passes it cannot avoid, measured in one run.

    python benchmarks/bench_pipeline.py --model vit_small_patch16_224 --size 224 --n-boot 64
    python benchmarks/bench_pipeline.py --model vit_small_patch8_224 --size 480 --n-boot 1000 \
        --device cuda --precision bfloat16

Prints, for the same number of images and the same batch size:
  * pipeline: the whole ``run_engine`` (null generation, attention fast path, statistics),
  * bare forward: timm ``forward_features`` of the backbone (fused SDPA) on pre-made inputs,
  * their ratio (aim: ≤ 1.10 on CPU; throughput ≥ 0.9× bare on GPU),
  * the statistics time alone and its share of the wall time,
  * optionally (``--naive``) the per-image explicit full-attention-matrix extraction that
    reference code and rollout-style tools do, for scale.
Random-init weights: speed does not depend on the weights.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import numpy as np
import torch

from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.engine import (
    RunConfig,
    autocast_dtype,
    drain,
    resolve_device,
    run_engine,
)
from napari_attnreg.core.run.images import prepare_image


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_forward_seconds(bb, x: torch.Tensor, n_images: int, chunk: int, device, dtype) -> float:
    """Time timm's own forward_features over n_images at batch size `chunk`."""
    amp = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    batch = x[None].expand(chunk, -1, -1, -1).contiguous() + 0.01 * torch.randn(
        chunk, *x.shape, device=device)
    with torch.inference_mode(), amp:
        bb.model.forward_features(batch[:1])
        _sync(device)
        t0 = time.perf_counter()
        done = 0
        while done < n_images:
            size = min(chunk, n_images - done)
            bb.model.forward_features(batch[:size])
            done += size
        _sync(device)
    return time.perf_counter() - t0


def naive_seconds(bb, x: torch.Tensor, n_images: int, device) -> float:
    """One image at a time, unfused attention, full T×T matrix captured by a hook."""
    captured = {}
    blocks = bb.model.blocks
    for blk in blocks:
        blk.attn.fused_attn = False
    handle = blocks[-1].attn.attn_drop.register_forward_hook(lambda m, i, o: captured.update(a=o))
    try:
        with torch.no_grad():
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(n_images):
                noise = x + torch.randn_like(x)
                bb.model.forward_features(noise[None])
                captured["a"][:, :, 0, bb.num_prefix_tokens:].mean(1).cpu()
            _sync(device)
            return time.perf_counter() - t0
    finally:
        handle.remove()
        for blk in blocks:
            blk.attn.fused_attn = True


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_small_patch16_224")
    ap.add_argument("--size", type=int, default=224, help="square input side in model pixels")
    ap.add_argument("--n-boot", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--chunk-size", type=int, default=None)
    ap.add_argument("--method", default="normal")
    ap.add_argument("--repeats", type=int, default=3, help="take the median of this many runs")
    ap.add_argument("--naive", type=int, default=0, help="also time N images the naive way")
    ap.add_argument("--json", default=None, help="write the numbers to this file")
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    device = resolve_device(args.device)
    bb = load_backbone(args.model, pretrained=False) if args.model != "demo" else load_backbone("demo")
    bb.to(device)
    dtype = autocast_dtype(device, args.precision)
    rng = np.random.default_rng(0)
    image = rng.random((args.size, args.size, 3)).astype(np.float32)
    prepared = prepare_image(image, patch_size=bb.patch_size, mean=bb.mean, std=bb.std,
                             default_size=bb.input_size[1:], target_size="native")
    config = RunConfig(n_boot=args.n_boot, device=str(device), precision=args.precision,
                       chunk_size=args.chunk_size, method=args.method)
    drain(run_engine(prepared, bb, RunConfig(**{**config.__dict__, "n_boot": min(4, args.n_boot)})))

    # Alternate pipeline and bare runs so drifting machine load hits both alike (shared machines).
    pipeline, bare, stats_t = [], [], []
    x = prepared.tensor.to(device)
    for _ in range(args.repeats):
        _sync(device)
        t0 = time.perf_counter()
        result = drain(run_engine(prepared, bb, config))
        _sync(device)
        pipeline.append(time.perf_counter() - t0)
        stats_t.append(result.metadata["timings"]["statistics_s"])
        stages = result.metadata["timings"]
        chunk = result.metadata["chunk_size"]
        bare.append(bare_forward_seconds(bb, x, args.n_boot + 1, chunk, device, dtype))
    p, b, s = statistics.median(pipeline), statistics.median(bare), statistics.median(stats_t)
    out = {
        "model": args.model, "size": args.size, "grid": list(result.grid_shape), "n_boot": args.n_boot,
        "device": str(device), "precision": str(dtype or torch.float32).replace("torch.", ""),
        "chunk_size": chunk, "pipeline_s": p, "bare_forward_s": b, "ratio": p / b,
        "pipeline_img_per_s": (args.n_boot + 1) / p, "bare_img_per_s": (args.n_boot + 1) / b,
        "throughput_vs_bare": b / p, "statistics_s": s, "statistics_share": s / p,
        "threads": torch.get_num_threads(), "stages_last_run": stages,
    }
    print(f"model {args.model}  input {args.size}x{args.size}  grid {out['grid']}  "
          f"B={args.n_boot}  device {device}  {out['precision']}  chunk {chunk}  threads {out['threads']}")
    print(f"pipeline        {p:8.3f} s   ({out['pipeline_img_per_s']:.1f} img/s)")
    print(f"bare forward    {b:8.3f} s   ({out['bare_img_per_s']:.1f} img/s, timm forward_features, "
          f"{args.n_boot + 1} images, batch {chunk})")
    print(f"ratio pipeline / bare forward = {out['ratio']:.3f}   (throughput {out['throughput_vs_bare']:.3f}x bare)")
    print(f"statistics alone {s * 1e3:7.1f} ms  = {100 * out['statistics_share']:.2f}% of the pipeline")
    print("stages of the last run (ms): " + ", ".join(
        f"{k.removesuffix('_s')} {1e3 * v:.1f}" for k, v in stages.items()))
    if args.naive:
        n = args.naive
        t = naive_seconds(bb, x, n, device)
        out["naive_img_per_s"] = n / t
        out["speedup_vs_naive"] = out["pipeline_img_per_s"] / out["naive_img_per_s"]
        print(f"naive per-image full-matrix extraction: {n / t:.1f} img/s -> pipeline is "
              f"{out['speedup_vs_naive']:.1f}x faster")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return out


if __name__ == "__main__":
    main()
