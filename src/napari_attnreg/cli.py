"""Command line: ``attnreg run IMAGE|FOLDER|GLOB... --out DIR`` and ``attnreg demo``.

One ``.npz`` result file and one PNG figure per image (per plane for stacks), named by the
input's path relative to the common parent of the inputs, and ``DIR/summary.csv``; the
batch logic is :mod:`napari_attnreg.batch`.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from .batch import read_image  # noqa: F401  (kept importable from here)
from .core.nulls import NULL_METHODS
from .core.presets import DEFAULT_PRESET, PRESET_DEFAULTS, PRESETS
from .core.regularize import RULES


def save_figure(result: Any, display: np.ndarray, path: Path, title: str) -> Path:
    """PNG: the image, then every continuous map of the result's preset, each with a legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .core.display import CONTINUOUS_MAPS, SIGNIFICANT_COLOR, diagnostics_lines

    thresholds = result._thresholds()
    fig, axes = plt.subplots(1, 1 + len(CONTINUOUS_MAPS), figsize=(20, 5.6), constrained_layout=True)
    axes[0].imshow(display, cmap="gray" if display.ndim == 2 else None)
    axes[0].set_title("image")
    sig = result.to_pixels(result.significant().astype(float))
    for ax, view in zip(axes[1:], CONTINUOUS_MAPS):
        ax.imshow(display, cmap="gray" if display.ndim == 2 else None)
        vmin, vmax = view.limits(result)
        im = ax.imshow(result.to_pixels(view.values(result, thresholds)), cmap=view.colormap,
                       alpha=0.6, vmin=vmin, vmax=vmax)
        ax.set_title(view.title(result.preset, thresholds), fontsize=10)
        bar = fig.colorbar(im, ax=ax, fraction=0.046, orientation="horizontal", pad=0.02)
        # wrapped by hand: matplotlib's wrap=True ignores the neighbouring panels
        bar.set_label(textwrap.fill(view.legend(result.preset), 48), fontsize=7)
    axes[-1].contour(sig, levels=[0.5], colors=SIGNIFICANT_COLOR, linewidths=0.9)
    for ax in axes:
        ax.set_axis_off()
    notes = diagnostics_lines(result)
    fig.suptitle("\n".join([title, *notes]), fontsize=9)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "method": args.method, "n_boot": args.n_boot, "seed": args.seed, "device": args.device,
        "chunk_size": args.chunk_size, "precision": args.precision, "preset": args.preset, "rule": args.rule,
        "p_th": args.p_th, "l_th": args.l_th, "q_th": args.q_th, "z_th": _z_th(args.z_th),
        "p_method": args.p_method, "alternative": args.alternative,
        "pi0_method": _pi0(args.pi0_method) if args.pi0_method else None, "null": args.null,
        "null_pool": args.null_pool,
        "layer": args.layer, "keep_nulls": args.keep_nulls, "target_size": _size(args.target_size),
        "channel_axis": args.channel_axis, "merge": args.merge,
        "tiled": args.tiled, "tile_scale": args.tile_scale, "tile_overlap": args.tile_overlap,
        "null_scope": args.null_scope,
    }
    if args.channels:
        opts["channels"] = [int(c) for c in args.channels.split(",")]
    return opts


def _pi0(value: str) -> str | float:
    try:
        return float(value)
    except ValueError:
        return value


def _z_th(value: str | None) -> float | None:
    if value is None or value.lower() == "none":
        return None
    return float(value)


def _size(value: str) -> Any:
    return int(value) if value.isdigit() else value


def run_files(paths: list[Path], out_dir: Path, model: Any, arch: str | None,
              opts: dict[str, Any], quiet: bool = False, *, recursive: bool = False,
              overwrite: bool = False, workers: int | None = None,
              scheduler: str | None = None) -> Any:
    """Process image files, folders and globs (see :mod:`napari_attnreg.batch`).

    Returns the :class:`~napari_attnreg.batch.BatchReport` (rows of ``summary.csv``).
    """
    from .batch import cached_backbone, collect_inputs, run_batch

    items = collect_inputs(paths, recursive=recursive)
    if not (workers or scheduler):  # on a cluster the workers load it; here it is checked now
        backbone = cached_backbone(model, arch)
        if backbone.is_random_init:
            print("WARNING: the model has RANDOM weights (no pretrained weights loaded): its "
                  "attention is not meaningful. Use --model demo, a timm name with internet, or "
                  "a weights file.", file=sys.stderr)
        print(f"model: {backbone.describe()}", file=sys.stderr)
        model = backbone
    report = run_batch(items, out_dir, model, arch, opts, overwrite=overwrite, quiet=quiet,
                       figure=save_figure, workers=workers, scheduler=scheduler)
    done = sum(r["status"] == "done" for r in report.rows)
    print(f"{done} done, {len(report.rows) - done - len(report.failed)} skipped, "
          f"{len(report.failed)} failed; summary: {report.summary}", file=sys.stderr)
    return report


def run_demo(out_dir: Path, opts: dict[str, Any], quiet: bool = False) -> Any:
    """The bundled demo model on the bundled sample image.

    A source checkout without the trained demo files falls back, loudly, to a random-init
    ViT on scikit-image's ``cell`` so the pipeline can still be exercised offline.
    """
    from .core.backbones import DEMO_DIR
    from .samples import DATA_DIR, DEMO_IMAGE, skimage_sample

    image = DATA_DIR / DEMO_IMAGE
    if not image.is_file():
        import tifffile

        out_dir.mkdir(parents=True, exist_ok=True)
        image = out_dir / "cell.tif"
        tifffile.imwrite(image, skimage_sample("cell"))
        print("NOTE: the bundled synthetic sample is missing; using scikit-image's 'cell'.", file=sys.stderr)
    if (DEMO_DIR / "demo_vit.safetensors").is_file():
        return run_files([image], out_dir, "demo", None, opts, quiet)
    from .core.backbones import load_backbone

    print("NOTE: the bundled demo model is missing from this install; falling back to a "
          "random-init vit_small_patch16_224.", file=sys.stderr)
    return run_files([image], out_dir, load_backbone("vit_small_patch16_224", pretrained=False),
                     None, opts, quiet)


def _add_run_options(p: argparse.ArgumentParser, n_boot: int) -> None:
    p.add_argument("--out", type=Path, default=Path("attnreg_out"), help="output folder")
    p.add_argument("--method", choices=NULL_METHODS, default="normal", help="bootstrap null generator")
    p.add_argument("--n-boot", type=int, default=n_boot, help="number of bootstrap null images")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (cuda → mps → cpu), cuda, mps or cpu")
    p.add_argument("--chunk-size", type=int, default=None, help="null images per chunk (default: from memory)")
    p.add_argument("--precision", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    d, paper = PRESET_DEFAULTS["directional"], PRESET_DEFAULTS["paper"]

    def both(key: str) -> str:
        return f"default: {d[key]} (directional), {paper[key]} (paper)"

    p.add_argument("--preset", choices=PRESETS, default=DEFAULT_PRESET,
                   help="directional: is attention ABOVE the null (one-sided, q-value rule); "
                        "paper: the published two-sided procedure, unchanged")
    p.add_argument("--rule", choices=RULES, default=None, help="significance rule; " + both("rule"))
    p.add_argument("--q-th", type=float, default=None, help="q-value threshold; " + both("q_th"))
    p.add_argument("--p-th", type=float, default=None, help="p-value threshold; " + both("p_th"))
    p.add_argument("--l-th", type=float, default=None, help="local fdr threshold; " + both("l_th"))
    p.add_argument("--z-th", default=None, help="z mask ('none' = off); " + both("z_th"))
    p.add_argument("--null-pool", choices=["pooled", "position"], default=None,
                   help="directional only: compare each patch with all null patches (pooled) or "
                        "with its own position (position-locked attention)")
    p.add_argument("--p-method", choices=["pooled", "null"], default=None, help="paper preset only")
    p.add_argument("--alternative", choices=["two-sided", "greater"], default=None,
                   help="paper preset only")
    p.add_argument("--pi0-method", default=None,
                   help="reference, smoother, bootstrap or a number; " + both("pi0_method"))
    p.add_argument("--null", choices=["theoretical", "empirical"], default=None,
                   help="paper preset only: null of the local fdr")
    p.add_argument("--layer", type=int, default=-1, help="transformer block (-1 = last)")
    p.add_argument("--target-size", default="model", help="'model', 'native' or the long side in pixels")
    p.add_argument("--channel-axis", type=int, default=None, help="axis of channels in multichannel images")
    p.add_argument("--channels", default=None, help="comma-separated channels to use (up to 3)")
    p.add_argument("--merge", choices=["mean", "max"], default=None, help="merge channels to grayscale")
    p.add_argument("--keep-nulls", action="store_true", help="store every null attention map")
    p.add_argument("--tiled", action="store_true",
                   help="large images: model-sized tiles at native pixel size, one null for the image")
    p.add_argument("--tile-scale", type=float, default=1.0,
                   help="with --tiled: downsampling factor before tiling (1 = native pixels)")
    p.add_argument("--tile-overlap", type=int, default=0,
                   help="with --tiled: pixels shared by neighbouring tiles (a multiple of the patch)")
    p.add_argument("--null-scope", choices=["image", "tile"], default=None,
                   help="with --tiled: one null for the whole image (default) or one per tile")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnreg",
        description="Bootstrap significance and regularized attention maps of Vision Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="process image files")
    run.add_argument("images", nargs="+", help="image files, folders or glob patterns ('*.tif')")
    run.add_argument("--recursive", action="store_true", help="descend into subfolders ('**' in globs)")
    run.add_argument("--overwrite", action="store_true",
                     help="recompute images whose result file exists (default: skip them)")
    run.add_argument("--workers", type=int, default=None,
                     help="run on a local Dask cluster of this many processes (pip install "
                          "napari-attnreg[scale])")
    run.add_argument("--scheduler", default=None, help="address of a running Dask scheduler")
    run.add_argument("--model", default="demo",
                     help="'demo', a catalogue id (see 'attnreg models'), a timm name, hf-hub:id, "
                          "hf:id (transformers), or a weights file")
    run.add_argument("--arch", default=None, help="timm architecture or catalogue id of a weights file")
    run.add_argument("--weights", default=None, type=Path,
                     help="local weights file (or transformers folder) for --model, offline")
    _add_run_options(run, n_boot=200)
    demo = sub.add_parser("demo", help="bundled demo model on the bundled sample image (offline)")
    _add_run_options(demo, n_boot=200)
    sub.add_parser("models", help="list the catalogue of known models")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``attnreg`` command."""
    args = build_parser().parse_args(argv)
    from .core.backbones import BackboneError

    if args.command == "models":
        from .core.catalogue import catalogue_table

        print(catalogue_table())
        return 0
    if args.command == "run" and args.weights is not None:  # --model names what the file holds
        args.model, args.arch = str(args.weights), args.model
    try:
        opts = _options(args)
        if args.command == "demo":
            report = run_demo(args.out, opts, args.quiet)
        else:
            report = run_files(args.images, args.out, args.model, args.arch, opts, args.quiet,
                               recursive=args.recursive, overwrite=args.overwrite,
                               workers=args.workers, scheduler=args.scheduler)
    except (ValueError, BackboneError, MemoryError) as err:
        print(f"attnreg: error: {err}", file=sys.stderr)
        return 2
    return 1 if report.failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
