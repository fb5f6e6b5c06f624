"""Files that never lie: decoding errors named by file, outputs replaced only when complete.

:func:`decoding` is the boundary between a damaged input and a bug: what a third-party decoder
raises on a file's bytes is that file's fault and becomes one ``ValueError`` naming it.
:func:`atomic_write` is the one way every output (result, figure, OME-TIFF, CSV, JSON) is
written: into a temporary file beside the target, which replaces the target only once it is
complete, so a full disk or a kill never leaves a truncated file or destroys the old one.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

#: Temporary files of :func:`atomic_write` end with this before their own suffix.
PARTIAL_MARK = ".partial"


class UnreadableFileError(ValueError):
    """An input file whose bytes could not be decoded; the message names the file."""


@contextlib.contextmanager
def decoding(path: str | Path, what: str = "image") -> Iterator[None]:
    """Turn any exception raised inside the block into :class:`UnreadableFileError`.

    Only code that decodes ``path``'s bytes (tifffile, Pillow, imageio, pydicom, zarr) may
    run inside: decoders raise whatever their parser hits on damaged bytes (``struct.error``,
    ``zlib.error``, ``KeyError``, ``ZeroDivisionError``, Pillow's ``DecompressionBombError``,
    ``MemoryError`` for absurd declared sizes, ...), and each of those is this file's error,
    not a bug of ours. Our own code stays outside such blocks, so its bugs still surface.
    """
    try:
        yield
    except UnreadableFileError:
        raise
    except MemoryError as err:  # a huge image, or a damaged header declaring one
        raise UnreadableFileError(
            f"{path} is too large to read into memory, or its header declares a size it does "
            "not hold; a tiled run (--tiled) reads large TIFFs tile by tile.") from err
    except Exception as err:
        text = str(err).splitlines()[0] if str(err) else ""
        reason = f"{type(err).__name__}: {text}" if text else type(err).__name__
        raise UnreadableFileError(
            f"{path} is not a readable {what} ({reason}); check that the file is complete and "
            "that its extension matches its format.") from err


def partial_path(path: Path) -> Path:
    """A unique temporary name beside ``path`` that keeps its suffix (writers infer formats)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{PARTIAL_MARK}{path.suffix}")


@contextlib.contextmanager
def atomic_write(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s content to; it replaces ``path`` on success.

    The temporary file is flushed to disk and renamed over ``path`` (``os.replace``, atomic
    on one file system) only when the block finishes; on any error it is removed and an
    existing ``path`` is left exactly as it was.

    Examples
    --------
    >>> with atomic_write("table.csv") as tmp:                      # doctest: +SKIP
    ...     tmp.write_text("a,b\\n1,2\\n")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_path(path)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:  # data on disk before the rename makes it visible
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    """``Path.write_text`` (UTF-8) through :func:`atomic_write`."""
    path = Path(path)
    with atomic_write(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path
