"""``summary.csv``: one row per image or plane, saying what was done, kept or why it failed.

Rows come from results (:func:`result_row`, :func:`kept_row`) or from failures
(:func:`failed_row`, whose reason is :func:`~napari_attnreg.core.run.service.user_message`'s
line). :class:`SummaryFile` rewrites the file whole and atomically after every input,
merged with the rows of earlier runs into the same folder, so a killed batch leaves a
summary of everything finished so far. :class:`FolderLock` keeps a second batch from writing
into the same folder meanwhile (two rewriters would each drop the other's rows).
"""

from __future__ import annotations

import contextlib
import csv
import os
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from napari_attnreg.batch.items import BatchItem
from napari_attnreg.core.files import atomic_write

SUMMARY_COLUMNS = ("source", "plane", "output", "model", "preset", "B", "seed", "grid", "pi0",
                   "tokens_significant", "fraction_significant", "p_map", "map",
                   # the model's work (what the terminal line's "s on cpu" says), and the
                   # wall time: model loading (first run), the run, writing the result and figure
                   "compute_seconds", "wall_seconds", "status",
                   # how each result was made (io.export.provenance), after the summary
                   "weights", "weights_sha256",
                   # which part of the model the map reads: without them a --layer run's
                   # rows could not be told from a default run's in one folder's summary
                   "layer", "head", "target", "exclude_sinks",
                   "rule", "q_th", "p_th", "l_th", "z_th", "method", "null_pool", "pi0_method",
                   "device", "package_version",
                   "warnings",  # codes of the result's warning diagnostics, e.g. off_domain
                   "note")  # why an existing output was redone
#: Columns earlier versions wrote that are gone (their rows are still read on resume).
EARLIER_COLUMNS = ("seconds",)
Row = dict[str, Any]


def _plane_text(plane: tuple[int, ...] | None) -> str:
    return "" if plane is None else "-".join(map(str, plane))


def result_row(item: BatchItem, plane: tuple[int, ...] | None, out: Path, result: Any,
               seconds: float | None, status: str) -> Row:
    """The row of a result: what it found and how it was made (its provenance).

    ``seconds`` is the wall time this batch spent on the input (None for a kept result);
    ``compute_seconds`` is the result's own time, which its summary line prints."""
    from napari_attnreg.core.results.display import tissue_tokens
    from napari_attnreg.io.export import provenance

    sig = result.significant()
    # the share of the patches tested: glass a tissue mask left out was never run
    tested = tissue_tokens(result)
    n_tested = sig.size if tested is None else int(tested.sum())
    md = result.metadata
    timings = md.get("timings")
    compute = timings.get("total_s") if isinstance(timings, dict) else None
    made = provenance(md, source=str(item.source), thresholds=result.thresholds)
    return {**{k: made.get(k) for k in SUMMARY_COLUMNS if k in made}, **{
        "source": str(item.source), "plane": _plane_text(plane),
        "output": str(out), "model": md.get("model", ""), "preset": result.preset,
        "B": md.get("n_boot", ""), "seed": md.get("seed", ""),
        "grid": f"{result.grid_shape[0]}x{result.grid_shape[1]}", "pi0": f"{result.pi0:.10g}",
        "tokens_significant": int(sig.sum()),
        "fraction_significant": f"{int(sig.sum()) / max(n_tested, 1):.10g}",
        "p_map": "" if result.p_map is None else f"{result.p_map:.6g}",
        "map": md.get("map") or "attention", **_map_reads(md),
        "compute_seconds": "" if compute is None else f"{float(compute):.3f}",
        "wall_seconds": "" if seconds is None else f"{seconds:.3f}", "status": status,
        "warnings": ";".join(dict.fromkeys(d.code for d in result.diagnostics
                                           if d.severity == "warning")),
    }}


def _map_reads(md: dict[str, Any]) -> Row:
    """The layer and head (``all`` for the heads map) of a map made of one block's CLS
    attention, the target of a class map (``concept``, or the class index it scored), and
    whether sinks were left out; empty where the map does not use them (rollout reads
    every layer)."""
    name = md.get("map") or "attention"
    one_block = name in ("attention", "heads")
    return {"layer": md.get("layer", "") if one_block else "",
            # the heads map tests every head on its own, whatever --head says
            "head": md.get("head", "") if name == "attention" else "all" if one_block else "",
            "target": "" if md.get("target") is None or name not in ("cdam", "gradcam")
            else md["target"],  # class 0 is a target too
            "exclude_sinks": "yes" if md.get("exclude_sinks") else "no"}


def kept_row(item: BatchItem, plane: tuple[int, ...] | None, out: Path) -> Row | None:
    """The row of a kept result, or None when its file cannot be read (then it is redone)."""
    from napari_attnreg.core.results.result import AttentionResult

    try:
        result = AttentionResult.load(out)
    except (ValueError, OSError):
        return None
    return result_row(item, plane, out, result, None, "skipped (exists)")


def failed_row(item: BatchItem, plane: tuple[int, ...] | None, reason: str) -> Row:
    """The row of an input or plane without a result: ``failed: reason``."""
    row = dict.fromkeys(SUMMARY_COLUMNS, "")
    row.update(source=str(item.source), status=f"failed: {reason}", plane=_plane_text(plane))
    return row


def write_summary(rows: Iterable[Row], path: Path) -> Path:
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


def earlier_rows(path: Path) -> list[Row]:
    """The rows of an existing ``summary.csv`` (earlier runs into the same folder), if any.

    Raises
    ------
    ValueError
        ``path`` exists but cannot be read, or is not a summary a batch wrote (a table of
        the user's own with other columns): it is never overwritten.
    """
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):
        return []
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        why = getattr(err, "strerror", None) or err
        raise ValueError(f"{path} exists but cannot be read ({why}); a batch would replace "
                         "it. Move it away, or give another --out.") from None
    if not _is_our_header(header):
        raise ValueError(f"{path} is not a summary written by napari-attnreg (its columns: "
                         f"{', '.join(header[:6])}{', ...' if len(header) > 6 else ''}); a "
                         "batch would replace it. Move it away, or give another --out.")
    return [{k: row.get(k) or "" for k in SUMMARY_COLUMNS} for row in rows if row.get("source")]


def _is_our_header(header: list[str]) -> bool:
    """A header this or an earlier version of the batch wrote."""
    known = set(SUMMARY_COLUMNS) | set(EARLIER_COLUMNS)
    return header[:3] == ["source", "plane", "output"] and "status" in header and all(
        name in known for name in header)


def report_failures(rows: Iterable[Row]) -> None:
    """One ``attnreg: error:`` line on stderr per failed image or plane."""
    for row in rows:
        if str(row["status"]).startswith("failed"):
            plane = f" (plane {row['plane']})" if row["plane"] else ""
            reason = str(row["status"])[len("failed: "):]
            # most reasons name the file already: the path once, where the reason puts it
            where = "" if str(row["source"]) in reason else f"{row['source']}{plane}: "
            print(f"attnreg: error: {where}{reason}{plane if not where else ''}",
                  file=sys.stderr)


class SummaryFile:
    """``summary.csv`` of this run merged with the rows of earlier runs into the same folder.

    An earlier row is dropped only once this run has reported the same input or output, so
    a batch killed halfway still lists what earlier runs finished. An earlier row whose
    input no longer exists (deleted or renamed since) keeps its output's details under the
    status ``stale: the input no longer exists``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.earlier = [_marked_if_gone(row) for row in earlier_rows(path)]
        self.rows: list[Row] = []

    def add(self, rows: list[Row]) -> None:
        """Report one input's rows and rewrite the file."""
        self.rows += rows
        report_failures(rows)
        sources = {r["source"] for r in self.rows}
        outputs = {r["output"] for r in self.rows if r.get("output")}
        kept = [r for r in self.earlier
                if r["source"] not in sources and (not r["output"] or r["output"] not in outputs)]
        write_summary(kept + self.rows, self.path)


STALE = "stale: the input no longer exists"


def _marked_if_gone(row: Row) -> Row:
    """An earlier row, its status ``stale`` when its input is gone (a failed row stays)."""
    source = Path(str(row["source"]))
    if str(row["status"]).startswith("failed") or source.exists() or source.is_symlink():
        return row
    return {**row, "status": STALE}


@dataclass
class BatchReport:
    """Rows of ``summary.csv`` and the number of failed images/planes."""

    rows: list[Row]
    summary: Path

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if str(r["status"]).startswith("failed")]


LOCK_NAME = ".attnreg.lock"


class FolderLock:
    """An exclusive lock on a batch's output folder, held while the batch runs.

    The lock is the operating system's lock on ``OUT/.attnreg.lock`` (``flock`` on POSIX,
    ``msvcrt.locking`` on Windows): it ends with the process that holds it, so the file a
    killed batch leaves behind locks nothing and the next batch takes it over. A batch that
    ends removes the file. The file names
    the holder (process id, host, start time) for the message a second batch gets.
    """

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        """Take the lock, or raise ValueError naming the batch that holds it."""
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as err:
                raise ValueError(f"Cannot create the lock file {self.path} "
                                 f"({err.strerror or err}); give --out a folder you can write "
                                 "to.") from None
            locked = _try_lock(fd)
            if not locked or _still_there(fd, self.path):
                break
            os.close(fd)  # the holder removed the file while we opened it: lock the new one
        if not locked:
            holder = _holder(fd)
            os.close(fd)
            raise ValueError(
                f"Another batch ({holder}) is writing into {self.path.parent}; two batches in one "
                "output folder would overwrite each other's summary.csv. Wait for it to finish, "
                "or give this batch another --out.")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)  # byte 0 is the locked one; the holder is named after it
        os.write(fd, (f"\nprocess {os.getpid()} on {socket.gethostname()}, started "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n").encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Let the next batch in: remove the file while still holding it (a batch that opened
        it meanwhile sees it gone and starts over), then close it, which ends the lock."""
        if self._fd is not None:
            if os.name != "nt":  # Windows cannot remove an open file; it stays, unlocked
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _try_lock(fd: int) -> bool:
    """Lock byte 0 of ``fd`` without waiting (the holder's name starts at byte 1, which
    Windows lets others read)."""
    try:
        if os.name == "nt":  # pragma: no cover - exercised on Windows CI only
            import msvcrt

            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _still_there(fd: int, path: Path) -> bool:
    """Whether ``path`` is still the file ``fd`` locked."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 1, os.SEEK_SET)
        text = os.read(fd, 200).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "another process"
