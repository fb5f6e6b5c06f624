"""A CPU's throughput of a ViT's attention pass by images per batch, and the tiled chunk chosen.

    PYTHONPATH=src python benchmarks/bench_cpu_batch.py --models vit_small_patch16_224,vit_base_patch16_224
    PYTHONPATH=src python benchmarks/bench_cpu_batch.py --models DIR   # e.g. the real DINOv2 article

For each model: images per second of the attention pass the pipeline runs
(:func:`~napari_attnreg.core.models.attention.cls_attention`, every head) at 1, 2, 4, 8 and
16 images per batch, over the same images, the batch sizes interleaved and each repeated
(``--repeats``); the best of the repeats is reported, as the figure least touched by other
work on a shared machine. Beside it, the chunk a tiled CPU run picks
(:func:`~napari_attnreg.core.run.tiled_engine.tiled_chunk_size`) and the one the one-second
latency bound alone would give (:func:`~napari_attnreg.core.run.tiled_engine.latency_chunk`).
Timm names are random-initialised (the arithmetic is the same as the trained model's).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from napari_attnreg.core.models.attention import cls_attention
from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.config import RunConfig
from napari_attnreg.core.run.tiled_engine import latency_chunk, tiled_chunk_size

BATCHES = (1, 2, 4, 8, 16)


def throughput(name: str, n_images: int, repeats: int) -> dict:
    """Best images per second at each of :data:`BATCHES`, and the tiled chunk sizes."""
    backbone = load_backbone(name) if Path(name).exists() else load_backbone(name, pretrained=False)
    tile = tuple(backbone.input_size[1:])
    x = torch.randn(n_images, backbone.in_chans, *tile, generator=torch.Generator().manual_seed(0))
    rates: dict[int, list[float]] = {b: [] for b in BATCHES}
    with torch.inference_mode():
        cls_attention(backbone, x[:2], head="all")  # first-use costs
        for _ in range(repeats):
            for batch in BATCHES:
                t0 = time.perf_counter()
                for start in range(0, n_images, batch):
                    cls_attention(backbone, x[start:start + batch], head="all")
                rates[batch].append(n_images / (time.perf_counter() - t0))
    cpu = torch.device("cpu")
    return {"model": name, "tile": list(tile), "threads": torch.get_num_threads(),
            "images_per_s_best": {b: max(v) for b, v in rates.items()},
            "images_per_s_all": rates, "latency_chunk": latency_chunk(backbone, tile),
            "tiled_chunk": tiled_chunk_size(RunConfig(tiled=True), backbone, tile, cpu, None)}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="vit_small_patch16_224",
                    help="comma-separated timm names or model folders")
    ap.add_argument("--n-images", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    out = []
    for name in args.models.split(","):
        row = throughput(name, args.n_images, args.repeats)
        out.append(row)
        rates = ", ".join(f"{b}: {r:.1f}" for b, r in row["images_per_s_best"].items())
        print(f"{name}: images/s by batch (best of {args.repeats}) {rates}; tiled CPU chunk "
              f"{row['tiled_chunk']} (latency bound alone {row['latency_chunk']}), "
              f"{row['threads']} threads", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
