"""Batches of image files through the pipeline service, with resume and ``summary.csv``.

:func:`process_item` runs one input: every plane that needs work becomes a
:class:`~napari_attnreg.core.run.service.Job` run by
:func:`~napari_attnreg.core.run.service.run_job_sync` (the path napari and the notebook
take; a progress callback drives the bar here), and its
:class:`~napari_attnreg.core.run.service.Outcome` becomes the result file, the figure, the
resume record and a summary row. :func:`run_batch` runs every input, serially or one task
per image on Dask (:mod:`.distributed`), and keeps ``summary.csv`` (:mod:`.summary`) up to
date. A file that fails, including any file a decoder cannot read, is reported with its
reason (:func:`~napari_attnreg.core.run.service.user_message`) and the batch goes on. Every
output is written atomically and recorded last in a resume record (:mod:`.resume`), so a
rerun skips exactly the complete outputs of unchanged inputs and options and redoes the
rest, saying why. Options (and, for a serial run, the device) are checked once before any
image, and the model is loaded only when the first output needs computing: a batch whose
outputs are all complete never loads it.
"""

from __future__ import annotations

import errno
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.batch.distributed import check_dask, check_workers, run_on_dask
from napari_attnreg.batch.figure import FIGURES, figure_view
from napari_attnreg.batch.items import (
    RESULT_SUFFIX,
    BatchItem,
    geojson_path,
    output_artefacts,
    output_path,
    prepare_output_dir,
)
from napari_attnreg.batch.masks import check_mask_folder, is_mask_folder, mask_for_item
from napari_attnreg.batch.resume import (
    add_artefact,
    decide,
    input_stamp,
    owns,
    run_signature,
    write_record,
)
from napari_attnreg.batch.summary import (
    BatchReport,
    FolderLock,
    Row,
    SummaryFile,
    failed_row,
    kept_row,
    result_row,
)
from napari_attnreg.core.models.backbones import Backbone
from napari_attnreg.core.run.engine import RunConfig
from napari_attnreg.core.run.lazy import LazyImage
from napari_attnreg.core.run.maps import scorer_for
from napari_attnreg.core.run.planes import PlaneIndex, PlaneStack, plane_label
from napari_attnreg.core.run.service import (
    Job,
    JobProgress,
    ModelSpec,
    Outcome,
    load_model,
    run_job_sync,
    user_message,
)
from napari_attnreg.io.geojson import is_geojson_path, tissue_mask_for_run
from napari_attnreg.io.readers import ImageInfo, open_for_run

Figure = Callable[[Any, np.ndarray, Path, str], Any]


@dataclass(frozen=True)
class _ItemContext:
    """What every plane of one input shares."""

    item: BatchItem
    out_dir: Path
    model: ModelSpec
    opts: dict[str, Any]
    figure: Figure | None
    stamp: dict[str, Any]
    run: dict[str, Any]
    overwrite: bool
    quiet: bool
    extra: dict[str, Any]  # what the file says (pixel size, kind), for the result's metadata
    before_run: Callable[[], Any] | None
    geojson: bool = False  # also NAME.geojson, the significant regions for QuPath
    plane_names: tuple[str, ...] = ()  # the stack axes' names the file states ("z")


def check_run(opts: dict[str, Any], *, device: bool = True) -> RunConfig:
    """Every option, and the device where the batch runs here, checked once before any image.

    Parameters
    ----------
    opts : dict
        :class:`RunConfig` options.
    device : bool
        Also check that the device exists on this machine (``--device cuda`` on a machine
        without a GPU); a Dask batch checks it on its workers instead.

    Returns
    -------
    RunConfig
        Resolved (the preset's defaults filled in).

    Raises
    ------
    ValueError
        One message that says what to change; nothing has been loaded or read yet.
    """
    if is_mask_folder(opts.get("tissue_mask")):  # one mask per input, found for each
        check_mask_folder(opts["tissue_mask"])
        opts = {**opts, "tissue_mask": "auto"}  # the other options, checked as with a mask
    config = RunConfig(**opts).validate()
    if device:
        from napari_attnreg.core.models.base import resolve_device

        resolve_device(config.device)
    return config


class ModelOnFirstUse:
    """Loads the batch's model when the first output needs it, once, and checks it then.

    Called before each run of a serial batch; the first call loads the model (the service's
    cache keeps it for the runs), checks that the target size holds a patch of it and hands
    it to ``on_load`` (the command line names it and warns about random weights). A batch
    whose outputs are all complete never calls it, so never loads the model.
    """

    def __init__(self, spec: ModelSpec, opts: dict[str, Any],
                 on_load: Callable[[Backbone], Any] | None = None) -> None:
        self.spec, self.opts, self.on_load = spec, opts, on_load
        self.backbone: Backbone | None = None

    def __call__(self) -> Backbone:
        if self.backbone is None:
            from napari_attnreg.core.run.images import check_target_size

            backbone = load_model(self.spec)
            # a size below one patch, or a class map of a model without a classification
            # head and no concept, is wrong for every image: the batch stops here
            check_target_size(self.opts.get("target_size", "model"), backbone.patch_size)
            config = RunConfig(**self.opts)
            scorer_for(config.map, layer=config.layer, head=config.head,
                       target=config.target).check(backbone)
            self.backbone = backbone
            if self.on_load is not None:
                self.on_load(backbone)
        return self.backbone


def process_item(item: BatchItem, out_dir: Path, model: Any, arch: str | None,
                 opts: dict[str, Any], *, overwrite: bool = False, quiet: bool = True,
                 figure: Figure | None = None,
                 before_run: Callable[[], Any] | None = None,
                 geojson: bool = False) -> list[Row]:
    """Run every plane of one file through the pipeline service and write its results.

    Parameters
    ----------
    item : BatchItem
    out_dir : Path
    model : str, Path or Backbone
        As :meth:`ModelSpec.from_model` reads it; loaded once per process (the service's
        model cache), so a Dask worker keeps it for its next image.
    arch : str, optional
        Architecture of a weights file.
    opts : dict
        :class:`RunConfig` options.
    overwrite : bool
        Redo outputs that a resume would keep.
    quiet : bool
        No progress bar.
    figure : callable, optional
        ``figure(result, display, path, title)`` writes a PNG beside each result.
    before_run : callable, optional
        Called before each plane that is computed (a serial batch's :class:`ModelOnFirstUse`);
        what it raises ends the batch.
    geojson : bool
        Also write ``NAME.geojson`` (the significant regions) beside each result; for a kept
        result only when it is missing.

    Without ``overwrite`` no file the tool did not write is replaced: a figure or GeoJSON
    that was there before (or a GeoJSON edited since the tool wrote it) is left as it is,
    saying so (:func:`~napari_attnreg.batch.resume.owns`), as a foreign result file is refused.

    Returns
    -------
    list of dict
        One summary row per plane. Complete results of this input made with these options
        are kept (``skipped (exists)``) unless ``overwrite``; incomplete or different ones
        are redone, saying why (:mod:`.resume`). What fails for this file (unreadable,
        constant, too small, a write error) is a ``failed: reason`` row, not an exception.
    """
    spec = ModelSpec.from_model(model, arch)
    if is_mask_folder(opts.get("tissue_mask")):  # this input's own mask, before its record
        try:
            opts = {**opts, "tissue_mask": str(mask_for_item(opts["tissue_mask"], item))}
        except ValueError as err:
            return [failed_row(item, None, str(err))]
    if item.source.is_symlink() and not item.source.exists():
        return [failed_row(item, None, f"{item.source} is a broken symbolic link (to "
                                       f"{os.readlink(item.source)}, which does not exist)")]
    try:
        # before reading: a file changed meanwhile is redone later
        stamp = input_stamp(item.source, item.files)
        ctx = _ItemContext(item, Path(out_dir), spec, dict(opts), figure, stamp,
                           {**run_signature(spec, opts), **_figure_kind(figure)},
                           overwrite, quiet, {},
                           before_run, geojson)  # extra: once the file is read
        whole, _ = _resume(ctx, None)
        if whole is not None:
            return [whole]
        try:
            source, info = _open(item, opts)
        except (ValueError, OSError) as err:
            return [failed_row(item, None, user_message(err))]
    except OSError as err:  # the file system refuses this input's output names: its row
        return [failed_row(item, None, _path_message(item, err))]
    # the file's kind (the image_kind option, when given, wins in the result's metadata)
    ctx = replace(ctx, extra=info.run_extra(), plane_names=info.plane_names)
    planes = source.planes() if isinstance(source, PlaneStack) else [()]
    return [_guarded_plane_row(ctx, source, index) for index in planes]


def _figure_kind(figure: Figure | None) -> dict[str, str]:
    """``{"figure": "publication"}`` or ``"overview"`` for the command line's figures, in the
    resume record: a rerun with another --figure kept the other kind's PNG, saying nothing.
    Nothing for no figure or a caller's own function (compared only where both say)."""
    name = next((n for n, f in FIGURES.items() if f is figure), None)
    return {} if name is None else {"figure": name}


def _guarded_plane_row(ctx: _ItemContext, source: PlaneStack | LazyImage,
                       index: PlaneIndex) -> Row:
    try:
        return _plane_row(ctx, source, index)
    except OSError as err:
        return failed_row(ctx.item, index or None, _path_message(ctx.item, err))


def _path_message(item: BatchItem, err: OSError) -> str:
    """An output path the file system refuses, in words that say what to change."""
    if err.errno == errno.ENAMETOOLONG:
        return (f"the output names of {item.source} would be longer than the file system "
                f"allows ({len(os.fsencode(item.relative.name))} bytes in the input's name, "
                f"plus about {len(RESULT_SUFFIX) + 24} for the outputs, against 255); rename "
                "the input to a shorter name")
    return user_message(err)


def _open(item: BatchItem, opts: dict[str, Any]) -> tuple[PlaneStack | LazyImage, ImageInfo]:
    """The input read on demand when a tiled run can take it that way (slides at their
    level), else into memory (a DICOM series: its files, once), with what the file says about
    its pixels; an untiled run of a huge image is refused from the file's header."""
    return open_for_run(item.source, opts, item.files or None)


def _plane_row(ctx: _ItemContext, source: PlaneStack | LazyImage, index: PlaneIndex) -> Row:
    """Keep, refuse or (re)do one plane's output; its summary row."""
    plane = index or None
    kept, why = _resume(ctx, plane)
    if kept is not None:
        return kept
    label = _label(ctx, plane)
    if why:
        print(f"{label}: redoing it: {why}", file=sys.stderr)
    t0 = time.perf_counter()  # wall_seconds: loading the model (first run), run, outputs
    if ctx.before_run is not None:
        ctx.before_run()
    outcome = _run(ctx, source, index, label)
    if index not in outcome.results:
        return failed_row(ctx.item, plane, outcome.errors.get(index) or outcome.message)
    result, out = outcome.results[index], output_path(ctx.out_dir, ctx.item, plane)
    kept = _users_files(ctx, out, label)
    stale = _tool_files_not_asked(ctx, out)  # read before the record is rewritten
    try:
        artefacts = _write_outputs(out, result, outcome.displays[index], ctx.figure, label,
                                   geojson=ctx.geojson or "geojson" in stale, kept=kept)
    except Exception as err:  # noqa: BLE001 - this image's outputs: report, and go on
        if not isinstance(err, (ValueError, MemoryError, OSError)):
            traceback.print_exc()  # a fault of ours (a figure's drawing): the report needs it
        return failed_row(ctx.item, plane, user_message(err))
    _retire_stale(stale, artefacts, label)
    _write_record(out, ctx.stamp, ctx.run, artefacts, kept)
    written = "".join(f"\n  -> {path}" for path in artefacts.values())
    print(f"{label}: {result.summary()}{written}")
    return {**result_row(ctx.item, plane, out, result, time.perf_counter() - t0, "done"),
            "note": why}


def _label(ctx: _ItemContext, plane: tuple[int, ...] | None) -> str:
    """``"ct, z = 12"`` where the file names its stack axes (a DICOM volume's slices), else
    ``"stack.tif plane 3-0"``; the input alone for a single image."""
    if plane is None:
        return str(ctx.item.relative)
    if ctx.plane_names and len(ctx.plane_names) == len(plane):
        return f"{ctx.item.relative}, {plane_label(plane, ctx.plane_names)}"
    return f"{ctx.item.relative} plane {'-'.join(map(str, plane))}"


def _users_files(ctx: _ItemContext, out: Path, label: str) -> dict[str, Path]:
    """The files beside ``out`` this output would replace that are not the tool's (by kind),
    each named with ``--overwrite`` on stderr; none under ``--overwrite``."""
    wanted = output_artefacts(out, ctx.figure is not None)
    if ctx.geojson:
        wanted["geojson"] = geojson_path(out)
    kept = {kind: path for kind, path in wanted.items() if kind != "result"
            and not ctx.overwrite and (path.exists() or path.is_symlink())
            and not owns(out, kind, path)}
    for path in kept.values():
        _say_kept(label, path)
    return kept


def _tool_files_not_asked(ctx: _ItemContext, out: Path) -> dict[str, Path]:
    """The files the tool wrote beside the output before (still as it wrote them) that this
    run was not asked for: left alone they would describe the old result, and the new record
    would no longer call them the tool's."""
    earlier = {"figure": output_artefacts(out, True)["figure"], "geojson": geojson_path(out)}
    asked = {"figure": ctx.figure is not None, "geojson": ctx.geojson}
    return {kind: path for kind, path in earlier.items()
            if not asked[kind] and path.is_file() and owns(out, kind, path)}


def _retire_stale(stale: dict[str, Path], written: dict[str, Path], label: str) -> None:
    """Say what became of the tool's earlier files a redo was not asked for: its GeoJSON is
    rewritten from the new result (QuPath projects point at it); a figure this run makes
    none of (``--figure none``) is removed rather than left showing the old result."""
    for kind, path in stale.items():
        if kind in written:
            print(f"{label}: rewrote {path} from the new result (napari-attnreg wrote it "
                  "for the result this one replaces)", file=sys.stderr)
            continue
        try:
            path.unlink()
        except OSError as err:
            print(f"{label}: warning: could not remove {path}, which shows the replaced "
                  f"result ({user_message(err)})", file=sys.stderr)
        else:
            print(f"{label}: removed {path}: it showed the result this one replaces, and "
                  "this run makes no figure", file=sys.stderr)


def _say_kept(label: str, path: Path) -> None:
    print(f"{label}: left {path} as it is: napari-attnreg did not write it (or it was "
          "changed since); use --overwrite to replace it", file=sys.stderr)


def _geojson_of_kept(ctx: _ItemContext, out: Path, plane: tuple[int, ...] | None) -> None:
    """``--geojson`` for a kept (current) result: written only where there is none; an
    existing one is left alone (the tool's is current; anyone else's is theirs)."""
    path = geojson_path(out)
    if path.exists() or path.is_symlink():
        if not owns(out, "geojson", path):
            _say_kept(_label(ctx, plane), path)
        return
    from napari_attnreg.core.results.result import AttentionResult
    from napari_attnreg.io.geojson import write_geojson

    try:
        write_geojson(path, AttentionResult.load(out))
        add_artefact(out, "geojson", path)
    except (ValueError, OSError) as err:
        print(f"{_label(ctx, plane)}: warning: no GeoJSON written ({user_message(err)})",
              file=sys.stderr)
        return
    print(f"{_label(ctx, plane)}: wrote {path}", file=sys.stderr)


def _run(ctx: _ItemContext, source: PlaneStack | LazyImage, index: PlaneIndex,
         label: str) -> Outcome:
    """One plane through the pipeline service, with its display image for the figure."""
    plane = "-".join(map(str, index))  # "0-3", as summary.csv names planes
    opts = dict(ctx.opts)
    if is_geojson_path(opts.get("tissue_mask")):  # QuPath's outline, placed on this image
        lazy = isinstance(source, LazyImage)  # a slide level read on demand records itself
        shape = source.analysed_shape if lazy else source.plane_shape
        placed = {**(source.run_extra() if lazy else {}), **ctx.extra}
        try:
            opts["tissue_mask"] = tissue_mask_for_run(opts["tissue_mask"], shape, placed)
        except ValueError as err:
            return Outcome(0, "failed", message=str(err))
    config = RunConfig(**opts, extra={**ctx.extra, "source": str(ctx.item.source),
                                      "plane": plane})
    with _ProgressBar(label, config.n_boot, ctx.quiet) as bar:
        return run_job_sync(Job(ctx.model, source, [index], config, keep_display=True),
                            on_progress=bar.update)


def _resume(ctx: _ItemContext, plane: tuple[int, ...] | None) -> tuple[Row | None, str]:
    """The row of an output that needs no work (kept or refused), else None and why it is
    (re)done (empty for a new output)."""
    if ctx.overwrite:
        return None, ""
    out = output_path(ctx.out_dir, ctx.item, plane)
    decision = decide(out, output_artefacts(out, ctx.figure is not None), ctx.stamp, ctx.run)
    if decision.action == "refuse":
        return failed_row(ctx.item, plane, decision.reason), ""
    if decision.action == "skip":
        kept = kept_row(ctx.item, plane, out)
        if kept is None:
            return None, "its result file is unreadable"
        if ctx.geojson:
            _geojson_of_kept(ctx, out, plane)
        return kept, ""
    return None, decision.reason


def _write_outputs(out: Path, result: Any, display: np.ndarray, figure: Figure | None,
                   label: str, *, geojson: bool = False,
                   kept: dict[str, Path] | None = None) -> dict[str, Path]:
    """The result file, then its figure and GeoJSON (each written atomically) except those
    ``kept`` (the user's files under their names); returns the artefacts written.

    The figure's title is the label and the summary line; the figure itself lists the
    result's diagnostics below it (once: the summary is taken without them)."""
    kept = kept or {}
    artefacts = output_artefacts(out, figure is not None)
    if geojson:
        artefacts["geojson"] = geojson_path(out)
    artefacts = {kind: path for kind, path in artefacts.items() if kind not in kept}
    result.save(out)
    if "figure" in artefacts:
        small, shown = figure_view(result, display)
        figure(small, shown, artefacts["figure"],
               f"{label} — {result.summary(diagnostics=False)}")
    if "geojson" in artefacts:
        from napari_attnreg.io.geojson import write_geojson

        write_geojson(artefacts["geojson"], result)
    return artefacts


def _write_record(out: Path, stamp: dict[str, Any], run: dict[str, Any],
                  artefacts: dict[str, Path], kept: dict[str, Path] | None = None) -> None:
    """The resume record, last; not writing it only means the output is redone next time."""
    try:
        write_record(out, stamp, run, artefacts, kept)
    except OSError as err:
        print(f"attnreg: warning: no resume record for {out} ({err.strerror or err}); a "
              "resumed batch will redo it.", file=sys.stderr)


class _ProgressBar:
    """tqdm over the forward passes of one image on stderr, or nothing when quiet."""

    def __init__(self, label: str, total: int, quiet: bool) -> None:
        self.bar = None
        if not quiet:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="img", file=sys.stderr)

    def update(self, step: JobProgress) -> None:
        """Show one service progress step (the model-loading step has no engine event)."""
        event = step.event
        if self.bar is None or event is None:
            return
        self.bar.total = event.total
        self.bar.n = event.done
        self.bar.set_postfix_str(f"chunk {event.chunk_size}")
        self.bar.refresh()

    def __enter__(self) -> _ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def run_batch(items: Sequence[BatchItem], out_dir: str | Path, model: Any, arch: str | None,
              opts: dict[str, Any], *, overwrite: bool = False, quiet: bool = False,
              figure: Figure | None = None, workers: int | None = None,
              scheduler: str | None = None,
              on_model: Callable[[Backbone], Any] | None = None,
              geojson: bool = False) -> BatchReport:
    """Process every item, serially or on Dask (``workers`` local processes or ``scheduler``).

    Parameters are those of :func:`process_item`, ``workers`` / ``scheduler`` for a Dask run
    (:func:`~napari_attnreg.batch.distributed.run_on_dask`), and ``on_model``, called with
    the model when a serial batch loads it (only when some output needs computing).

    Returns
    -------
    BatchReport
        Also written to ``out_dir/summary.csv`` (after every image, so a killed batch
        leaves a summary of what it finished).

    Raises
    ------
    ValueError
        An option, the device (serial runs), the output folder or the Dask setup is wrong,
        or another batch is writing into the output folder, checked before any image; or
        the model's patch does not fit the target size, found when the model loads.
    BackboneError
        The model cannot be loaded (serial runs; a Dask worker reports it per image).
    """
    distributed = bool(workers or scheduler)
    check_run(opts, device=not distributed)  # everyone's error: say it once, before any work
    check_workers(workers)
    if distributed:
        check_dask()
    out_dir = prepare_output_dir(out_dir).resolve()
    with FolderLock(out_dir):  # a second batch into this folder is refused until this ends
        return _run_locked(items, out_dir, model, arch, opts, overwrite=overwrite, quiet=quiet,
                           figure=figure, workers=workers, scheduler=scheduler,
                           on_model=on_model, geojson=geojson)


def _run_locked(items: Sequence[BatchItem], out_dir: Path, model: Any, arch: str | None,
                opts: dict[str, Any], *, overwrite: bool, quiet: bool, figure: Figure | None,
                workers: int | None, scheduler: str | None,
                on_model: Callable[[Backbone], Any] | None, geojson: bool) -> BatchReport:
    distributed = bool(workers or scheduler)
    summary = SummaryFile(out_dir / "summary.csv")
    settings = {"overwrite": overwrite, "quiet": quiet, "figure": figure, "geojson": geojson}
    per_item: Iterable[list[Row]]
    if distributed:
        per_item = run_on_dask(process_item, items, out_dir, model, arch, opts, **settings,
                               workers=workers, scheduler=scheduler)
    else:
        first_use = ModelOnFirstUse(ModelSpec.from_model(model, arch), opts, on_model)
        per_item = (process_item(item, out_dir, model, arch, opts, **settings,
                                 before_run=first_use) for item in items)
    for rows in per_item:
        summary.add(rows)
    return BatchReport(summary.rows, summary.path)
