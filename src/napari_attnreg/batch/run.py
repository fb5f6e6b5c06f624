"""Batches of image files: inputs, collision-free output names, resume, summary.csv.

:func:`collect_inputs` turns files, folders and glob patterns into :class:`BatchItem` s whose
``relative`` path (to the common parent of all inputs) names their outputs, so two inputs
never write the same file. :func:`process_item` runs one file (every plane of a stack) and
writes its results; :func:`run_batch` runs them all, serially or one task per image on a
Dask cluster (:mod:`.distributed`), and writes ``summary.csv`` (merged with the rows of
earlier runs into the same folder). A file that fails, including any file a decoder cannot
read, is reported with its reason and the batch goes on. Every output is written atomically
and recorded last in a resume record (:mod:`.resume`), so a rerun skips exactly the
complete outputs of unchanged inputs and options and redoes the rest, saying why.
"""

from __future__ import annotations

import csv
import fnmatch
import glob
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.core.files import PARTIAL_MARK, atomic_write, decoding

IMAGE_SUFFIXES = (".tif", ".tiff", ".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
RESULT_SUFFIX = ".attnreg.npz"
FIGURE_SUFFIX = ".attnreg.png"
SUMMARY_COLUMNS = ("source", "plane", "output", "model", "preset", "B", "seed", "grid", "pi0",
                   "tokens_significant", "fraction_significant", "seconds", "status",
                   # how each result was made (io.export.provenance), after the summary
                   "weights", "weights_sha256", "rule", "q_th", "p_th", "l_th", "z_th",
                   "method", "null_pool", "pi0_method", "device", "package_version",
                   "note")  # why an existing output was redone
FIGURE_MAX_SIDE = 1024  # figures are for looking at; the result files keep full resolution


@dataclass(frozen=True)
class BatchItem:
    """One input file: where it is and the path its outputs are named after."""

    source: Path
    relative: Path


def _is_zarr(path: Path) -> bool:
    """An OME-Zarr image is a folder, named ``*.zarr``."""
    return path.suffix.lower() == ".zarr" and path.is_dir()


def _is_glob(text: str) -> bool:
    return any(ch in text for ch in "*?[")


def collect_inputs(inputs: Sequence[str | Path], *, recursive: bool = False,
                   exclude: str | Path | None = None) -> list[BatchItem]:
    """Files, folders (their image files; ``recursive`` descends) and glob patterns → items.

    A path that does not exist is kept, so that it is reported as a failed input. Outputs
    are named by the path relative to the common parent folder of all inputs. Files that a
    folder or a pattern finds inside ``exclude`` (the output folder) are left out: a batch
    never analyses its own figures. A file named explicitly is always an input.

    Raises
    ------
    ValueError
        When nothing at all was found.
    """
    found: list[Path] = []
    named: set[Path] = set()
    for entry in inputs:
        text = str(entry)
        if _is_glob(text) and not Path(text).exists():
            found += [p for p in _glob(text, recursive) if p.is_file() or _is_zarr(p)]
        elif Path(text).is_dir() and not _is_zarr(Path(text)):
            walk = _walk(Path(text)) if recursive else Path(text).iterdir()
            found += sorted(p for p in walk if _is_zarr(p) or (
                p.is_file() and p.name.lower().endswith(IMAGE_SUFFIXES)
                and not (p.name.startswith(".") and PARTIAL_MARK in p.name)))  # killed writes
        else:
            found.append(Path(text))
            named.add(Path(text).resolve())
    unique = list(dict.fromkeys(p.resolve() for p in found))
    if exclude is not None:
        skip = Path(exclude).resolve()
        unique = [p for p in unique if p in named or (skip != p and skip not in p.parents)]
    if not unique:
        raise ValueError(f"No image files found in {', '.join(map(str, inputs))}; give files, "
                         "folders (with --recursive for subfolders) or glob patterns (files in "
                         "the output folder are not inputs).")
    parent = Path(os.path.commonpath([str(p.parent) for p in unique]))
    return [BatchItem(p, p.relative_to(parent)) for p in unique]


def _walk(root: Path) -> Iterator[Path]:
    """Every file and ``.zarr`` folder below ``root``, following links to folders but entering
    each real folder once: a symlink loop (``sub/up -> ..``) ends instead of recursing until
    the path is too long, and a folder linked twice is listed once."""
    seen: set[tuple[int, int]] = set()
    for folder, dirs, files in os.walk(root, followlinks=True):
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        here = Path(folder)
        zarrs = [d for d in dirs if d.lower().endswith(".zarr")]
        dirs[:] = sorted(d for d in dirs if d not in zarrs)  # an OME-Zarr is one image
        yield from (here / name for name in [*zarrs, *files])


def _glob(pattern: str, recursive: bool) -> list[Path]:
    """Paths matching ``pattern``; ``**`` (with ``recursive``) walks by :func:`_walk`, since
    :func:`glob.glob` follows symlink loops into an exponential number of paths."""
    parts = Path(pattern).parts
    if not (recursive and "**" in parts):
        return [Path(m) for m in sorted(glob.glob(pattern))]
    fixed = next(i for i, part in enumerate(parts) if _is_glob(part))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    wanted = parts[fixed:]
    return sorted(p for p in _walk(root) if _matches(wanted, p.relative_to(root).parts))


def _matches(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """Glob match by path components: ``**`` is any number of folders; like glob, wildcards
    do not match names starting with a dot."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_matches(rest, parts[i:]) for i in range(len(parts) + 1)
                   if not any(p.startswith(".") for p in parts[:i]))
    if not parts or (parts[0].startswith(".") and not head.startswith(".")):
        return False
    return fnmatch.fnmatchcase(parts[0], head) and _matches(rest, parts[1:])


def output_path(out_dir: Path, item: BatchItem, plane: tuple[int, ...] | None) -> Path:
    """``OUT/rel/name.ext.attnreg.npz`` for an image; ``OUT/rel/name.ext/plane_0003.attnreg.npz``
    for plane 3 of a stack. File names keep their extension and plane outputs live in a
    folder named after the whole file name, so no two inputs or planes share an output."""
    if plane is None:
        return out_dir / item.relative.parent / (item.relative.name + RESULT_SUFFIX)
    name = "plane_" + "_".join(f"{i:04d}" for i in plane)
    return out_dir / item.relative / (name + RESULT_SUFFIX)


def read_stack(path: Path, channel_axis: int | None = None) -> Any:
    """An image file as a :class:`~napari_attnreg.core.run.planes.PlaneStack`.

    The layout comes from the file where it says so (a TIFF's ImageJ/OME/tifffile axes, an
    animated GIF's frames), else from the shape by the PlaneStack rules; ``channel_axis``
    (``--channel-axis``) overrides both.

    Raises
    ------
    ValueError
        The file is missing or not a readable image (the message names it), or its layout is
        ambiguous (the message says how to choose).
    """
    from napari_attnreg.core.run.planes import PlaneStack

    path = Path(path)
    data, hints = _read_with_layout(path)
    if channel_axis is not None:
        hints = {"channel_axis": channel_axis}
    try:
        return PlaneStack.from_array(data, **hints)
    except ValueError as err:  # an empty or odd layout: say which file has it
        raise ValueError(f"{path}: {err}") from None


def read_image(path: Path) -> np.ndarray:
    """Read a TIFF (tifffile), an OME-Zarr folder (zarr) or any format imageio knows.

    Raises
    ------
    ValueError
        The file is missing or not a readable image; the message names it.
    """
    return np.asarray(_read_with_layout(Path(path))[0])


def _read_with_layout(path: Path) -> tuple[Any, dict[str, Any]]:
    """The pixels and the layout the file itself states (``PlaneStack.from_array`` keywords)."""
    if _is_zarr(path):
        from napari_attnreg.core.run.lazy import open_lazy

        return open_lazy(path).read(slice(None), slice(None)), {}
    if not path.is_file():
        raise ValueError(f"No such image file: {path}")
    if path.suffix.lower() in (".tif", ".tiff"):
        return _read_tiff(path)
    import imageio.v3 as iio

    with decoding(path):  # whatever Pillow/imageio raise on these bytes is this file's error
        frames = iio.improps(path).is_batch
        data = iio.imread(path)
    if frames and data.ndim >= 3:  # an animated GIF/WebP: frames are planes, colours stay whole
        if data.shape[0] == 1:
            return data[0], {}
        return data, {"channel_last": True} if data.ndim == 4 else {"rgb": False}
    return data, {}


def _read_tiff(path: Path) -> tuple[np.ndarray, dict[str, Any]]:
    import tifffile

    from napari_attnreg.core.run.planes import layout_from_axes

    with decoding(path), tifffile.TiffFile(path) as tif:
        if not tif.series:
            raise ValueError("the TIFF holds no image")
        series = tif.series[0]
        data, axes = series.asarray(), series.axes
    return data, layout_from_axes(axes)  # ours: outside the decoding boundary


def planes(image: Any, channel_axis: int | None) -> list[tuple[tuple[int, ...] | None, np.ndarray]]:
    """Split an image file's array into planes (None for a single image), by the rules of
    :class:`~napari_attnreg.core.run.planes.PlaneStack`; RGB(A) and channel images stay whole."""
    from napari_attnreg.core.run.planes import PlaneStack

    stack = PlaneStack.from_array(image, channel_axis=channel_axis)
    return [(index or None, stack.read(index)[0]) for index in stack.planes()]


def cached_backbone(model: Any, arch: str | None = None) -> Any:
    """The backbone for a model spec, from the pipeline service's model cache (one model per
    process: a Dask worker keeps the one it loaded for the next image)."""
    from napari_attnreg.core.models.backbones import Backbone
    from napari_attnreg.core.run.service import ModelSpec, load_model

    if isinstance(model, Backbone):
        return model
    return load_model(ModelSpec.from_model(model, arch))


def figure_view(result: Any, display: np.ndarray,
                max_side: int = FIGURE_MAX_SIDE) -> tuple[Any, np.ndarray]:
    """A result and display image at figure resolution (long side ≤ ``max_side``).

    The result keeps its token maps; only ``image_shape`` shrinks, so ``to_pixels`` gives
    maps at the display's size, aligned with it exactly. A 10000² input then never needs
    full-size float64 maps for a PNG.
    """
    h0, w0 = display.shape[:2]
    factor = max(h0, w0) / max_side
    if factor <= 1:
        return result, display
    h, w = max(1, round(h0 / factor)), max(1, round(w0 / factor))
    # pixel-centre sampling over the whole extent, so the geometry stays exact
    rows = ((np.arange(h) + 0.5) * h0 / h).astype(np.int64)
    cols = ((np.arange(w) + 0.5) * w0 / w).astype(np.int64)
    return replace(result, image_shape=(h, w)), display[rows][:, cols]


def _row(item: BatchItem, plane: tuple[int, ...] | None, out: Path, result: Any, seconds: float,
         status: str) -> dict[str, Any]:
    from napari_attnreg.io.export import provenance

    sig = result.significant()
    md = result.metadata
    made = provenance(md, source=str(item.source), thresholds=result.thresholds)
    return {**{k: made.get(k) for k in SUMMARY_COLUMNS if k in made}, **{
        "source": str(item.source), "plane": "" if plane is None else "-".join(map(str, plane)),
        "output": str(out), "model": md.get("model", ""), "preset": result.preset,
        "B": md.get("n_boot", ""), "seed": md.get("seed", ""),
        "grid": f"{result.grid_shape[0]}x{result.grid_shape[1]}", "pi0": f"{result.pi0:.10g}",
        "tokens_significant": int(sig.sum()), "fraction_significant": f"{sig.mean():.10g}",
        "seconds": f"{seconds:.3f}", "status": status,
    }}


def _failed_row(item: BatchItem, plane: tuple[int, ...] | None, reason: str) -> dict[str, Any]:
    row = dict.fromkeys(SUMMARY_COLUMNS, "")
    row.update(source=str(item.source), status=f"failed: {reason}",
               plane="" if plane is None else "-".join(map(str, plane)))
    return row


def process_item(item: BatchItem, out_dir: Path, model: Any, arch: str | None,
                 opts: dict[str, Any], *, overwrite: bool = False, quiet: bool = True,
                 figure: Callable[..., Any] | None = None) -> list[dict[str, Any]]:
    """Run every plane of one file and write its results; one summary row per plane.

    Complete results of this input made with these options are kept (status ``skipped``)
    unless ``overwrite``; incomplete or different ones are redone, saying why
    (:mod:`.resume`). Errors of this file (unreadable, constant, too small, ...) become a
    ``failed: reason`` row instead of stopping the batch; errors of the model or the
    options propagate.
    """
    from napari_attnreg.batch.resume import input_stamp, run_signature

    backbone = cached_backbone(model, arch)  # its weights identify the run, on any worker
    run = run_signature(backbone, opts)
    stamp = input_stamp(item.source)  # before reading: a file changed meanwhile is redone later
    single = output_path(out_dir, item, None)
    early, _ = _resume(item, None, single, figure, stamp, run, overwrite)
    if early is not None:
        return [early]
    try:
        lazy = _lazy_input(item.source, opts)
        stack = None if lazy is not None else read_stack(item.source, opts.get("channel_axis"))
    except (ValueError, OSError) as err:
        return [_failed_row(item, None, str(err))]
    rows = []
    for index in stack.planes() if stack is not None else [()]:
        plane = index or None
        out = output_path(out_dir, item, plane)
        kept, why = _resume(item, plane, out, figure, stamp, run, overwrite)
        if kept is not None:
            rows.append(kept)
            continue
        label = str(item.relative) + ("" if plane is None else f" plane {plane}")
        if why:
            print(f"{label}: redoing it: {why}", file=sys.stderr)
        t0 = time.perf_counter()
        try:
            result, display = _run_plane(item, plane, index, stack, lazy, backbone, opts, label,
                                         quiet)
            artefacts = _write_outputs(out, result, display, figure, f"{label} — ")
        except (ValueError, MemoryError, OSError) as err:  # this image's fault: report, go on
            rows.append(_failed_row(item, plane, _plain_message(err)))
            continue
        _write_record(out, stamp, run, artefacts)
        print(f"{label}: {result.summary()}\n  -> {out}")
        rows.append({**_row(item, plane, out, result, time.perf_counter() - t0, "done"),
                     "note": why})
    return rows


def _run_plane(item: BatchItem, plane: tuple[int, ...] | None, index: tuple[int, ...],
               stack: Any, lazy: Any, backbone: Any, opts: dict[str, Any], label: str,
               quiet: bool) -> tuple[Any, np.ndarray]:
    """One plane's result and its display image (what the figure shows)."""
    from napari_attnreg.core.run.engine import RunConfig, drain, run_engine

    data, channel_axis = (lazy, opts.get("channel_axis")) if stack is None \
        else stack.read(index)
    config = RunConfig(**{**opts, "channel_axis": channel_axis},
                       extra={"source": str(item.source),
                              "plane": "" if plane is None else "-".join(map(str, plane))})
    prepared = _prepare(data, backbone, config)
    del data  # a large plane's raw pixels are freed once it is prepared
    with _progress_bar(config, label, quiet) as tick:
        result = drain(run_engine(prepared, backbone, config), tick)
    return result, prepared.display


def _artefacts(out: Path, figure: Callable[..., Any] | None) -> dict[str, Path]:
    """Every file of one output, by kind: the result and, when figures are made, its PNG."""
    found = {"result": out}
    if figure is not None:
        found["figure"] = out.with_name(out.name[: -len(RESULT_SUFFIX)] + FIGURE_SUFFIX)
    return found


def _write_outputs(out: Path, result: Any, display: np.ndarray,
                   figure: Callable[..., Any] | None, title: str) -> dict[str, Path]:
    """The result file, then its figure (each written atomically); returns the artefacts."""
    artefacts = _artefacts(out, figure)
    result.save(out)
    if figure is not None:
        small, shown = figure_view(result, display)
        figure(small, shown, artefacts["figure"], title + result.summary())
    return artefacts


def _write_record(out: Path, stamp: dict[str, Any], run: dict[str, Any],
                  artefacts: dict[str, Path]) -> None:
    """The resume record, last; not writing it only means the output is redone next time."""
    from napari_attnreg.batch.resume import write_record

    try:
        write_record(out, stamp, run, artefacts)
    except OSError as err:
        print(f"attnreg: warning: no resume record for {out} ({err.strerror or err}); a "
              "resumed batch will redo it.", file=sys.stderr)


def _resume(item: BatchItem, plane: tuple[int, ...] | None, out: Path,
            figure: Callable[..., Any] | None, stamp: dict[str, Any], run: dict[str, Any],
            overwrite: bool) -> tuple[dict[str, Any] | None, str]:
    """The row of an output that needs no work (kept or refused), else None and why it is
    (re)done (empty for a new output)."""
    from napari_attnreg.batch.resume import decide

    if overwrite:
        return None, ""
    decision = decide(out, _artefacts(out, figure), stamp, run)
    if decision.action == "refuse":
        return _failed_row(item, plane, decision.reason), ""
    if decision.action == "skip":
        kept = _skipped(item, plane, out)
        return (kept, "") if kept is not None else (None, "its result file is unreadable")
    return None, decision.reason


def _plain_message(err: BaseException) -> str:
    """The row's reason: the core's advice, or the OS error itself (there is no log file)."""
    from napari_attnreg.core.run.service import user_message

    if isinstance(err, OSError) and not isinstance(err, MemoryError):
        return f"cannot write or read a file ({err.strerror or err}: {err.filename or ''})"
    return user_message(err)


def _lazy_input(path: Path, opts: dict[str, Any]) -> Any:
    """The image opened for reading on demand, when a tiled run can use that; else None."""
    if not opts.get("tiled") or opts.get("tile_scale", 1.0) != 1 or any(
            opts.get(k) is not None for k in ("channels", "merge", "channel_axis")):
        return None
    if not (_is_zarr(path) or path.is_file() and path.suffix.lower() in (".tif", ".tiff")):
        return None
    from napari_attnreg.core.run.lazy import open_lazy

    try:
        with decoding(path):  # a damaged file is then reported by read_stack, in memory
            return open_lazy(path)
    except ValueError:  # a stack, or zarr not installed: read into memory as before
        return None


def _skipped(item: BatchItem, plane: tuple[int, ...] | None, out: Path) -> dict[str, Any] | None:
    """The row of a kept result, or None when the file cannot be read (then it is redone)."""
    from napari_attnreg.core.results.result import AttentionResult

    try:
        result = AttentionResult.load(out)
    except (ValueError, OSError):
        return None
    timings = result.metadata.get("timings")
    seconds = timings.get("total_s", float("nan")) if isinstance(timings, dict) else float("nan")
    return _row(item, plane, out, result, seconds, "skipped (exists)")


def _prepare(data: np.ndarray, backbone: Any, config: Any) -> Any:
    if config.tiled:
        from napari_attnreg.core.run.tiled_engine import prepare_tiled

        return prepare_tiled(data, backbone, config.resolved())
    from napari_attnreg.core.run.images import prepare_image

    return prepare_image(data, patch_size=backbone.patch_size, mean=backbone.mean,
                         std=backbone.std, default_size=backbone.input_size[1:],
                         target_size=config.target_size, channel_axis=config.channel_axis,
                         channels=config.channels, merge=config.merge)


class _progress_bar:
    """tqdm over the forward passes of one image, or nothing when quiet."""

    def __init__(self, config: Any, label: str, quiet: bool) -> None:
        self.bar = None
        if not quiet:
            from tqdm import tqdm

            self.bar = tqdm(total=config.n_boot, desc=label, unit="img", file=sys.stderr)

    def __enter__(self) -> Callable[[Any], None]:
        def tick(event: Any) -> None:
            if self.bar is not None:
                self.bar.total = event.total
                self.bar.n = event.done
                self.bar.set_postfix_str(f"chunk {event.chunk_size}")
                self.bar.refresh()
        return tick

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def prepare_output_dir(out_dir: str | Path) -> Path:
    """Create the output folder (and parents) and check that files can be written in it.

    Called before any image is read, so a wrong ``--out`` fails at once.

    Raises
    ------
    ValueError
        ``out_dir`` is an existing file, cannot be created, or is not writable.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"The output folder {out_dir} is an existing file; give --out a folder "
                         "path (it is created if missing).")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):  # permissions, read-only mounts, quotas
            pass
    except OSError as err:
        raise ValueError(f"Cannot write results into {out_dir} ({err.strerror or err}); give "
                         "--out a folder you can write to.") from None
    return out_dir


def write_summary(rows: Iterable[dict[str, Any]], path: Path) -> Path:
    """``summary.csv``: one row per image/plane, written whole (atomically) each time.

    Raises
    ------
    ValueError
        The file cannot be written (a full disk, say); no partial file is left behind.
    """
    try:
        with atomic_write(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=SUMMARY_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    except OSError as err:
        raise ValueError(f"Cannot write {path} ({err.strerror or err}); the results written so "
                         "far are kept, and a rerun after freeing space skips them.") from None
    return path


def earlier_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an existing ``summary.csv`` (earlier runs into the same folder), if any."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return [{k: row.get(k) or "" for k in SUMMARY_COLUMNS} for row in csv.DictReader(fh)
                    if row.get("source")]
    except (OSError, UnicodeDecodeError, csv.Error):  # none, or not ours: start afresh
        return []


class _Summary:
    """``summary.csv`` of this run merged with the rows of earlier runs into the same folder:
    an earlier row is dropped only once this run has reported the same input or output, so
    a batch killed halfway still lists what earlier runs finished."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.earlier = earlier_rows(path)
        self.rows: list[dict[str, Any]] = []

    def add(self, rows: list[dict[str, Any]]) -> None:
        self.rows += rows
        _report_failures(rows)
        sources = {r["source"] for r in self.rows}
        outputs = {r["output"] for r in self.rows if r.get("output")}
        kept = [r for r in self.earlier
                if r["source"] not in sources and (not r["output"] or r["output"] not in outputs)]
        write_summary(kept + self.rows, self.path)


@dataclass
class BatchReport:
    """Rows of ``summary.csv`` and the number of failed images/planes."""

    rows: list[dict[str, Any]]
    summary: Path

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if str(r["status"]).startswith("failed")]


def run_batch(items: Sequence[BatchItem], out_dir: Path, model: Any, arch: str | None,
              opts: dict[str, Any], *, overwrite: bool = False, quiet: bool = False,
              figure: Callable[..., Any] | None = None, workers: int | None = None,
              scheduler: str | None = None) -> BatchReport:
    """Process every item, serially or on Dask (``workers`` local processes or ``scheduler``).

    Returns
    -------
    BatchReport
        Also written to ``out_dir/summary.csv`` (after every image, so a killed batch
        leaves a summary of what it finished).
    """
    from napari_attnreg.batch.distributed import check_workers
    from napari_attnreg.core.run.engine import RunConfig

    RunConfig(**opts).validate()  # an option error is everyone's error: fail before any work
    check_workers(workers)
    out_dir = prepare_output_dir(out_dir).resolve()
    if not (workers or scheduler):  # a size below one patch is wrong for every image too
        from napari_attnreg.core.run.images import check_target_size

        check_target_size(opts.get("target_size", "model"), cached_backbone(model, arch).patch_size)
    summary = _Summary(out_dir / "summary.csv")
    if workers or scheduler:
        from napari_attnreg.batch.distributed import run_on_dask

        for item_rows in run_on_dask(items, out_dir, model, arch, opts, overwrite=overwrite,
                                     quiet=quiet, figure=figure, workers=workers,
                                     scheduler=scheduler):
            summary.add(item_rows)
    else:
        for item in items:
            summary.add(process_item(item, out_dir, model, arch, opts, overwrite=overwrite,
                                     quiet=quiet, figure=figure))
    return BatchReport(summary.rows, summary.path)


def _report_failures(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        if str(row["status"]).startswith("failed"):
            plane = f" (plane {row['plane']})" if row["plane"] else ""
            print(f"attnreg: error: {row['source']}{plane}: {row['status'][len('failed: '):]}",
                  file=sys.stderr)
