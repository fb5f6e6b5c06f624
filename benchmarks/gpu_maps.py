"""The real DINOv2 article on a GPU: noise calibration per map and each map's throughput.

    PYTHONPATH=src python benchmarks/gpu_maps.py --article-dir DIR --out OUT [--budget-s 270]

For a lent GPU round (one prepared command, a few minutes of device time):

* calibration: noise images given as images (grey/RGB, at the model's input size and twice
  it, resized by the preprocessing) under the default preset, ``--n`` per case for the
  ``attention`` map and ``--n-other`` per case for every other map; the share with any
  significant patch and the KS test of the map-level p against uniform;
* throughput: the pipeline at ``--n-boot`` null images (bf16 on CUDA) against the bare
  forward of the same number of images at the same chunk size, per map (gradient maps are
  also set against a bare forward + backward).

``DIR`` holds the article's ``config.json``, ``preprocessor_config.json`` and
``model.safetensors`` (or a ``model_fp16.safetensors`` copy, widened to float32 here: the
device machine cannot download the wheel and the float32 file is too large to send).
Every item is timed against ``--budget-s`` and skipped when the budget is spent; an error in
one item is recorded and the rest go on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch
from scipy import stats

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def article_folder(src: Path) -> Path:
    """A folder ``load_backbone`` reads: the float32 weights, widened from fp16 if needed."""
    if (src / "model.safetensors").exists():
        return src
    from safetensors.torch import load_file, save_file
    dst = Path(tempfile.mkdtemp(prefix="dinov2_"))
    for f in src.glob("*.json"):
        shutil.copy(f, dst)
    weights = load_file(src / "model_fp16.safetensors")
    save_file({k: v.float().contiguous() for k, v in weights.items()}, dst / "model.safetensors")
    return dst


def noise_image(rng: np.random.Generator, side: int, rgb: bool) -> np.ndarray:
    """White noise with a photo's grey mean and spread (uint8), grey or RGB."""
    shape = (side, side, 3) if rgb else (side, side)
    return np.clip(118 + 62 * rng.standard_normal(shape), 0, 255).astype(np.uint8)


def concept_for(backbone, device: str):
    """A concept from example crops of real objects (coins of scikit-image's 'coins')."""
    from skimage import data

    from napari_attnreg import concept_from
    coins = data.coins()
    crops = [coins[y:y + 80, x:x + 80] for y, x in ((10, 20), (100, 150), (200, 300), (60, 230))]
    return concept_from(crops, backbone)


def map_options(name: str, concept) -> dict:
    return {"map": name, "target": concept} if name in ("cdam", "gradcam") else {"map": name}


def calibration(backbone, name: str, concept, n: int, n_boot: int, side: int, device: str,
                deadline: float) -> list[dict]:
    from napari_attnreg import regularize
    rows = []
    for rgb in (False, True):
        for scale in (1, 2):
            p_maps, any_sig, t = [], [], time.perf_counter()
            rng = np.random.default_rng([29, int(rgb), scale])
            for i in range(n):
                if time.perf_counter() > deadline:
                    break
                img = noise_image(rng, side * scale, rgb)
                r = regularize(img, backbone, n_boot=n_boot, seed=i, device=device,
                               **map_options(name, concept))
                p_maps.append(float(r.p_map))
                any_sig.append(bool(np.asarray(r.significant()).any()))
            done = len(p_maps)
            row = {"map": name, "colour": "rgb" if rgb else "grey",
                   "size": "native" if scale == 1 else f"{side * scale} resized",
                   "n": done, "n_boot": n_boot,
                   "any_significant": float(np.mean(any_sig)) if done else math.nan,
                   "ks_p": float(stats.kstest(p_maps, "uniform").pvalue) if done > 5 else math.nan,
                   "seconds": time.perf_counter() - t}
            log(f"calibration {row}")
            rows.append(row)
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_seconds(backbone, n: int, chunk: int, side: int, device: torch.device,
                 backward: bool) -> float:
    model = backbone.module if hasattr(backbone, "module") else backbone.model
    x = torch.randn(chunk, 3, side, side, device=device)
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
           else contextlib.nullcontext())
    grad = torch.enable_grad() if backward else torch.inference_mode()
    def once() -> None:
        with amp, grad:
            y = model(x)
            out = y.last_hidden_state if hasattr(y, "last_hidden_state") else y
            if backward:
                out.float().sum().backward()
    once()
    _sync(device)
    t = time.perf_counter()
    for _ in range(math.ceil(n / chunk)):
        once()
    _sync(device)
    return time.perf_counter() - t


def throughput(backbone, name: str, concept, n_boot: int, side: int, device: str) -> dict:
    from napari_attnreg import regularize
    rng = np.random.default_rng(3)
    img = noise_image(rng, side, True)
    opts = {"n_boot": n_boot, "seed": 0, "device": device, **map_options(name, concept)}
    # warm-up at the timed size (kernels, autotuning, the allocator's blocks for the chunk),
    # then the median of three, as bench_pipeline.py does
    regularize(img, backbone, **opts)
    runs = []
    for _ in range(3):
        _sync(torch.device(device))
        t = time.perf_counter()
        r = regularize(img, backbone, **opts)
        _sync(torch.device(device))
        runs.append(time.perf_counter() - t)
    pipeline = float(np.median(runs))
    chunk = int(r.metadata.get("chunk_size") or 256)
    dev = torch.device(device)
    bare = bare_seconds(backbone, n_boot + 1, chunk, side, dev, backward=False)
    row = {"map": name, "n_boot": n_boot, "chunk": chunk, "pipeline_s": pipeline,
           "bare_forward_s": bare, "throughput_vs_bare": bare / pipeline,
           "timings": r.metadata.get("timings")}
    if name in ("cdam", "gradcam"):
        fb = bare_seconds(backbone, n_boot + 1, chunk, side, dev, backward=True)
        row.update(bare_fwd_bwd_s=fb, throughput_vs_fwd_bwd=fb / pipeline)
    log(f"throughput {row}")
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--article-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--n-other", type=int, default=100)
    ap.add_argument("--calib-boot", type=int, default=200)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--maps", default="attention,heads,rollout,cdam,gradcam")
    ap.add_argument("--calibrate", default=None,
                    help="maps whose calibration is run (default: every map of --maps; 'none')")
    ap.add_argument("--budget-s", type=float, default=270.0)
    args = ap.parse_args(argv)
    from napari_attnreg.core.models.backbones import load_backbone
    out = {"device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
           "calibration": [], "throughput": [], "errors": []}
    end = T0 + args.budget_s
    try:
        backbone = load_backbone(str(article_folder(args.article_dir)))
        backbone = backbone.on(torch.device(args.device)) if hasattr(backbone, "on") else backbone
        side = int(backbone.input_size[1])
    except Exception as err:  # noqa: BLE001 - recorded for the report, nothing else can run
        out["errors"].append(f"load: {err!r}\n{traceback.format_exc()}")
        args.out.write_text(json.dumps(out, indent=1))
        return out
    maps = args.maps.split(",")
    concept = None
    if {"cdam", "gradcam"} & set(maps):
        try:
            concept = concept_for(backbone, args.device)
        except Exception as err:  # noqa: BLE001 - the class maps then fail, the rest run
            out["errors"].append(f"concept: {err!r}")
    for name in maps:  # throughput first: it is short and the figure
        if time.perf_counter() > end:
            out["errors"].append(f"throughput {name}: skipped (budget)")
            continue
        try:
            out["throughput"].append(throughput(backbone, name, concept, args.n_boot, side,
                                                args.device))
        except Exception as err:  # noqa: BLE001
            out["errors"].append(f"throughput {name}: {err!r}\n{traceback.format_exc()}")
            log(out["errors"][-1])
    calibrated = ([] if args.calibrate == "none" else
                  args.calibrate.split(",") if args.calibrate else maps)
    for name in calibrated:
        remaining = end - time.perf_counter()
        if remaining <= 5:
            out["errors"].append(f"calibration {name}: skipped (budget)")
            continue
        n = args.n if name == "attention" else args.n_other
        # each map gets a fair share of what is left, the default map the most
        share = remaining * (0.4 if name == "attention" else
                             1 / (len(calibrated) - calibrated.index(name)))
        try:
            out["calibration"] += calibration(backbone, name, concept, n, args.calib_boot, side,
                                              args.device, time.perf_counter() + share)
        except Exception as err:  # noqa: BLE001
            out["errors"].append(f"calibration {name}: {err!r}\n{traceback.format_exc()}")
            log(out["errors"][-1])
        args.out.write_text(json.dumps(out, indent=1))
    args.out.write_text(json.dumps(out, indent=1))
    log("done")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
