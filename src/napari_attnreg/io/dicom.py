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
import re
import warnings
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.core.files import UnreadableFileError, decoding

DICOM_SUFFIXES = (".dcm", ".dicom")
#: The 4-byte marker after the 128-byte preamble of a DICOM Part 10 file.
_MAGIC_OFFSET, _MAGIC = 128, b"DICM"
LayerKwargs = dict[str, Any]
#: SOP Class UID of VL Whole Slide Microscopy Image Storage: a slide level whose frames are
#: tiles, read by :mod:`napari_attnreg.io.dicom_wsi`, never as a volume here.
WSI_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.6"


class DicomHeaderError(UnreadableFileError):
    """A DICOM file whose header holds a value the reader cannot use; the message names the
    file and the element."""


def _pydicom() -> Any:
    try:
        import pydicom
    except ImportError as err:
        raise ImportError("Reading DICOM files needs pydicom: pip install "
                          "'napari-attnreg[dicom]' (or pip install pydicom).") from err
    return pydicom


def read_dataset(path: str | Path, **kwargs: Any) -> Any:
    """``pydicom.dcmread(path)``, and for a ``.dcm`` file written without the DICOM Part 10
    header (no preamble and no file meta: older ACR-NEMA-style archives, some exports) the
    dataset itself, with the transfer syntax its encoding shows.

    pydicom refuses such a file and suggests ``force=True``, which an analyst cannot pass;
    its dataset is taken only when it has an image's rows and columns, so a file that is
    not DICOM at all is still refused.
    """
    pydicom = _pydicom()
    from pydicom.errors import InvalidDicomError

    try:
        return pydicom.dcmread(path, **kwargs)
    except InvalidDicomError as err:
        if Path(path).suffix.lower() not in DICOM_SUFFIXES:
            raise
        refused = err
    try:
        header = pydicom.dcmread(path, force=True, stop_before_pixels=True)
        image = "Rows" in header and "Columns" in header
    except Exception:  # not a dataset either: pydicom's first words say why  # noqa: BLE001
        image = False
    if not image:
        raise refused
    ds = pydicom.dcmread(path, force=True, **kwargs)
    implicit, little = ds.original_encoding
    uid = pydicom.uid
    ds.file_meta = getattr(ds, "file_meta", None) or pydicom.dataset.FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = (uid.ImplicitVRLittleEndian if implicit else
                                      uid.ExplicitVRLittleEndian if little else
                                      uid.ExplicitVRBigEndian)
    return ds


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


#: Header elements :func:`group_series` reads (the rest of a header stays unread, and the
#: pixel data is only seen to be there: its value is deferred, never read).
_GROUPING_TAGS = ("SOPClassUID", "ImageType", "SeriesNumber", "SeriesInstanceUID",
                  "ContainerIdentifier",
                  "NumberOfFrames", "ImageOrientationPatient", "ImagePositionPatient", "Rows",
                  "Columns", "RescaleSlope", "RescaleIntercept", "PixelData")


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
        repeat; a whole-slide image's is ``slide_<ContainerIdentifier>`` (its barcode), or
        ``slide_<a level's file name>``. Files without an image (DICOMDIR, reports) are left out; a file whose
        header cannot be read, or holds values that cannot place or scale its image (see
        :func:`check_header`), is a group of its own (reading it reports why), never a
        slice of a series.
    """
    _pydicom()  # not installed: say what to install before reading any file
    groups: dict[tuple[Any, ...], list[Path]] = defaultdict(list)
    first: dict[tuple[Any, ...], Any] = {}
    first_file: dict[tuple[Any, ...], Path] = {}
    for f in map(Path, files):
        try:
            with decoding(f, "DICOM file"):
                ds = read_dataset(f, specific_tags=list(_GROUPING_TAGS), defer_size=256)
            if "PixelData" not in ds and not _lost_pixel_data(f, ds):
                continue  # no image: a DICOMDIR, a structured report, ...
            check_header(ds)
        except ValueError:  # damaged: its own input, whose reading then says why
            groups[(math.inf, "", "unreadable", str(f))].append(f)
            continue
        key = _volume_key(ds)
        groups[key].append(f)
        if key[2] != "slide" or _wsi_level(ds):  # a slide is named after a level of it
            first.setdefault(key, ds)
            first_file.setdefault(key, f)
    for key in [k for k in groups if k[2] == "slide" and k not in first]:
        del groups[key]  # a slide's label or overview alone: no slide to analyse
    keys = sorted(groups, key=lambda k: (k[0], k[1], str(k[2:])))
    uids = [k[1] for k in keys]
    taken: dict[str, int] = {}
    found = []
    for key in keys:
        label = f"series_{key[0] if key[0] != math.inf else 'unreadable'}"
        if key[2] == "slide":  # slides of one folder share series numbers: name which slide
            label = _slide_label(first[key], first_file[key])
        elif key in first and uids.count(key[1]) > 1:  # one series, several volumes: which
            label += "_" + _part_name(first[key], key).replace(" ", "_")
        taken[label] = taken.get(label, 0) + 1
        found.append((label if taken[label] == 1 else f"{label}_{taken[label]}",
                      tuple(sorted(groups[key]))))
    return found


def _slide_label(ds: Any, path: Path) -> str:
    """``slide_<barcode>`` (ContainerIdentifier, the slide's id on its label) or, when the
    files do not state it, ``slide_<name of a level's file>``: what tells two slides of one
    folder apart (both are usually series 1)."""
    ident = str(ds.get("ContainerIdentifier") or "").strip() or path.stem
    return "slide_" + (re.sub(r"[^\w.-]+", "_", ident).strip("_") or "unnamed")


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
        layer keyword arguments: ``name``, ``scale`` (mm), ``units``, ``axis_labels`` (``z``,
        ``y``, ``x``), ``contrast_limits``
        (from the stored window when there is one), ``colormap``, ``rgb`` and ``metadata``
        (``{"dicom": {...}, "source_path": ...}``).
    """
    files = [Path(f) for f in files] if files else dicom_files(path)
    if not files:
        raise ValueError(f"No DICOM files (.dcm, or files with the DICM marker) in {path}.")
    _pydicom()  # not installed: say what to install before reading any file
    series: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    damaged: list[str] = []
    for f in files:
        with decoding(f, "DICOM file"):
            ds = read_dataset(f)
        if _value(ds, "SOPClassUID") == WSI_SOP_CLASS:
            raise ValueError(
                f"{f} is a DICOM whole-slide image, whose {_int(_value(ds, 'NumberOfFrames'))} "
                "frames are tiles of one slide level, not slices of a volume: open it (or its "
                "folder) in napari with napari-attnreg, run it with 'attnreg run PATH --tiled "
                "[--level N]', or open it with napari_attnreg.io.dicom_wsi.open_dicom_slide.")
        if "PixelData" not in ds and not _lost_pixel_data(f, ds):
            continue  # DICOMDIR, structured reports, presentation states
        try:
            check_header(ds)
        except DicomHeaderError as err:  # one damaged slice: left out of its series, said so
            damaged.append(str(err))
            continue
        series[_volume_key(ds)].append(ds)
    if damaged and not series:
        raise DicomHeaderError(" ".join(damaged))
    for reason in damaged:
        warnings.warn(f"{reason} It is left out of the volume read from {path}.", stacklevel=2)
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


def check_header(ds: Any) -> None:
    """Refuse a header whose values cannot place or scale its image.

    The slice geometry (``ImageOrientationPatient``: 6 numbers, ``ImagePositionPatient``: 3),
    the image size (``Rows``, ``Columns``) and the modality rescale (``RescaleSlope``,
    ``RescaleIntercept``) decide where a slice goes and what its values mean, so a damaged
    one is the file's error. Values that only describe the image (pixel spacing, slice
    thickness, the display window) are checked where they are read, and a damaged one is
    ignored with a warning.

    Raises
    ------
    DicomHeaderError
        Naming the file, the element and what it holds.
    """
    if "PixelData" not in ds:
        raise DicomHeaderError(
            f"{ds.filename}: the DICOM header is damaged: it cannot be read up to the image it "
            "holds (the pixel data element is in the file, or the header describes an image, "
            "but pydicom's reading stops before it).")
    try:
        _numbers(ds, "ImageOrientationPatient", 6)
        _numbers(ds, "ImagePositionPatient", 3)
    except DicomHeaderError as err:
        raise DicomHeaderError(f"{err} The file's header is damaged: its slice cannot be "
                               "placed in a volume.") from None
    try:
        for key in ("RescaleSlope", "RescaleIntercept"):
            _numbers(ds, key, 1)
    except DicomHeaderError as err:
        raise DicomHeaderError(f"{err} The file's header is damaged: its stored values "
                               "cannot be converted to the modality's units.") from None
    for key in ("Rows", "Columns"):
        if not _int(_value(ds, key)):
            raise DicomHeaderError(
                f"{ds.filename}: the DICOM header has pixel data but no usable {key} (the "
                "image size is unknown); the file is damaged.")


#: The PixelData tag as it is stored (little and big endian).
_PIXEL_DATA_TAGS = (b"\xe0\x7f\x10\x00", b"\x7f\xe0\x00\x10")


def _lost_pixel_data(path: Path, ds: Any) -> bool:
    """A file read without pixel data that has an image all the same: a damaged length or tag
    can end pydicom's reading early, without an error, and such a file is no DICOMDIR to
    skip. Only files without pixel data (rare) have their bytes looked through."""
    if "Rows" in ds or "Columns" in ds:
        return True
    try:
        data = Path(path).read_bytes()
    except OSError:
        return False  # reading it again reports why
    return any(tag in data for tag in _PIXEL_DATA_TAGS)


def _value(ds: Any, key: str) -> Any:
    """An element's value, or None when it is absent or cannot be decoded."""
    try:
        return ds.get(key)
    except Exception:  # noqa: BLE001  pydicom's conversion of damaged bytes: absent here
        return None


def _numbers(ds: Any, key: str, count: int | None = None) -> tuple[float, ...] | None:
    """A numeric element's values (None when absent or empty), all finite.

    Raises
    ------
    DicomHeaderError
        It holds something else (text, ``count`` values expected and another number found).
    """
    if ds is None or key not in ds:
        return None
    try:  # pydicom converts the stored text here: what it raises is the bytes' fault
        value = ds[key].value
    except Exception as err:
        raise DicomHeaderError(f"{ds.filename}: the DICOM element {key} cannot be decoded "
                               f"({type(err).__name__}: {err}).") from err
    if value is None or value == "" or (_is_multi(value) and len(value) == 0):
        return None
    values = list(value) if _is_multi(value) else [value]
    shown = "\\".join(str(v) for v in values)
    try:
        numbers = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        numbers = ()
    if not numbers or not all(map(math.isfinite, numbers)) or \
            (count is not None and len(numbers) != count):
        wanted = f"{count} numbers" if count and count > 1 else "a number"
        raise DicomHeaderError(f"{ds.filename}: the DICOM element {key} holds {shown!r}, "
                               f"not {wanted}.")
    return numbers


def _is_multi(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _described(ds: Any, key: str, count: int | None = None) -> tuple[float, ...] | None:
    """A value that only describes the image (spacing, window): a damaged one is ignored,
    with a warning naming the file and the element, as if the file did not state it."""
    try:
        return _numbers(ds, key, count)
    except DicomHeaderError as err:
        warnings.warn(f"{err} It is ignored.", stacklevel=3)
        return None


def _volume_key(ds: Any) -> tuple[Any, ...]:
    """The volume a dataset belongs to: its series, then (for single frames) the orientation
    and size of its slices, or (for a multi-frame object) the file itself. Slices of one
    series in another orientation (a localizer, a sagittal reformat) are another volume,
    never stacked with the axial ones; every multi-frame file is a volume of its own."""
    number = _int(_value(ds, "SeriesNumber"))
    uid = str(_value(ds, "SeriesInstanceUID") or "")
    if _value(ds, "SOPClassUID") == WSI_SOP_CLASS:  # a slide's levels, label, ...: one slide
        return number, uid, "slide"
    if _int(_value(ds, "NumberOfFrames")) > 1:
        return number, uid, "file", str(ds.filename)
    if _is_localizer(ds):  # a scout is never a slice, even where no position says so
        return number, uid, "localizer", str(ds.filename)
    orientation = _numbers(ds, "ImageOrientationPatient", 6)  # checked: 6 numbers or None
    tilt = tuple(round(v, 3) for v in orientation) if orientation else None
    return number, uid, "slices", tilt, _int(_value(ds, "Rows")), _int(_value(ds, "Columns"))


def _is_localizer(ds: Any) -> bool:
    """A scout (ImageType ``LOCALIZER``): a projection of the body, not a slice of the volume.

    Only its orientation kept it apart from the axial slices; a series whose files state no
    orientation or position (an old scanner, a stripping anonymiser) stacked it in the
    volume as one more slice.
    """
    kind = _value(ds, "ImageType")
    kind = [kind] if isinstance(kind, str) else list(kind or [])
    return len(kind) >= 3 and str(kind[2]).strip().upper() == "LOCALIZER"


def _wsi_level(ds: Any) -> bool:
    """A slide's pyramid level (ImageType VOLUME), not its label, overview or thumbnail."""
    kind = _value(ds, "ImageType")
    kind = [kind] if isinstance(kind, str) else list(kind or [])
    return len(kind) < 3 or str(kind[2]).upper() not in ("LABEL", "OVERVIEW", "THUMBNAIL")


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _part_name(ds: Any, key: tuple[Any, ...]) -> str:
    """``axial``/``coronal``/``sagittal`` (slices) or the file name (multi-frame)."""
    if key[2] == "file":
        return Path(str(ds.filename)).name
    if key[2] == "localizer":
        return f"localizer {Path(str(ds.filename)).name}"
    if key[2] == "slide":
        return "slide"
    normal = np.abs(_slice_normal(ds))
    return ("sagittal", "coronal", "axial")[int(np.argmax(normal))] + \
        ("" if key[4:] == (0, 0) else f" {key[4]}x{key[5]}")


def _series_layer(datasets: list[Any], path: Path) -> tuple[np.ndarray, LayerKwargs]:
    first = datasets[0]
    frames = max(_int(_value(first, "NumberOfFrames")), 1)  # a multi-frame file is alone here
    datasets, slice_spacing = _sort_slices(datasets)
    volume = np.stack([_pixels(ds) for ds in datasets]) if frames == 1 else _pixels(first)
    rgb = _int(_value(first, "SamplesPerPixel")) > 1 or _is_palette(first)
    if volume.shape[0] == 1 and volume.ndim > (3 if rgb else 2):
        volume = volume[0]
    if frames > 1:
        slice_spacing = _frame_spacing(first)
    stated, windows = _stated_spacing(first), _windows(first)  # read once: warned once
    inverted = _is_monochrome1(first)
    if inverted:  # the windows were stated in the stored sense
        total = sum(_rescaled_range(first))
        windows = [(total - high, total - low, name) for low, high, name in windows]
    window = windows[0][:2] if windows else None  # napari shows the first, as viewers do
    row, col = stated or (1.0, 1.0)
    spatial = volume.ndim - (1 if rgb else 0)
    scale = (slice_spacing, row, col) if spatial == 3 else (row, col)
    kwargs: LayerKwargs = {
        "name": str(first.get("SeriesDescription", "") or path.stem or path.name),
        "scale": tuple(float(s) for s in scale),
        "units": ("mm",) * spatial,
        # napari's dims slider and every message name a slice "z = 12", not "axis 0 = 12"
        "axis_labels": ("z", "y", "x")[-spatial:],
        "rgb": rgb,
        "metadata": {"source_path": str(path),
                     "dicom": {**_summary(first, path, datasets),
                               "pixel_spacing": stated,  # None: none stated (scale 1 shown)
                               "window": window,
                               # every stored window: (low, high, explanation) ("LUNG")
                               "windows": [list(w) for w in windows],
                               # MONOCHROME1's values were turned round (_pixels): say so
                               "inverted": inverted}},
    }
    if not rgb:
        kwargs["colormap"] = "gray"  # MONOCHROME1 is inverted in the values themselves
        if window is not None:
            kwargs["contrast_limits"] = window
    return volume, kwargs


def _sort_slices(datasets: list[Any]) -> tuple[list[Any], float]:
    """Order along the slice normal (``ImagePositionPatient``), ties and slices without a
    position by ``InstanceNumber``; spacing from the positions when every slice has one."""
    fallback = _frame_spacing(datasets[0], functional=False)
    if len(datasets) == 1:
        return datasets, fallback
    instance = [_int(_value(ds, "InstanceNumber")) for ds in datasets]
    positions = [_numbers(ds, "ImagePositionPatient", 3) for ds in datasets]  # checked
    if all(positions):
        normal = _slice_normal(datasets[0])
        depth = [float(np.dot(normal, np.asarray(p, dtype=float))) for p in positions]
        order = np.lexsort((instance, depth))  # position along the normal, then InstanceNumber
        steps = np.diff(np.asarray(depth)[order])
        if np.any(np.isclose(steps, 0.0)):
            raise ValueError("Two slices of one DICOM series share a position; the folder may "
                             "mix acquisitions. Put each series in its own folder.")
        return [datasets[i] for i in order], float(np.median(steps))
    order = np.argsort(instance, kind="stable")
    return [datasets[i] for i in order], fallback


def _slice_normal(ds: Any) -> np.ndarray:
    orientation = _numbers(ds, "ImageOrientationPatient", 6)  # checked: 6 numbers or None
    if orientation is None:
        return np.array([0.0, 0.0, 1.0])  # axial, the usual acquisition
    row, col = np.asarray(orientation[:3], float), np.asarray(orientation[3:], float)
    return np.cross(row, col)


def _pixels(ds: Any) -> np.ndarray:
    """Stored values through the modality rescale (slope/intercept), smallest exact dtype;
    a MONOCHROME1 image's turned round (:func:`_inverted`), so bright is dense."""
    try:
        with decoding(ds.filename, "DICOM image"):
            stored = ds.pixel_array
    except ValueError as err:
        raise ValueError(_undecodable(ds, err.__cause__ or err)) from err
    if _is_palette(ds):
        return _palette_colours(ds, stored)
    if _is_monochrome1(ds):
        stored = _inverted(ds, stored)
    slope, intercept = _rescale(ds)
    if slope == 1 and intercept == 0:
        return stored
    if slope == 1 and intercept.is_integer() and np.issubdtype(stored.dtype, np.integer):
        values = stored.astype(np.int64) + int(intercept)  # int32 wraps uint32 pixels
        dtype = np.promote_types(np.min_scalar_type(int(values.min())),
                                 np.min_scalar_type(int(values.max())))
        return values.astype(dtype)
    # float32 holds every 8/16-bit value exactly; wider stored values need float64
    exact = np.issubdtype(stored.dtype, np.integer) and stored.dtype.itemsize <= 2
    real = np.float32 if exact else np.float64
    return stored.astype(real) * real(slope) + real(intercept)


#: What decodes every compressed transfer syntax pydicom leaves to plugins (JPEG baseline,
#: extended and lossless, JPEG-LS: libjpeg; JPEG 2000: openjpeg).
DECODERS = "pip install pylibjpeg pylibjpeg-libjpeg pylibjpeg-openjpeg (or pip install python-gdcm)"


def _undecodable(ds: Any, cause: BaseException) -> str:
    """Why a file's pixel data cannot be decoded, on one line; for a compressed file with no
    decoder installed, which compression it is and what to install (pydicom's own message
    lists plugins and version pins over several tab-indented lines)."""
    reason = " ".join(str(cause).split())
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    try:  # a damaged header's UID is no transfer syntax: pydicom raises on asking
        compressed = bool(getattr(syntax, "is_compressed", False))
        name = getattr(syntax, "name", "") or str(syntax)
    except ValueError:
        compressed, name = False, str(syntax)
    if compressed and "missing dependencies" in reason:
        return (f"{ds.filename}: its pixel data is compressed as {name}, and no decoder for it "
                f"is installed: {DECODERS}, then run it again.")
    hint = f" (compressed as {name}: {DECODERS} if it is missing)" if compressed else ""
    return f"Cannot decode the pixel data of {ds.filename}: {reason}{hint}."


def _rescale(ds: Any) -> tuple[float, float]:
    """``(slope, intercept)`` of the modality rescale (1, 0 when not stated); an enhanced
    CT or MR states it in its functional groups, where it was not looked for (the values
    came out 1024 off Hounsfield units)."""
    source = ds if "RescaleSlope" in ds or "RescaleIntercept" in ds else \
        _functional(ds, "PixelValueTransformationSequence")
    slope = (_numbers(source, "RescaleSlope", 1) or (1.0,))[0] or 1.0  # checked: a number
    return slope, (_numbers(source, "RescaleIntercept", 1) or (0.0,))[0]


def _is_palette(ds: Any) -> bool:
    """Indices into a colour table (PALETTE COLOR: ultrasound, nuclear medicine captures)."""
    return str(_value(ds, "PhotometricInterpretation") or "").strip().upper() == "PALETTE COLOR"


def _palette_colours(ds: Any, stored: np.ndarray) -> np.ndarray:
    """A PALETTE COLOR image's indices through its colour table: ``(..., 3)`` RGB, 8-bit.

    The indices alone were read as a grey image: the model saw, and napari showed, the
    table's positions instead of the colours. 16-bit table entries become 8-bit (what an
    8-bit RGB image is scaled as, by /255, keeping its colours).
    """
    from pydicom.pixels import apply_color_lut

    with decoding(ds.filename, "DICOM colour table"):
        colours = np.asarray(apply_color_lut(stored, ds))
    if colours.dtype != np.uint8:
        peak = 65535 if colours.dtype.itemsize >= 2 else 255
        colours = ((colours.astype(np.uint32) * 255 + peak // 2) // peak).astype(np.uint8)
    return colours


def _is_monochrome1(ds: Any) -> bool:
    """Grey values stored the other way round: the lowest is white (CR, DX, mammograms)."""
    return str(_value(ds, "PhotometricInterpretation") or "").strip().upper() == "MONOCHROME1"


def _stored_range(ds: Any) -> tuple[int, int]:
    """The lowest and highest value ``BitsStored`` bits hold (signed when
    ``PixelRepresentation`` is 1)."""
    bits = _int(_value(ds, "BitsStored")) or _int(_value(ds, "BitsAllocated")) or 16
    if _int(_value(ds, "PixelRepresentation")) == 1:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def _rescaled_range(ds: Any) -> tuple[float, float]:
    """:func:`_stored_range` in the modality's units."""
    slope, intercept = _rescale(ds)
    low, high = (v * slope + intercept for v in _stored_range(ds))
    return (low, high) if low <= high else (high, low)


def _inverted(ds: Any, stored: np.ndarray) -> np.ndarray:
    """A MONOCHROME1 image's stored values turned round within the range its bits hold
    (``low + high - v``), so higher is brighter as in every other image.

    A viewer shows MONOCHROME1 with an inverted grey scale; the run reads the values, so
    left as stored the model saw the radiograph as a negative (bone black, air white) and
    its figure showed that negative. The result never depends on the image's content, so
    every slice of a series is turned round alike.
    """
    if stored.dtype.kind == "f":  # float pixel data states no bit range: its own is used
        return (stored.max() + stored.min()) - stored
    low, high = _stored_range(ds)
    values = (low + high) - stored.astype(np.int64)
    info = np.iinfo(stored.dtype)
    if info.min <= values.min() and values.max() <= info.max:
        return values.astype(stored.dtype)
    return values.astype(np.promote_types(np.min_scalar_type(int(values.min())),
                                          np.min_scalar_type(int(values.max()))))


def _stated_spacing(ds: Any) -> tuple[float, float] | None:
    """(row, column) spacing in mm as the file states it, or None when it states none: in
    the patient (PixelSpacing), else a radiograph's at the detector (ImagerPixelSpacing)
    divided by its EstimatedRadiographicMagnificationFactor where it states one."""
    spacing = _described(ds, "PixelSpacing", 2) or \
        _described(_pixel_measures(ds), "PixelSpacing", 2)
    if spacing is None:
        spacing = _described(ds, "ImagerPixelSpacing", 2)
        # a radiograph's spacing at the detector: the patient, nearer the tube, is drawn
        # larger by the magnification the file estimates (about 1.1 for a chest PA), so
        # millimetres at the detector overstated every size in the body by that much
        factor = _described(ds, "EstimatedRadiographicMagnificationFactor", 1)
        if spacing is not None and factor is not None and factor[0] > 0:
            spacing = (spacing[0] / factor[0], spacing[1] / factor[0])
    if spacing is None:
        return None
    row, col = spacing
    return (row, col) if row > 0 and col > 0 else None


def _frame_spacing(ds: Any, functional: bool = True) -> float:
    """The slice spacing a file states (``SpacingBetweenSlices``, else ``SliceThickness``;
    also in an enhanced object's shared groups), 1 when it states none usable."""
    sources = (ds, _pixel_measures(ds)) if functional else (ds,)
    for key in ("SpacingBetweenSlices", "SliceThickness"):
        for source in sources:
            value = _described(source, key, 1)
            if value and value[0] > 0:
                return value[0]
    return 1.0


def _pixel_measures(ds: Any) -> Any:
    """The pixel measures of an enhanced (multi-frame) object's shared functional groups."""
    return _functional(ds, "PixelMeasuresSequence", per_frame=False)


def _functional(ds: Any, name: str, per_frame: bool = True) -> Any:
    """The first item of an enhanced (multi-frame) object's functional group ``name``: the
    shared groups', else (``per_frame``) the first frame's; None when neither states it."""
    try:
        groups = ["SharedFunctionalGroupsSequence"] + (
            ["PerFrameFunctionalGroupsSequence"] if per_frame else [])
        for group in groups:
            found = ds.get(group)
            if found and name in found[0]:
                items = found[0][name].value
                if items:
                    return items[0]
        return None
    except Exception:  # noqa: BLE001  a damaged sequence states nothing usable
        return None


def _windows(ds: Any) -> list[tuple[float, float, str]]:
    """Every stored window as ``(centre − width/2, centre + width/2, explanation)``, in
    rescaled units, in the file's order (a CT often states a soft-tissue and a lung window);
    a damaged one is ignored with a warning, and a window of no width left out (the run
    analyses through a window: ``intensity_window``)."""
    if "WindowCenter" not in ds:  # an enhanced object's: in its functional groups
        ds = _functional(ds, "FrameVOILUTSequence") or ds
    centre, width = _described(ds, "WindowCenter"), _described(ds, "WindowWidth")
    if centre is None or width is None:
        return []
    names = _value(ds, "WindowCenterWidthExplanation")
    names = [names] if isinstance(names, str) else list(names or [])
    names = [str(n).strip() for n in names] + [""] * len(centre)
    return [(c - w / 2, c + w / 2, names[k])
            for k, (c, w) in enumerate(zip(centre, width)) if w > 0]


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
        "series_instance_uid": str(ds.get("SeriesInstanceUID", "")),
        "series_description": str(ds.get("SeriesDescription", "")),
        "study_instance_uid": str(ds.get("StudyInstanceUID", "")),
        "photometric_interpretation": str(ds.get("PhotometricInterpretation", "")),
    }
