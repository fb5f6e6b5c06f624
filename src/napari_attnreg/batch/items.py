"""A batch's inputs and the names of its outputs.

:func:`collect_inputs` turns files, folders and glob patterns into :class:`BatchItem` s whose
``relative`` path (to the common parent of all inputs) names their outputs, so two inputs
never write the same file: :func:`output_path` keeps the input's whole file name and puts a
stack's planes in a folder of their own. The DICOM files a folder scan or a glob finds in
one folder are grouped by their headers into the volumes they make: a series of slices is one
input named after the folder (its slices are the planes, in position order, so the outputs
``plane_0000``, ``plane_0001``, ... sort as the slices lie), a one-file image (an X-ray, a
multi-frame file) is an input of its own.
:func:`prepare_output_dir` checks the output folder before any image is read.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from napari_attnreg.core.files import PARTIAL_MARK
from napari_attnreg.io.dicom import DICOM_SUFFIXES, group_series, is_dicom_file
from napari_attnreg.io.readers import IMAGE_SUFFIXES, is_tiff, is_zarr

RESULT_SUFFIX = ".attnreg.npz"
FIGURE_SUFFIX = ".attnreg.png"
GEOJSON_SUFFIX = ".geojson"


@dataclass(frozen=True)
class BatchItem:
    """One input: where it is and the path its outputs are named after.

    A DICOM series is its folder (``source``) and the DICOM ``files`` found there, read
    together once; any other input is one file (or OME-Zarr folder) and ``files`` is empty.
    """

    source: Path
    relative: Path
    files: tuple[Path, ...] = ()


def collect_inputs(inputs: Sequence[str | Path], *, recursive: bool = False,
                   exclude: str | Path | Sequence[str | Path] | None = None,
                   skipped: list[Path] | None = None) -> list[BatchItem]:
    """Files, folders (their image files; ``recursive`` descends) and glob patterns → items.

    A path that does not exist is kept, so that it is reported as a failed input; so is a
    broken symbolic link a folder or a pattern finds. Outputs
    are named by the path relative to the common parent folder of all inputs. Files that a
    folder or a pattern finds inside ``exclude`` (the output folder, and a folder of tissue
    masks; one folder or several) are left out, and not named as skipped: a batch never
    analyses its own figures, nor a mask as an image. A file named explicitly is always an
    input, a DICOM
    file too (alone). The DICOM files a folder or a pattern finds in one folder
    (``.dcm``/``.dicom`` files, and files with the DICOM marker and no other image ending)
    are grouped into volumes by their headers: a series of slices is one input named after
    the folder (``folder/series_N`` when it holds several), a one-file image its own input.

    ``skipped``, when given, receives what a folder scan left out: files that are not images
    (hidden files aside) and, without ``recursive``, subfolders.

    Raises
    ------
    ValueError
        When nothing at all was found, or every file named does not exist.
    """
    found: list[Path] = []
    named: set[Path] = set()
    for entry in inputs:
        text = str(entry)
        if _is_glob(text) and not Path(text).exists():
            found += [p for p in _glob(text, recursive)
                      if p.is_file() or is_zarr(p) or _is_broken_link(p)]
        elif Path(text).is_dir() and not is_zarr(text):
            walk = _walk(Path(text)) if recursive else Path(text).iterdir()
            taken, left = _split(walk)
            found += taken
            if skipped is not None:
                skipped += left
        else:
            found.append(Path(text))
            named.add(_key(Path(text)))
    _check_named(inputs, found)
    skip = _folders(exclude)
    if skipped is not None:  # the output folder's results are no news (nor are the masks)
        skipped[:] = [p for p in skipped if not _inside(_key(p), skip)]
    # one input per file (a file found twice, or linked under two names, is run once), named
    # as it was found: a link's own name, not its target's (patient_12.svs ->
    # raw/S-0001.svs is patient_12's result, beside the other inputs)
    shown: dict[Path, Path] = {}
    for p in found:
        shown.setdefault(_key(p), _as_found(p))
    shown = {k: p for k, p in shown.items() if k in named or not _inside(k, skip)}
    named = {shown[k] for k in named if k in shown}
    unique = list(shown.values())
    if not unique:
        raise ValueError(f"No image files found in {', '.join(map(str, inputs))}; give files, "
                         "folders (with --recursive for subfolders) or glob patterns (files in "
                         "the output folder are not inputs).")
    inputs_found = _with_series(unique, named)
    parent = Path(os.path.commonpath([str(name.parent) for name, _, _ in inputs_found]))
    return [BatchItem(source, name.relative_to(parent), files)
            for name, source, files in inputs_found]


def _folders(exclude: str | Path | Sequence[str | Path] | None) -> list[Path]:
    """The folders of ``exclude`` (one path or several), resolved."""
    if exclude is None:
        return []
    paths = [exclude] if isinstance(exclude, (str, Path)) else list(exclude)
    return [Path(p).resolve() for p in paths]


def _inside(path: Path, folders: Sequence[Path]) -> bool:
    """``path`` (resolved) is one of ``folders`` or lies below one."""
    return any(folder == path or folder in path.parents for folder in folders)


def _with_series(paths: list[Path], named: set[Path],
                 ) -> list[tuple[Path, Path, tuple[Path, ...]]]:
    """``(name, source, files)`` per input, ``name`` being the path its outputs are named
    after: the DICOM files found in one folder become the volumes their headers make
    (:func:`~napari_attnreg.io.dicom.group_series`), in place of the folder's first file."""
    folders: dict[Path, list[Path]] = {}
    order: list[tuple[Path, bool]] = []  # (path, whether it is a folder of DICOM files)
    for p in paths:
        if p not in named and not _is_broken_link(p) and _is_dicom(p):
            if p.parent not in folders:
                order.append((p.parent, True))
            folders.setdefault(p.parent, []).append(p)
        else:
            order.append((p, False))
    result: list[tuple[Path, Path, tuple[Path, ...]]] = []
    for p, is_folder in order:
        result += _series_of(p, folders[p]) if is_folder else [(p, p, ())]
    return result


def _series_of(folder: Path, files: list[Path]) -> list[tuple[Path, Path, tuple[Path, ...]]]:
    """A folder's DICOM files as inputs: a volume of one file (an X-ray, a multi-frame file)
    is that file; a volume of slices is the folder, or ``folder/series_N`` when the folder
    holds several such volumes."""
    try:
        volumes = group_series(files)
    except ImportError:  # no pydicom: one input, whose reading says what to install
        return [(folder, folder, tuple(sorted(files)))]
    stacks = sum(len(group) > 1 for _, group in volumes)
    return [(group[0], group[0], ()) if len(group) == 1 else
            (folder if stacks == 1 else folder / label, folder, group)
            for label, group in volumes]


def _split(walk: Iterator[Path]) -> tuple[list[Path], list[Path]]:
    """A folder's entries: the inputs, and what is left out (hidden files aside)."""
    taken, left = [], []
    for p in sorted(walk):
        if _is_image(p) or _is_broken_link(p):
            taken.append(p)
        elif not p.name.startswith("."):
            left.append(p)
    return taken, left


def _check_named(inputs: Sequence[str | Path], found: list[Path]) -> None:
    """Nothing found exists (named files that are not there): say so at once."""
    if found and not any(p.exists() or p.is_symlink() for p in found):
        missing = ", ".join(map(str, found[:5])) + (", ..." if len(found) > 5 else "")
        raise ValueError(f"No such file or folder: {missing} (from {Path.cwd()}); check the "
                         "path, or quote a glob pattern.")


def _is_broken_link(path: Path) -> bool:
    """A symbolic link to nothing: an input of its own, which fails with a row saying so."""
    return path.is_symlink() and not path.exists()


def _as_found(path: Path) -> Path:
    """The path an input's outputs are named after: its folder resolved (a folder reached
    through a link is the real one, found once), its own name as it is, a link's included."""
    return _key(path.parent) / path.name if path.name else _key(path)


def _key(path: Path) -> Path:
    """The path an input is known by: resolved, except a broken link, which stays itself
    (resolving would name a file that is not there)."""
    return path.absolute() if _is_broken_link(path) else path.resolve()


def _is_dicom(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(DICOM_SUFFIXES) or (not name.endswith(IMAGE_SUFFIXES)
                                             and is_dicom_file(path))


def _is_image(path: Path) -> bool:
    """What a folder scan takes: OME-Zarr folders, image files (DICOM files and TIFFs also
    without an ending, by their marker), not killed writes."""
    if is_zarr(path):
        return True
    if not path.is_file() or (path.name.startswith(".") and PARTIAL_MARK in path.name):
        return False
    return path.name.lower().endswith(IMAGE_SUFFIXES) or _is_dicom(path) or is_tiff(path)


def _is_glob(text: str) -> bool:
    return any(ch in text for ch in "*?[")


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
    """The result file of an image or of one plane of a stack.

    ``OUT/rel/name.ext.attnreg.npz`` for an image; ``OUT/rel/name.ext/plane_0003.attnreg.npz``
    for plane 3 of a stack. File names keep their extension and plane outputs live in a
    folder named after the whole file name, so no two inputs or planes share an output.
    """
    if plane is None:
        return out_dir / item.relative.parent / (item.relative.name + RESULT_SUFFIX)
    name = "plane_" + "_".join(f"{i:04d}" for i in plane)
    return out_dir / item.relative / (name + RESULT_SUFFIX)


def output_artefacts(result: Path, figure: bool) -> dict[str, Path]:
    """Every file of one output, by kind: the result and, when figures are made, its PNG."""
    found = {"result": result}
    if figure:
        found["figure"] = result.with_name(result.name[: -len(RESULT_SUFFIX)] + FIGURE_SUFFIX)
    return found


def geojson_path(result: Path) -> Path:
    """``NAME.geojson`` beside ``NAME.attnreg.npz`` (``--geojson``; QuPath opens it)."""
    return result.with_name(result.name[: -len(RESULT_SUFFIX)] + GEOJSON_SUFFIX)


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
