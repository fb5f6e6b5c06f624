"""Resume records: what each batch output was made from, so a resume never trusts a stray file.

Beside every result ``NAME.attnreg.npz`` a batch writes ``NAME.attnreg.json`` *last*, once
the result and its figure are complete. It records the input (resolved path, size,
modification time; for a DICOM series, of all its files), the run (the model, the SHA-256 of
its weights, and every option as the run resolves it: the preset's defaults filled in) and
the size of every artefact. The input's bytes are fingerprinted too
(:func:`content_digest`), since copies made with ``cp -p``, ``rsync -t`` or tar keep sizes and
modification times while the content changes. A resumed batch skips an output only when all of that still
matches; otherwise it redoes the output and says why, or refuses when the output belongs to
another input of the same name. Files an option names (a tissue mask) are fingerprinted by
their content as well (:func:`option_files`).

The record also says which files beside the result are the tool's (:func:`owns`): a figure
or GeoJSON that was there before the tool wrote one, or a GeoJSON edited since, is the
user's, and a batch without ``--overwrite`` leaves it as it is.

Everything here is known without loading the model (its identity comes from the name and
the weights file), so a batch whose outputs are all complete never loads it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from napari_attnreg.core.files import write_text_atomic
from napari_attnreg.core.run.config import RunConfig
from napari_attnreg.core.run.service import ModelSpec

RECORD_FORMAT = "napari-attnreg resume record"
#: 2: the run is the resolved options and the model's identity before loading it.
#: 3: the input's content digest.
RECORD_VERSION = 3
#: Inputs up to this many bytes in all are hashed whole; larger ones by sampled blocks.
WHOLE_HASH_BYTES = 256 << 20
SAMPLE_BLOCKS = 64  # blocks read from each file of a larger input
SAMPLE_BLOCK_BYTES = 64 << 10
#: Options that change only how the work is cut up (the null images do not depend on the
#: chunking; the scores agree to float32 rounding): a resume keeps outputs made with others.
ROUNDING_ONLY = ("chunk_size", "memory_fraction")
MAX_RECORD_BYTES = 1 << 20  # a record is a few hundred bytes; a larger one is not ours
#: Artefacts that analysts edit in other programs (QuPath): recorded with their digest, so an
#: edited one is no longer the tool's and is never replaced without ``--overwrite``.
EDITED_ELSEWHERE = ("geojson",)


@dataclass(frozen=True)
class Decision:
    """What to do with one output: ``new``, ``skip``, ``redo`` (with why) or ``refuse``."""

    action: str
    reason: str = ""


def input_stamp(path: Path, files: Sequence[Path] = ()) -> dict[str, Any]:
    """The input as a resume record identifies it: resolved path, size, modification time
    and :func:`content_digest`; for a DICOM series (``files``), their number, total size,
    latest modification and digest; for an OME-Zarr folder, those of the files inside."""
    path = Path(path)
    series = bool(files)
    try:
        if not files and path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
        if files:
            stats = [Path(f).stat() for f in files]
            return {"source": str(path), "files": len(stats),
                    "size": sum(st.st_size for st in stats),
                    "mtime_ns": max(st.st_mtime_ns for st in stats),
                    "blake2b": content_digest([Path(f) for f in files], root=path),
                    **_reading(path, series)}
        st = path.stat()
        digest = content_digest([path])
    except OSError:  # missing: reading it fails and reports it; nothing can match
        return {"source": str(path), "size": None, "mtime_ns": None}
    return {"source": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "blake2b": digest, **_reading(path, series)}


#: The version of the reading of each kind of file whose reading changed; a result made by an
#: earlier reading is made again on resume, never kept as it was (other inputs' records carry
#: no reading, so their outputs are kept).
#: - pictures (PNG, JPEG, GIF, WebP, BMP) 2: CMYK JPEGs in colour, transparent pixels as
#:   background;
#: - DICOM (files, series, files without an ending) 3: MONOCHROME1 the right way round,
#:   PALETTE COLOR in colour (2); the stored display window analysed by default, a scout
#:   never a slice, a radiograph's spacing at the patient (3);
#: - TIFFs 3, only those in colour as planes or by a palette: planar RGB and palette colours.
READING_VERSIONS = {"picture": 2, "dicom": 3, "tiff colour": 3}
PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp")
DICOM_SUFFIXES = (".dcm", ".dicom")
READING_CHANGES = ("DICOM MONOCHROME1 the right way round, PALETTE COLOR in colour and through "
                   "its stored display window, CMYK JPEGs in colour, transparent pixels as "
                   "background, TIFFs without an ending as TIFFs, planar RGB and palette TIFFs "
                   "in colour")


def _reading(path: Path, series: bool) -> dict[str, int]:
    """``{"reading": version}`` for an input whose reading changed, else nothing (the
    records of other inputs stay as they were, so their outputs are kept)."""
    from napari_attnreg.io.readers import IMAGE_SUFFIXES, is_tiff, tiff_in_colour_planes

    name = path.name.lower()
    if name.endswith(PICTURE_SUFFIXES):
        return {"reading": READING_VERSIONS["picture"]}
    if series or name.endswith(DICOM_SUFFIXES) or (
            path.is_file() and not name.endswith((*IMAGE_SUFFIXES, ".zarr"))):
        return {"reading": READING_VERSIONS["dicom"]}  # and TIFFs without an ending (2)
    if path.is_file() and is_tiff(path) and tiff_in_colour_planes(path):
        return {"reading": READING_VERSIONS["tiff colour"]}
    return {}


def content_digest(files: Sequence[Path], root: Path | None = None) -> str:
    """A BLAKE2b fingerprint of the files' bytes (and, under ``root``, their names).

    Up to :data:`WHOLE_HASH_BYTES` in all every byte is hashed: BLAKE2b reads faster than most
    disks deliver, so this costs about one extra read of an input the run reads anyway.
    Above it (whole-slide images, long series) each file contributes its size and
    :data:`SAMPLE_BLOCKS` blocks spread evenly over it, first and last included: a resume then
    stays seconds, not minutes, per input, and catches swapped or re-exported files, a
    changed header or a re-compressed image, but not an edit confined to bytes between the
    samples (with the size and modification time unchanged); ``--overwrite`` redoes such an
    input.

    Raises
    ------
    OSError
        A file cannot be read.
    """
    sizes = [os.stat(f).st_size for f in files]
    whole = sum(sizes) <= WHOLE_HASH_BYTES
    digest = hashlib.blake2b(b"whole" if whole else b"sampled", digest_size=20)
    for file, size in zip(files, sizes, strict=True):
        if root is not None:
            digest.update(os.fsencode(os.path.relpath(file, root)) + b"\0")
        digest.update(size.to_bytes(8, "little"))
        with open(file, "rb") as fh:
            if whole:
                while block := fh.read(1 << 20):
                    digest.update(block)
                continue
            last = max(size - SAMPLE_BLOCK_BYTES, 0)
            for i in range(SAMPLE_BLOCKS):
                fh.seek(last * i // (SAMPLE_BLOCKS - 1))
                digest.update(fh.read(SAMPLE_BLOCK_BYTES))
    return digest.hexdigest()


def model_identity(spec: ModelSpec) -> dict[str, Any]:
    """Which model a run uses, without loading it: its name, and the SHA-256 of its weights
    where they are a local file (a weights file, the bundled models, a given backbone's
    file), the :func:`content_digest` of a local transformers folder's files. Hub weights are
    named, not hashed (hashing would need the download)."""
    from napari_attnreg.core.models.backbones import DEMO_DIR
    from napari_attnreg.core.models.catalogue import is_bundled
    from napari_attnreg.core.models.weights_hash import file_sha256, weights_sha256

    name = spec.name.strip()
    if spec.source == "module":
        weights = str(getattr(spec.module, "weights", "given module"))
        return {"model": name, "weights": weights, "weights_sha256": weights_sha256(weights, name)}
    if spec.source == "file":
        path = Path(name).expanduser().resolve()
        sha = file_sha256(path) if path.is_file() else None
        found = {"model": str(path), "arch": spec.arch, "weights_sha256": sha}
        if path.is_dir():  # a transformers folder: the content of its files
            files = sorted(p for p in path.rglob("*") if p.is_file())
            try:
                found["weights_blake2b"] = content_digest(files, root=path)
            except OSError:  # unreadable: loading it reports that
                found["weights_blake2b"] = None
        return found
    bundled = DEMO_DIR / f"{name}_vit.safetensors"
    if spec.source == "demo" or is_bundled(name):
        return {"model": name, "weights_sha256": file_sha256(bundled) if bundled.is_file() else None}
    return {"model": name, "weights": "pretrained"}


def run_signature(spec: ModelSpec, opts: Mapping[str, Any]) -> dict[str, Any]:
    """The model (:func:`model_identity`) and every option as the run resolves it, as plain
    JSON values (compared field by field on resume).

    The options are validated and the preset's defaults filled in (``RunConfig.validate``),
    so ``--preset paper`` differs from the default preset in every option it changes, while
    stating a default (``--q-th 0.1`` under step-down) is no change. :data:`ROUNDING_ONLY`
    options are left out; the device is the one ``auto`` picks here.

    Raises
    ------
    ValueError
        An option is invalid or the device is missing here (a serial batch checks both before
        any image; a Dask worker without the device reports it for each of its images).
    """
    from napari_attnreg.core.models.base import resolve_device

    config = RunConfig(**dict(opts)).validate()
    options = {k: v for k, v in asdict(config).items() if k not in ("extra", *ROUNDING_ONLY)}
    options["device"] = str(resolve_device(config.device))  # "auto" is the CPU on a CPU node
    run = {**model_identity(spec), **options, **option_files(config)}
    # through JSON so that tuples and lists, paths and strings compare equal after a reload
    return json.loads(json.dumps(run, sort_keys=True,  # a concept vector: every number
                                 default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))


def option_files(config: RunConfig) -> dict[str, Any]:
    """The content of every file an option names, as ``{option}_file``: its size and
    :func:`content_digest`, so a file rewritten under the same name (a repainted tissue mask)
    changes the run, as the model's weights file does (:func:`model_identity`; a concept
    from ``--concept`` is its vector, already in ``target``).

    Raises
    ------
    ValueError
        The file cannot be read (it was there when the options were checked).
    """
    from napari_attnreg.core.run.tissue import TISSUE_MODES

    files: dict[str, Any] = {}
    mask = config.tissue_mask  # validated: a mode, a file's path (read as given) or an array
    if isinstance(mask, (str, os.PathLike)) and str(mask).strip().lower() not in TISSUE_MODES:
        path = Path(mask)
        try:
            files["tissue_mask_file"] = {"size": path.stat().st_size,
                                         "blake2b": content_digest([path])}
        except OSError as err:
            raise ValueError(f"tissue_mask: cannot read the mask file {path} "
                             f"({err.strerror or err}).") from None
    return files


def record_path(result: Path) -> Path:
    """``NAME.attnreg.json`` beside ``NAME.attnreg.npz``."""
    return result.with_suffix(".json")


def write_record(result: Path, stamp: Mapping[str, Any], run: Mapping[str, Any],
                 artefacts: Mapping[str, Path], kept: Mapping[str, Path] | None = None) -> Path:
    """Record a complete output; call it after every artefact has been written.

    ``kept``: files of the output's names that were there before and not the tool's, left
    as they were (:func:`owns`); they are recorded as the user's, so a resume neither redoes
    the output for them nor ever replaces them without ``--overwrite``.
    """
    entries = {kind: _artefact_entry(kind, p) for kind, p in artefacts.items()}
    entries.update({kind: {"file": p.name, "kept": True} for kind, p in (kept or {}).items()})
    record = {"format": RECORD_FORMAT, "version": RECORD_VERSION, "input": dict(stamp),
              "run": dict(run), "artefacts": entries}
    return write_text_atomic(record_path(result), json.dumps(record, indent=1))


def _artefact_entry(kind: str, path: Path) -> dict[str, Any]:
    entry: dict[str, Any] = {"file": path.name, "size": path.stat().st_size}
    if kind in EDITED_ELSEWHERE:
        entry["blake2b"] = content_digest([path])
    return entry


def add_artefact(result: Path, kind: str, path: Path) -> None:
    """Add a file written beside a kept output (a GeoJSON asked for later) to its record."""
    record = _read_record(record_path(result))
    if record is None:
        return
    record["artefacts"][kind] = _artefact_entry(kind, path)
    write_text_atomic(record_path(result), json.dumps(record, indent=1))


def owns(result: Path, kind: str, path: Path) -> bool:
    """Whether ``path``, an existing file named as the output's ``kind``, is the tool's:
    its record names it as written by the tool (not kept from the user) and, for the kinds
    other programs edit (:data:`EDITED_ELSEWHERE`: a GeoJSON opened in QuPath), its content
    is still what the tool wrote. Anything else is someone's file, replaced only when asked
    (``--overwrite``)."""
    record = _read_record(record_path(result))
    entry = None if record is None else record["artefacts"].get(kind)
    if not isinstance(entry, dict) or entry.get("file") != path.name or entry.get("kept"):
        return False
    if kind not in EDITED_ELSEWHERE:
        return True
    try:
        return (path.stat().st_size == entry.get("size")
                and content_digest([path]) == entry.get("blake2b"))
    except OSError:
        return False


def _read_record(path: Path) -> dict[str, Any] | None:
    """The record, or None when there is none or it is not a valid one of ours."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
            return None
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    ok = isinstance(record, dict) and record.get("format") == RECORD_FORMAT and all(
        isinstance(record.get(k), dict) for k in ("input", "run", "artefacts"))
    return record if ok else None


def decide(result: Path, artefacts: Mapping[str, Path], stamp: Mapping[str, Any],
           run: Mapping[str, Any]) -> Decision:
    """Whether the output ``result`` (with ``artefacts``, by kind) can be kept for this input.

    Parameters
    ----------
    result : Path
        The ``.attnreg.npz`` path of this input (or plane).
    artefacts : mapping of str to Path
        Every file the output consists of, by kind (``"result"``, ``"figure"``).
    stamp : mapping
        :func:`input_stamp` of the input now.
    run : mapping
        :func:`run_signature` of this run.
    """
    record = _read_record(record_path(result))
    if record is None:
        if not result.exists():
            return Decision("new")
        owner = _result_source(result)
        if owner is None:  # not a result file at all: someone else's, never overwritten
            return Decision("refuse", f"the output {result} exists and is not a napari-attnreg "
                                      "result file; move it away (or use --overwrite to "
                                      "replace it)")
        if owner and owner != stamp["source"]:
            return _refusal(result, owner)
        return Decision("redo", "there is no resume record beside the existing result (an "
                                "interrupted or older run)")
    owner = record["input"].get("source")
    if owner != stamp["source"]:
        return _refusal(result, str(owner))
    if record.get("version") != RECORD_VERSION:
        return Decision("redo", "its resume record is from another version of napari-attnreg, "
                                "which recorded the run differently")
    if record["input"].get("reading") != stamp.get("reading") and \
            _same_but(record["input"], stamp, "reading"):
        return Decision("redo", f"this version of napari-attnreg reads such files differently "
                                f"({READING_CHANGES})")
    if record["input"] != dict(stamp):
        changed = "content" if _same_but(record["input"], stamp, "blake2b") else \
            "size or modification time"
        return Decision("redo", f"the input changed since ({changed})")
    changed = _changed(record["run"], run)
    if changed:
        return Decision("redo", f"the options changed ({', '.join(changed)})")
    for kind, path in artefacts.items():
        missing = _artefact_missing(kind, path, record["artefacts"].get(kind))
        if missing:
            return Decision("redo", missing)
    return Decision("skip")


def _artefact_missing(kind: str, path: Path, entry: Any) -> str:
    """Why the recorded artefact ``kind`` is not complete at ``path`` ("" when it is)."""
    if not isinstance(entry, dict) or entry.get("file") != path.name:
        return f"no {kind} was recorded for it"
    if entry.get("kept"):  # the user's file under this name: left alone while it is there
        return "" if path.exists() else f"its {kind} {path.name} is missing"
    if not path.is_file() or path.stat().st_size != entry.get("size"):
        return f"its {kind} {path.name} is missing or incomplete"
    return ""


def _same_but(recorded: Mapping[str, Any], stamp: Mapping[str, Any], key: str) -> bool:
    return {k: v for k, v in recorded.items() if k != key} == {
        k: v for k, v in stamp.items() if k != key}


#: Run fields compared only when the record and the run both have them: ``figure`` (the
#: command line's --figure), absent from older records and from runs that draw no figure.
COMPARED_WHERE_BOTH_SAY = ("figure",)


def _changed(recorded: Mapping[str, Any], run: Mapping[str, Any]) -> list[str]:
    """The options that differ, named as the analyst changed them: a changed preset stands
    for the defaults it fills in (``preset``, not a dozen thresholds). An option newer than
    the record, left at its default, is no change: it computes what the old version did
    (where it does not for some files, their reading version says so)."""
    from napari_attnreg.core.run.options import OPTIONS

    changed = sorted(k for k in set(recorded) | set(run) if recorded.get(k) != run.get(k)
                     and not (k not in recorded and k in OPTIONS
                              and run.get(k) == _as_recorded(OPTIONS[k].default))
                     # records before the figure was recorded, and runs without a figure
                     and not (k in COMPARED_WHERE_BOTH_SAY and (k not in recorded
                                                                or k not in run)))
    if "preset" in changed:
        from_preset = {o.name for o in OPTIONS.values() if o.preset_dependent} | {"tail"}
        changed = [k for k in changed if k not in from_preset]
    return changed


def _as_recorded(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _refusal(result: Path, owner: str) -> Decision:
    return Decision("refuse", f"the output {result} holds the result of {owner}, another input "
                              "of the same name; give this input another --out folder (or "
                              "--overwrite to replace that result)")


def _result_source(result: Path) -> str | None:
    """The ``source`` a result file of an older run names (``""`` when it names none), or
    None when it cannot be read as a result."""
    from napari_attnreg.core.results.result import AttentionResult

    try:
        source = AttentionResult.load(result).metadata.get("source")
    except (ValueError, OSError):
        return None
    return str(source) if source else ""
