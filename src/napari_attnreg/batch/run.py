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
rest, saying why.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from napari_attnreg.batch.distributed import check_workers, run_on_dask
from napari_attnreg.batch.figure import figure_view
from napari_attnreg.batch.items import BatchItem, output_artefacts, output_path, prepare_output_dir
from napari_attnreg.batch.resume import decide, input_stamp, run_signature, write_record
from napari_attnreg.batch.summary import (
    BatchReport,
    Row,
    SummaryFile,
    failed_row,
    kept_row,
    result_row,
)
from napari_attnreg.core.run.engine import RunConfig
from napari_attnreg.core.run.planes import PlaneIndex, PlaneStack
from napari_attnreg.core.run.service import (
    Job,
    JobProgress,
    ModelSpec,
    Outcome,
    load_model,
    run_job_sync,
    user_message,
)
from napari_attnreg.io.readers import read_lazy, read_stack

if TYPE_CHECKING:
    from napari_attnreg.core.run.lazy import LazyImage

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


def process_item(item: BatchItem, out_dir: Path, model: Any, arch: str | None,
                 opts: dict[str, Any], *, overwrite: bool = False, quiet: bool = True,
                 figure: Figure | None = None) -> list[Row]:
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

    Returns
    -------
    list of dict
        One summary row per plane. Complete results of this input made with these options
        are kept (``skipped (exists)``) unless ``overwrite``; incomplete or different ones
        are redone, saying why (:mod:`.resume`). What fails for this file (unreadable,
        constant, too small, a write error) is a ``failed: reason`` row, not an exception.
    """
    spec = ModelSpec.from_model(model, arch)
    backbone = load_model(spec)  # its weights identify the run, on any worker
    stamp = input_stamp(item.source)  # before reading: a file changed meanwhile is redone later
    ctx = _ItemContext(item, Path(out_dir), spec, dict(opts), figure, stamp,
                       run_signature(backbone, opts), overwrite, quiet)
    whole, _ = _resume(ctx, None)
    if whole is not None:
        return [whole]
    try:
        source = _open(item.source, opts)
    except (ValueError, OSError) as err:
        return [failed_row(item, None, user_message(err))]
    planes = source.planes() if isinstance(source, PlaneStack) else [()]
    return [_plane_row(ctx, source, index) for index in planes]


def _open(path: Path, opts: dict[str, Any]) -> PlaneStack | LazyImage:
    """The input read on demand when a tiled run can take it that way, else into memory."""
    lazy_ok = opts.get("tiled") and opts.get("tile_scale", 1.0) == 1 and all(
        opts.get(k) is None for k in ("channels", "merge", "channel_axis"))
    lazy = read_lazy(path) if lazy_ok else None
    return lazy if lazy is not None else read_stack(path, opts.get("channel_axis"))


def _plane_row(ctx: _ItemContext, source: PlaneStack | LazyImage, index: PlaneIndex) -> Row:
    """Keep, refuse or (re)do one plane's output; its summary row."""
    plane = index or None
    kept, why = _resume(ctx, plane)
    if kept is not None:
        return kept
    label = str(ctx.item.relative) + ("" if plane is None else f" plane {plane}")
    if why:
        print(f"{label}: redoing it: {why}", file=sys.stderr)
    t0 = time.perf_counter()
    outcome = _run(ctx, source, index, label)
    if index not in outcome.results:
        return failed_row(ctx.item, plane, outcome.errors.get(index) or outcome.message)
    result, out = outcome.results[index], output_path(ctx.out_dir, ctx.item, plane)
    try:
        artefacts = _write_outputs(out, result, outcome.displays[index], ctx.figure,
                                   f"{label} — ")
    except (ValueError, MemoryError, OSError) as err:  # this image's outputs: report, go on
        return failed_row(ctx.item, plane, user_message(err))
    _write_record(out, ctx.stamp, ctx.run, artefacts)
    print(f"{label}: {result.summary()}\n  -> {out}")
    return {**result_row(ctx.item, plane, out, result, time.perf_counter() - t0, "done"),
            "note": why}


def _run(ctx: _ItemContext, source: PlaneStack | LazyImage, index: PlaneIndex,
         label: str) -> Outcome:
    """One plane through the pipeline service, with its display image for the figure."""
    plane = "-".join(map(str, index))  # "0-3", as summary.csv names planes
    config = RunConfig(**ctx.opts, extra={"source": str(ctx.item.source), "plane": plane})
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
        return (kept, "") if kept is not None else (None, "its result file is unreadable")
    return None, decision.reason


def _write_outputs(out: Path, result: Any, display: np.ndarray, figure: Figure | None,
                   title: str) -> dict[str, Path]:
    """The result file, then its figure (each written atomically); returns the artefacts."""
    artefacts = output_artefacts(out, figure is not None)
    result.save(out)
    if figure is not None:
        small, shown = figure_view(result, display)
        figure(small, shown, artefacts["figure"], title + result.summary())
    return artefacts


def _write_record(out: Path, stamp: dict[str, Any], run: dict[str, Any],
                  artefacts: dict[str, Path]) -> None:
    """The resume record, last; not writing it only means the output is redone next time."""
    try:
        write_record(out, stamp, run, artefacts)
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
              scheduler: str | None = None) -> BatchReport:
    """Process every item, serially or on Dask (``workers`` local processes or ``scheduler``).

    Parameters are those of :func:`process_item`, and ``workers`` / ``scheduler`` for a
    Dask run (:func:`~napari_attnreg.batch.distributed.run_on_dask`).

    Returns
    -------
    BatchReport
        Also written to ``out_dir/summary.csv`` (after every image, so a killed batch
        leaves a summary of what it finished).

    Raises
    ------
    ValueError
        An option, the output folder or the Dask setup is wrong; checked before any image.
    """
    RunConfig(**opts).validate()  # an option error is everyone's error: fail before any work
    check_workers(workers)
    out_dir = prepare_output_dir(out_dir).resolve()
    if not (workers or scheduler):  # a size below one patch is wrong for every image too
        from napari_attnreg.core.run.images import check_target_size

        patch = load_model(ModelSpec.from_model(model, arch)).patch_size
        check_target_size(opts.get("target_size", "model"), patch)
    summary = SummaryFile(out_dir / "summary.csv")
    settings = {"overwrite": overwrite, "quiet": quiet, "figure": figure}
    per_item: Iterable[list[Row]]
    if workers or scheduler:
        per_item = run_on_dask(process_item, items, out_dir, model, arch, opts, **settings,
                               workers=workers, scheduler=scheduler)
    else:
        per_item = (process_item(item, out_dir, model, arch, opts, **settings) for item in items)
    for rows in per_item:
        summary.add(rows)
    return BatchReport(summary.rows, summary.path)
