"""Command line: ``attnreg run IMAGE|FOLDER|GLOB... --out DIR`` and ``attnreg demo``.

One ``.npz`` result file, one PNG figure and one ``.json`` resume record per image (per plane
for stacks), named by the input's path relative to the common parent of the inputs, and
``DIR/summary.csv``. Each image runs through the pipeline service that napari and the
notebook use (:mod:`napari_attnreg.batch.run`); inputs and output names are
:mod:`napari_attnreg.batch.items`, resuming :mod:`napari_attnreg.batch.resume`, the figure
:mod:`napari_attnreg.batch.figure`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from napari_attnreg import __version__
from napari_attnreg.core.run.options import (
    add_cli_arguments,
    join_negative_values,
    options_from_cli,
)

# Heavy modules (torch, timm, matplotlib) are imported inside the commands, so that
# "attnreg --help" and "attnreg --version" answer at once.


def __getattr__(name: str) -> Any:
    """``read_image`` and ``save_figure`` stay importable from here (they live in io / batch)."""
    if name == "read_image":
        from napari_attnreg.io.readers import read_image

        return read_image
    if name == "save_figure":
        from napari_attnreg.batch.figure import save_figure

        return save_figure
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_files(paths: list[Path], out_dir: Path, model: Any, arch: str | None,
              opts: dict[str, Any], quiet: bool = False, *, recursive: bool = False,
              overwrite: bool = False, workers: int | None = None,
              scheduler: str | None = None, inputs_in_out: bool = False,
              figure: str = "publication", geojson: bool = False) -> Any:
    """Process image files, folders and globs (see :mod:`napari_attnreg.batch.run`).

    The inputs are found first (nothing to run fails before torch loads and before the
    output folder is made; a folder's other files are named), then options and (for a run on
    this machine) the device are checked, once; the model is loaded only when some output
    needs computing. Files inside ``out_dir`` are not inputs
    (a run must not analyse its own figures) unless ``inputs_in_out`` (the demo's fallback
    image lives there), nor are those in a folder of tissue masks (``--tissue-mask
    FOLDER``). ``geojson``: also ``NAME.geojson`` beside each result (a user's file of that
    name, or one edited since, is replaced only with ``overwrite``).

    Returns
    -------
    BatchReport
        The rows of ``summary.csv`` (:class:`~napari_attnreg.batch.summary.BatchReport`).
    """
    from napari_attnreg.batch.items import collect_inputs

    # the inputs first: a missing file or an empty folder fails at once, before torch loads
    # and before the output folder is made
    from napari_attnreg.batch.masks import is_mask_folder

    skipped: list[Path] = []
    # a folder of tissue masks inside an input folder holds images named after the inputs:
    # taken as inputs, each mask was analysed with itself as its own mask
    exclude = [] if inputs_in_out else [out_dir]
    if is_mask_folder(opts.get("tissue_mask")):
        exclude.append(Path(str(opts["tissue_mask"]).strip()))
    items = collect_inputs(paths, recursive=recursive, exclude=exclude, skipped=skipped)
    _report_skipped(skipped, recursive)

    from napari_attnreg.batch.figure import FIGURES
    from napari_attnreg.batch.items import prepare_output_dir
    from napari_attnreg.batch.run import check_run, run_batch

    check_run(opts, device=not (workers or scheduler))  # one message, before anything loads
    if workers or scheduler:
        from napari_attnreg.batch.distributed import check_dask

        check_dask()  # a missing Dask names its pip command before the output folder is made
    prepare_output_dir(out_dir)  # a wrong --out fails before any image is read
    report = run_batch(items, out_dir, model, arch, opts, overwrite=overwrite, quiet=quiet,
                       figure=FIGURES[figure], workers=workers, scheduler=scheduler,
                       on_model=_announce_model, geojson=geojson)
    done = sum(r["status"] == "done" for r in report.rows)
    print(f"{done} done, {len(report.rows) - done - len(report.failed)} skipped, "
          f"{len(report.failed)} failed; summary: {report.summary}", file=sys.stderr)
    return report


def _report_skipped(skipped: list[Path], recursive: bool) -> None:
    """Say which files (and, without --recursive, subfolders) a folder scan left out."""
    files = [p for p in skipped if not p.is_dir()]
    folders = [p for p in skipped if p.is_dir()]
    if files:
        names = ", ".join(p.name for p in files[:5]) + (", ..." if len(files) > 5 else "")
        print(f"attnreg: note: skipped {len(files)} file(s) that are not images: {names}",
              file=sys.stderr)
    if folders and not recursive:
        names = ", ".join(p.name for p in folders[:5]) + (", ..." if len(folders) > 5 else "")
        print(f"attnreg: note: skipped {len(folders)} subfolder(s) ({names}); add --recursive "
              "to take their images", file=sys.stderr)


def _announce_model(backbone: Any) -> None:
    """Name the model when the batch loads it, and say so loudly when its weights are random."""
    if backbone.is_random_init:
        print("WARNING: the model has RANDOM weights (no pretrained weights loaded): its "
              "attention is not meaningful. Use --model demo, a timm name with internet, or "
              "a weights file.", file=sys.stderr)
    print(f"model: {backbone.describe()}", file=sys.stderr)


def run_demo(out_dir: Path, opts: dict[str, Any], quiet: bool = False,
             figure: str = "publication", geojson: bool = False) -> Any:
    """The bundled demo model on the bundled sample image.

    A source checkout without the trained demo files falls back, loudly, to a random-init
    ViT on scikit-image's ``cell`` so the pipeline can still be exercised offline.
    """
    from napari_attnreg.batch.run import check_run
    from napari_attnreg.core.models.backbones import DEMO_DIR
    from napari_attnreg.samples import DATA_DIR, DEMO_IMAGE, skimage_sample

    check_run(opts)  # before the fallback below builds a model
    image = DATA_DIR / DEMO_IMAGE
    if not image.is_file():
        import tifffile

        out_dir.mkdir(parents=True, exist_ok=True)
        image = out_dir / "cell.tif"
        tifffile.imwrite(image, skimage_sample("cell"))
        print("NOTE: the bundled synthetic sample is missing; using scikit-image's 'cell'.", file=sys.stderr)
    fallback = image.parent == out_dir
    if (DEMO_DIR / "demo_vit.safetensors").is_file():
        return run_files([image], out_dir, "demo", None, opts, quiet, inputs_in_out=fallback,
                         figure=figure, geojson=geojson)
    from napari_attnreg.core.models.backbones import load_backbone

    print("NOTE: the bundled demo model is missing from this install; falling back to a "
          "random-init vit_small_patch16_224.", file=sys.stderr)
    return run_files([image], out_dir, load_backbone("vit_small_patch16_224", pretrained=False),
                     None, opts, quiet, inputs_in_out=fallback, figure=figure,
                     geojson=geojson)


def concept_from_files(files: list[Path], model: Any, arch: str | None) -> Any:
    """The concept of ``--concept``: a saved vector (one ``.npy`` file), or the mean CLS token
    of example images of it (any readable image files)."""
    import numpy as np

    if len(files) == 1 and files[0].suffix.lower() == ".npy":
        try:
            return np.load(files[0], allow_pickle=False)
        except (OSError, ValueError) as err:
            raise ValueError(f"--concept {files[0]}: not a saved vector ({err}).") from err
    from napari_attnreg.core.models.backbones import load_backbone
    from napari_attnreg.core.run.concept import concept_from
    from napari_attnreg.io.readers import read_image

    backbone = load_backbone(str(model), arch=arch)
    return concept_from([read_image(f) for f in files], backbone)


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("attnreg_out"), help="output folder")
    add_cli_arguments(p)  # every run option, from the one option table in core.options
    p.add_argument("--concept", nargs="+", type=Path, default=None, metavar="FILE",
                   help="class maps (--map cdam/gradcam) on a model without a classification "
                        "head: the target concept, as a saved vector (.npy) or example images "
                        "of it (their mean CLS token)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--figure", choices=("publication", "overview"), default="publication",
                   help="the .png beside each result: 'publication' (default; the regularized "
                        "map over the image at native resolution with its colour bar, outline "
                        "key and scale bar, as napari's Export figure) or 'overview' (the image "
                        "and every map side by side, with the run's diagnostics)")
    p.add_argument("--geojson", action="store_true", help="also write each result's significant "
                   "regions as GeoJSON polygons in image pixels (QuPath), beside its .npz (an "
                   "existing one the tool did not write, or edited since, is kept unless "
                   "--overwrite)")


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one ``attnreg: error:`` line (not the whole usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"attnreg: error: {message} (see '{self.prog} --help')\n")


DEMO_NOTE = ("no --model given: using the bundled demo model, a test article trained on "
             "synthetic fluorescence nuclei, not for real data ('attnreg models' lists real "
             "models)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="attnreg",
        description="Bootstrap significance and regularized attention maps of Vision Transformers.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
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
    run.add_argument("--model", default=None,
                     help="'demo', a catalogue id (see 'attnreg models'), a timm name, hf-hub:id, "
                          "hf:id (transformers), or a weights file. Default: 'demo', the bundled "
                          "test article (synthetic nuclei), not for real data")
    run.add_argument("--arch", default=None, help="timm architecture or catalogue id of a weights file")
    run.add_argument("--weights", default=None, type=Path,
                     help="local weights file for --model (a catalogue id or timm name), "
                          "offline; a transformers folder goes with a transformers catalogue id "
                          "(rad-dino, phikon), or alone as --model FOLDER")
    _add_run_options(run)
    demo = sub.add_parser("demo", help="bundled demo model on the bundled sample image (offline)")
    _add_run_options(demo)
    sub.add_parser("models", help="list the catalogue of known models")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``attnreg`` command."""
    with _warnings_as_notes():
        return _main(argv)


@contextlib.contextmanager
def _warnings_as_notes() -> Iterator[None]:
    """Our own warnings (a slide cut short, a DICOM slice left out) as one line each,
    ``attnreg: warning: ...``, not Python's two lines with a source line of ours in them;
    other packages' warnings as Python prints them."""
    import warnings

    shown = warnings.showwarning

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
             line: Any = None) -> None:
        if "napari_attnreg" in str(filename):
            print(f"attnreg: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(join_negative_values(sys.argv[1:] if argv is None else argv))
    from napari_attnreg.core.models.errors import BackboneError

    if args.command == "models":
        from napari_attnreg.core.models.catalogue import catalogue_table

        print(catalogue_table())
        return 0
    if args.command == "run" and args.model is None:
        note = DEMO_NOTE if args.weights is None else (
            f"no --model given: {args.weights} is read as the bundled demo architecture (give "
            "--model with the architecture the file holds)")
        print(f"attnreg: note: {note}", file=sys.stderr)
        args.model = "demo"
    if args.command == "run" and args.weights is not None:  # --model names what the file holds
        args.model, args.arch = str(args.weights), args.model
    try:
        opts = options_from_cli(args)
        if args.concept:
            model = "demo" if args.command == "demo" else args.model
            opts["target"] = concept_from_files(args.concept, model,
                                                getattr(args, "arch", None))
        if args.command == "demo":
            report = run_demo(args.out, opts, args.quiet, figure=args.figure,
                              geojson=args.geojson)
        else:
            report = run_files(args.images, args.out, args.model, args.arch, opts, args.quiet,
                               recursive=args.recursive, overwrite=args.overwrite,
                               workers=args.workers, scheduler=args.scheduler,
                               figure=args.figure, geojson=args.geojson)
    except (ValueError, BackboneError, MemoryError) as err:
        print(f"attnreg: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # an input folder that cannot be listed, say: the OS's words
        where = f": {err.filename}" if err.filename else ""
        print(f"attnreg: error: {err.strerror or err}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C is how a batch is paused: a screen of torch's stack frames reads as a crash
        # and hides the one thing the user needs, that rerunning resumes
        print(f"\nattnreg: interrupted. The results finished so far are kept in {args.out}; "
              "run the same command again to resume (finished images are skipped, the "
              "interrupted one is redone).", file=sys.stderr)
        return 130
    return 1 if report.failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
