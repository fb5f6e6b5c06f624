"""DICOM series → one volume with its voxel spacing and the stored window/level.

A folder of single-frame files (one series or several), one file, or one multi-frame file.
Slices are ordered along the slice normal by ``ImagePositionPatient`` (``InstanceNumber``
when positions are missing), the modality rescale (slope/intercept) is applied, and the
spacing comes from ``PixelSpacing`` and the distance between slice positions
(``SpacingBetweenSlices`` or ``SliceThickness`` when there are no positions). Needs pydicom
(``pip install 'napari-attnreg[dicom]'``). Patient identifiers are never copied into the
returned metadata.

Example
-------
>>> (volume, kwargs), = read_dicom("CT_head/")                     # doctest: +SKIP
>>> kwargs["scale"], kwargs["contrast_limits"]                      # doctest: +SKIP
((5.0, 0.488, 0.488), (-160.0, 240.0))
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.core.files import decoding

DICOM_SUFFIXES = (".dcm", ".dicom")
#: The 4-byte marker after the 128-byte preamble of a DICOM Part 10 file.
_MAGIC_OFFSET, _MAGIC = 128, b"DICM"
LayerKwargs = dict[str, Any]


def _pydicom() -> Any:
    try:
        import pydicom
    except ImportError as err:
        raise ImportError("Reading DICOM files needs pydicom: pip install "
                          "'napari-attnreg[dicom]' (or pip install pydicom).") from err
    return pydicom


def is_dicom_file(path: str | Path) -> bool:
    """A ``.dcm``/``.dicom`` file, or any file with the DICOM Part 10 ``DICM`` marker."""
    p = Path(path)
    if not p.is_file():
        return False
    if p.suffix.lower() in DICOM_SUFFIXES:
        return True
    try:
        with open(p, "rb") as fh:
            fh.seek(_MAGIC_OFFSET)
            return fh.read(4) == _MAGIC
    except OSError:
        return False


def looks_like_dicom(path: str | Path, max_checked: int = 64) -> bool:
    """Cheap test for a reader hook: a DICOM file, or a folder whose first files include one.

    Only ``max_checked`` entries of a folder are looked at, so a large folder that is not a
    DICOM series (a zarr store, a tile folder) is declined quickly.
    """
    p = Path(path)
    if not p.is_dir():
        return is_dicom_file(p)
    if p.suffix.lower() == ".zarr":
        return False
    for checked, entry in enumerate(p.iterdir()):
        if checked >= max_checked:
            return False
        if is_dicom_file(entry):
            return True
    return False


def dicom_files(path: str | Path) -> list[Path]:
    """The DICOM files of a file or folder (not recursive); empty when there are none."""
    p = Path(path)
    if p.is_dir():
        return sorted(f for f in p.iterdir() if is_dicom_file(f))
    return [p] if is_dicom_file(p) else []


#: Header elements :func:`group_series` reads (the rest of a header, and the pixels, stay unread).
_GROUPING_TAGS = ("SeriesNumber", "SeriesInstanceUID", "NumberOfFrames",
                  "ImageOrientationPatient", "Rows", "Columns")


def group_series(files: Sequence[str | Path]) -> list[tuple[str, tuple[Path, ...]]]:
    """DICOM files → the volumes :func:`read_dicom` would make of them, from headers only.

    A batch's inputs: a folder of chest X-rays (one series per file) gives one group per
    file, a CT folder one group of slices (and its localizer another), so no input ever
    holds more than one volume, and no pixels are read here.

    Parameters
    ----------
    files : sequence of path

    Returns
    -------
    list of (str, tuple of Path)
        ``(label, files)`` in the order :func:`read_dicom` returns volumes; the label is
        ``series_<SeriesNumber>``, with the orientation (``_axial``, ``_sagittal_64x64``)
        when one series gives several volumes and ``_2``, ``_3``, ... when labels still
        repeat. Files without an image (DICOMDIR, reports) are left out; a file whose
        header cannot be read is a group of its own (reading it reports why).
    """
    pydicom = _pydicom()
    groups: dict[tuple[Any, ...], list[Path]] = defaultdict(list)
    first: dict[tuple[Any, ...], Any] = {}
    for f in map(Path, files):
        try:
            with decoding(f, "DICOM file"):
                ds = pydicom.dcmread(f, stop_before_pixels=True,
                                     specific_tags=list(_GROUPING_TAGS))
        except ValueError:  # damaged: its own input, whose reading then says why
            groups[(math.inf, "", "unreadable", str(f))].append(f)
            continue
        if "Rows" not in ds:  # no image: a DICOMDIR, a structured report, ...
            continue
        key = _volume_key(ds)
        groups[key].append(f)
        first.setdefault(key, ds)
    keys = sorted(groups, key=lambda k: (k[0], k[1], str(k[2:])))
    uids = [k[1] for k in keys]
    taken: dict[str, int] = {}
    found = []
    for key in keys:
        label = f"series_{key[0] if key[0] != math.inf else 'unreadable'}"
        if key in first and uids.count(key[1]) > 1:  # one series, several volumes: which
            label += "_" + _part_name(first[key], key).replace(" ", "_")
        taken[label] = taken.get(label, 0) + 1
        found.append((label if taken[label] == 1 else f"{label}_{taken[label]}",
                      tuple(sorted(groups[key]))))
    return found


def read_dicom(path: str | Path, files: Sequence[str | Path] | None = None,
               ) -> list[tuple[np.ndarray, LayerKwargs]]:
    """Read the DICOM series in ``path``: one ``(data, layer kwargs)`` pair per series.

    Every file is read once (header and pixels together), so a series of N slices costs N
    reads, whoever calls: napari's reader hook and the command line both come here.

    Parameters
    ----------
    path : str or Path
        A folder of DICOM files, one file, or a multi-frame file.
    files : sequence of path, optional
        The files of the series when the caller has already found them (a batch's folder
        scan); ``path`` then only names the series.

    Returns
    -------
    list of (np.ndarray, dict)
        Per series (in ``SeriesNumber`` order): the volume (``(Z, Y, X)``, ``(Y, X)`` for a
        single slice, a trailing RGB axis for colour data) in rescaled units, and napari
        layer keyword arguments: ``name``, ``scale`` (mm), ``units``, ``contrast_limits``
        (from the stored window when there is one), ``colormap``, ``rgb`` and ``metadata``
        (``{"dicom": {...}, "source_path": ...}``).
    """
    files = [Path(f) for f in files] if files else dicom_files(path)
    if not files:
        raise ValueError(f"No DICOM files (.dcm, or files with the DICM marker) in {path}.")
    pydicom = _pydicom()
    series: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for f in files:
        with decoding(f, "DICOM file"):
            ds = pydicom.dcmread(f)
            if "PixelData" not in ds:  # DICOMDIR, structured reports, presentation states
                continue
            series[_volume_key(ds)].append(ds)
    if not series:
        raise ValueError(f"The DICOM files in {path} hold no image (no PixelData).")
    keys = sorted(series, key=lambda k: (k[0], k[1], str(k[2:])))
    uids = [k[1] for k in keys]
    layers = []
    for key in keys:
        volume, kwargs = _series_layer(series[key], Path(path))
        if uids.count(key[1]) > 1:  # one series split in several volumes: say which this is
            kwargs["name"] = f"{kwargs['name']} · {_part_name(series[key][0], key)}"
        layers.append((volume, kwargs))
    return layers


def _volume_key(ds: Any) -> tuple[Any, ...]:
    """The volume a dataset belongs to: its series, then (for single frames) the orientation
    and size of its slices, or (for a multi-frame object) the file itself. Slices of one
    series in another orientation (a localizer, a sagittal reformat) are another volume,
    never stacked with the axial ones; every multi-frame file is a volume of its own."""
    number = _int(ds.get("SeriesNumber", 0))
    uid = str(ds.get("SeriesInstanceUID", ""))
    if _int(ds.get("NumberOfFrames", 1)) > 1:
        return number, uid, "file", str(ds.filename)
    orientation = ds.get("ImageOrientationPatient")
    tilt = tuple(round(float(v), 3) for v in orientation) \
        if orientation is not None and len(orientation) == 6 else None
    return number, uid, "slices", tilt, _int(ds.get("Rows", 0)), _int(ds.get("Columns", 0))


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _part_name(ds: Any, key: tuple[Any, ...]) -> str:
    """``axial``/``coronal``/``sagittal`` (slices) or the file name (multi-frame)."""
    if key[2] == "file":
        return Path(str(ds.filename)).name
    normal = np.abs(_slice_normal(ds))
    return ("sagittal", "coronal", "axial")[int(np.argmax(normal))] + \
        ("" if key[4:] == (0, 0) else f" {key[4]}x{key[5]}")


def _series_layer(datasets: list[Any], path: Path) -> tuple[np.ndarray, LayerKwargs]:
    first = datasets[0]
    frames = int(first.get("NumberOfFrames", 1) or 1)  # a multi-frame file is alone here
    datasets, slice_spacing = _sort_slices(datasets)
    volume = np.stack([_pixels(ds) for ds in datasets]) if frames == 1 else _pixels(first)
    rgb = int(first.get("SamplesPerPixel", 1)) > 1
    if volume.shape[0] == 1 and volume.ndim > (3 if rgb else 2):
        volume = volume[0]
    if frames > 1:
        slice_spacing = _frame_spacing(first)
    row, col = _pixel_spacing(first)
    spatial = volume.ndim - (1 if rgb else 0)
    scale = (slice_spacing, row, col) if spatial == 3 else (row, col)
    kwargs: LayerKwargs = {
        "name": str(first.get("SeriesDescription", "") or path.stem or path.name),
        "scale": tuple(float(s) for s in scale),
        "units": ("mm",) * spatial,
        "rgb": rgb,
        "metadata": {"source_path": str(path), "dicom": _summary(first, path, datasets)},
    }
    if not rgb:
        kwargs["colormap"] = "gray_r" if first.get("PhotometricInterpretation") == \
            "MONOCHROME1" else "gray"
        window = _window(first)
        if window is not None:
            kwargs["contrast_limits"] = window
    return volume, kwargs


def _sort_slices(datasets: list[Any]) -> tuple[list[Any], float]:
    """Order along the slice normal (``ImagePositionPatient``), ties and slices without a
    position by ``InstanceNumber``; spacing from the positions when every slice has one."""
    fallback = float(datasets[0].get("SpacingBetweenSlices", 0) or
                     datasets[0].get("SliceThickness", 0) or 1.0)
    if len(datasets) == 1:
        return datasets, fallback
    instance = [_int(ds.get("InstanceNumber", 0)) for ds in datasets]
    if all("ImagePositionPatient" in ds for ds in datasets):
        normal = _slice_normal(datasets[0])
        depth = [float(np.dot(normal, np.asarray(ds.ImagePositionPatient, dtype=float)))
                 for ds in datasets]
        order = np.lexsort((instance, depth))  # position along the normal, then InstanceNumber
        steps = np.diff(np.asarray(depth)[order])
        if np.any(np.isclose(steps, 0.0)):
            raise ValueError("Two slices of one DICOM series share a position; the folder may "
                             "mix acquisitions. Put each series in its own folder.")
        return [datasets[i] for i in order], float(np.median(steps))
    order = np.argsort(instance, kind="stable")
    return [datasets[i] for i in order], fallback


def _slice_normal(ds: Any) -> np.ndarray:
    orientation = ds.get("ImageOrientationPatient")
    if orientation is None or len(orientation) != 6:
        return np.array([0.0, 0.0, 1.0])  # axial, the usual acquisition
    row, col = np.asarray(orientation[:3], float), np.asarray(orientation[3:], float)
    return np.cross(row, col)


def _pixels(ds: Any) -> np.ndarray:
    """Stored values through the modality rescale (slope/intercept), smallest exact dtype."""
    try:
        with decoding(ds.filename, "DICOM image"):
            stored = ds.pixel_array
    except ValueError as err:
        raise ValueError(f"Cannot decode the pixel data of {ds.filename}: {err.__cause__ or err} "
                         "(compressed DICOM may need pylibjpeg or gdcm installed).") from err
    slope = float(ds.get("RescaleSlope", 1) or 1)
    intercept = float(ds.get("RescaleIntercept", 0) or 0)
    if slope == 1 and intercept == 0:
        return stored
    if slope == 1 and intercept.is_integer() and np.issubdtype(stored.dtype, np.integer):
        values = stored.astype(np.int64) + int(intercept)  # int32 wraps uint32 pixels
        dtype = np.promote_types(np.min_scalar_type(int(values.min())),
                                 np.min_scalar_type(int(values.max())))
        return values.astype(dtype)
    return (stored.astype(np.float32) * np.float32(slope) + np.float32(intercept))


def _pixel_spacing(ds: Any) -> tuple[float, float]:
    return _stated_spacing(ds) or (1.0, 1.0)


def _stated_spacing(ds: Any) -> tuple[float, float] | None:
    """(row, column) spacing in mm as the file states it, or None when it states none."""
    spacing = ds.get("PixelSpacing") or _functional(ds, "PixelMeasuresSequence", "PixelSpacing") \
        or ds.get("ImagerPixelSpacing")
    if spacing is None or len(spacing) != 2:
        return None
    try:
        row, col = float(spacing[0]), float(spacing[1])
    except (TypeError, ValueError):
        return None
    return (row, col) if row > 0 and col > 0 and np.isfinite([row, col]).all() else None


def _frame_spacing(ds: Any) -> float:
    for key in ("SpacingBetweenSlices", "SliceThickness"):
        value = ds.get(key) or _functional(ds, "PixelMeasuresSequence", key)
        if value:
            return float(value)
    return 1.0


def _functional(ds: Any, sequence: str, key: str) -> Any:
    """A value from the shared functional groups of an enhanced (multi-frame) object."""
    shared = ds.get("SharedFunctionalGroupsSequence")
    if not shared or sequence not in shared[0] or not shared[0][sequence].value:
        return None
    return shared[0][sequence][0].get(key)


def _window(ds: Any) -> tuple[float, float] | None:
    """The first stored window (centre ± width/2), in rescaled units."""
    centre, width = ds.get("WindowCenter"), ds.get("WindowWidth")
    if centre is None or width is None:
        return None
    centre, width = _first(centre), _first(width)
    if width <= 0:
        return None
    return (centre - width / 2, centre + width / 2)


def _first(value: Any) -> float:
    if isinstance(value, Sequence) and not isinstance(value, str):
        value = value[0]
    return float(value)


def _summary(ds: Any, path: Path, datasets: list[Any]) -> dict[str, Any]:
    """What the layer came from, slice by slice (files and SOP instance UIDs in volume
    order, so a result traces back to the exact images); no patient identifiers."""
    return {
        "path": str(path),
        "files": len(datasets),
        "source_files": [str(d.filename) for d in datasets],
        "sop_instance_uids": [str(d.get("SOPInstanceUID", "")) for d in datasets],
        "frame_of_reference_uid": str(ds.get("FrameOfReferenceUID", "")),
        "modality": str(ds.get("Modality", "")),
        "pixel_spacing": _stated_spacing(ds),  # None: the file states none (scale 1 shown)
        "series_instance_uid": str(ds.get("SeriesInstanceUID", "")),
        "series_description": str(ds.get("SeriesDescription", "")),
        "study_instance_uid": str(ds.get("StudyInstanceUID", "")),
        "photometric_interpretation": str(ds.get("PhotometricInterpretation", "")),
        "window": _window(ds),
    }
