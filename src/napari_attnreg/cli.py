"""Command line: ``attnreg run IMAGE... --out DIR`` and ``attnreg demo``.

One ``.npz`` result file and one PNG figure per image (per plane for stacks).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from .core.nulls import NULL_METHODS
from .core.presets import DEFAULT_PRESET, PRESET_DEFAULTS, PRESETS
from .core.regularize import RULES


def read_image(path: Path) -> np.ndarray:
    """Read a TIFF (tifffile) or any format imageio knows."""
    if not path.is_file():
        raise ValueError(f"No such image file: {path}")
    if path.suffix.lower() in (".tif", ".tiff"):
        import tifffile

        return tifffile.imread(path)
    import imageio.v3 as iio

    return iio.imread(path)


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


def _planes(image: np.ndarray, opts: dict[str, Any]) -> list[tuple[str, np.ndarray]]:
    """Split an nD stack into 2D planes; RGB(A) and channel-axis images stay whole."""
    rgb = image.ndim == 3 and image.shape[-1] in (3, 4)
    spatial = 2 + (1 if rgb or opts.get("channel_axis") is not None else 0)
    if image.ndim <= spatial:
        return [("", image)]
    if opts.get("channel_axis") is not None:
        raise ValueError("--channel-axis with a stack of more than one plane is ambiguous; "
                         "split the stack first.")
    lead = image.shape[: image.ndim - spatial]
    return [("_" + "-".join(str(i) for i in idx), image[idx]) for idx in np.ndindex(lead)]


def run_files(paths: list[Path], out_dir: Path, model: Any, arch: str | None,
              opts: dict[str, Any], quiet: bool = False) -> list[Path]:
    """Process image files; returns the result files written."""
    from tqdm import tqdm

    from .core.backbones import load_backbone
    from .core.engine import RunConfig, drain, run_engine
    from .core.images import prepare_image

    backbone = load_backbone(model, arch=arch)
    if backbone.is_random_init:
        print("WARNING: the model has RANDOM weights (no pretrained weights loaded): its attention "
              "is not meaningful. Use --model demo, a timm name with internet, or a weights file.",
              file=sys.stderr)
    print(f"model: {backbone.describe()}", file=sys.stderr)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    config = RunConfig(**opts)
    config.validate()
    for path in paths:
        image = read_image(path)
        for suffix, plane in _planes(image, opts):
            stem = f"{path.stem}{suffix}"
            prepared = prepare_image(
                plane, patch_size=backbone.patch_size, mean=backbone.mean, std=backbone.std,
                default_size=backbone.input_size[1:], target_size=config.target_size,
                channel_axis=config.channel_axis, channels=config.channels, merge=config.merge)
            config.extra = {"source": str(path), "plane": suffix.lstrip("_")}
            with tqdm(total=config.n_boot, desc=stem, unit="img", disable=quiet, file=sys.stderr) as bar:
                def tick(ev):
                    bar.n = ev.done
                    bar.set_postfix_str(f"chunk {ev.chunk_size}")
                    bar.refresh()

                result = drain(run_engine(prepared, backbone, config), tick)
            out = result.save(out_dir / f"{stem}.attnreg.npz")
            fig = save_figure(result, prepared.display, out_dir / f"{stem}.attnreg.png",
                              f"{stem} — {result.summary()}")
            print(f"{stem}: {result.summary()}\n  -> {out}\n  -> {fig}")
            written.append(out)
    return written


def run_demo(out_dir: Path, opts: dict[str, Any], quiet: bool = False) -> list[Path]:
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
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnreg",
        description="Bootstrap significance and regularized attention maps of Vision Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="process image files")
    run.add_argument("images", nargs="+", type=Path)
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
            run_demo(args.out, opts, args.quiet)
        else:
            run_files(args.images, args.out, args.model, args.arch, opts, args.quiet)
    except (ValueError, BackboneError, MemoryError) as err:
        print(f"attnreg: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
