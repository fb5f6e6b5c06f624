"""Saving results with their scale and provenance (OME-TIFF, CSV, JSON).

:func:`provenance` is the one record of how a result was made, for every table or file the
package exports; :func:`write_table_csv` adds it to a table's rows, :func:`save_outputs`
and :func:`save_layer` write it to ``provenance.json``.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.core.files import atomic_write, write_text_atomic
from napari_attnreg.core.models.weights_hash import bundled_weights, file_sha256
from napari_attnreg.core.results.meaning import null_record
from napari_attnreg.core.stats.presets import THRESHOLD_KEYS
from napari_attnreg.io.ometiff import LAYER_NAMESPACE, META_KEY

#: Columns of :func:`provenance`, in order (CSV headers use these names).
PROVENANCE_FIELDS = (
    "source_image", "model", "model_domain", "weights", "weights_sha256", "preset",
    *THRESHOLD_KEYS, "n_boot", "seed", "method", "null", "null_pool", "p_method",
    "alternative", "pi0_method", "device", "precision", "package_version",
)
#: OME axes of an N-D layer (OME-TIFF holds at most five: time, channel, z, y, x).
_OME_AXES = {2: "YX", 3: "ZYX", 4: "TZYX", 5: "TCZYX"}
#: pint unit names (napari layer ``units``) → OME UnitsLength symbols.
_OME_UNITS = {"nanometer": "nm", "micrometer": "µm", "micron": "µm", "millimeter": "mm",
              "centimeter": "cm", "meter": "m", "pixel": "pixel"}
OME_SUFFIXES = (".ome.tif", ".ome.tiff")
PROVENANCE_FILE = "provenance.json"
ROI_TABLE_FILE = "roi_table.csv"
LayerData = tuple[Any, Mapping[str, Any], str]


def provenance(result_metadata: Mapping[str, Any], *, source: str | None = None,
               thresholds: Mapping[str, Any] | None = None,
               own_weights: str | Path | None = None) -> dict[str, Any]:
    """How a result was made: source image, model, weights hash, preset, thresholds, B, seed.

    Parameters
    ----------
    result_metadata : mapping
        ``AttentionResult.metadata``, or the metadata of a napari output layer (the whole
        ``layer.metadata`` or its ``"attnreg"`` entry, whose ``"run"`` holds the options).
    source : str, optional
        Name or path of the source image; wins over the one in the metadata.
    thresholds : mapping, optional
        Rule and thresholds in force when the table or map was exported (they move live
        after the run); win over the ones in the metadata.
    own_weights : str or Path, optional
        The weights file this process itself loaded for the run. Only it (or the bundled
        demo weights) is hashed when the metadata has no ``weights_sha256``: a path read from
        a result file is never opened, whatever it names.

    Returns
    -------
    dict
        One value per name in :data:`PROVENANCE_FIELDS` (None where the metadata does not
        say); a missing ``weights_sha256`` is computed only from ``own_weights`` or the
        bundled demo weights.

    Examples
    --------
    >>> row = provenance(result.metadata, source="cells.tif")
    >>> row["n_boot"], row["seed"], row["q_th"]
    (200, 0, 0.1)
    """
    flat = _flatten(result_metadata)
    if source is not None:
        flat["source_image"] = str(source)
    for key, value in (thresholds or {}).items():
        if key in THRESHOLD_KEYS:
            flat[key] = value
    record = {name: _plain(flat.get(name)) for name in PROVENANCE_FIELDS}
    if not record["null"]:  # the step-down has no z null model: say what its null images were
        record["null"] = null_record(flat)
    if record["weights_sha256"] is None:
        found = own_weights or bundled_weights(record["weights"], record["model"])
        try:
            record["weights_sha256"] = file_sha256(found) if found else None
        except (ValueError, OSError):  # gone, or not a regular file: nothing to state
            record["weights_sha256"] = None
    if record["package_version"] is None:
        record["package_version"] = _installed_version()
    return record


def _flatten(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Engine metadata is flat; a napari layer nests the run options under ``run``."""
    meta = metadata.get(META_KEY, metadata)
    if not isinstance(meta, Mapping):
        raise ValueError("provenance() needs a result's or an output layer's metadata dict, "
                         f"got {type(meta).__name__} under {META_KEY!r}.")
    if isinstance(meta.get("provenance"), Mapping):  # the run's resolved record (napari layers)
        flat = dict(meta["provenance"])
    elif "run" not in meta:
        flat = dict(meta)
    else:
        flat = {**meta.get("run", {}), **meta.get("thresholds", {})}
        flat.update({k: v for k, v in meta.items()
                     if k in PROVENANCE_FIELDS and k not in flat})
        flat.setdefault("source_image", meta.get("source_path") or flat.get("source_path")
                        or meta.get("source"))
    flat.setdefault("source_image", flat.get("source_path") or flat.get("source"))
    if flat.get("device_used"):  # napari records the requested device ("auto") and the real one
        flat["device"] = flat["device_used"]
    if flat.get("weights_sha256") is None and flat.get("weights_hash") is not None:
        flat["weights_sha256"] = flat["weights_hash"]
    return flat


def _plain(value: Any) -> Any:
    """JSON/CSV-friendly scalars (NumPy numbers and paths become Python values)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value


def _installed_version() -> str:
    from napari_attnreg import __version__
    return str(__version__)


# ---- writing ------------------------------------------------------------------------------
def save_outputs(folder: str | Path, layer_data: Sequence[LayerData],
                 roi_rows: Sequence[Mapping[str, Any]] | None = None) -> list[Path]:
    """Save output layers as OME-TIFF with their scale, plus the ROI table and provenance.

    Parameters
    ----------
    folder : str or Path
        Created if needed. Existing files of the same names are replaced, each only once
        its new version is complete (a failed write leaves the old file); nothing else in
        the folder is touched.
    layer_data : sequence of (data, layer attributes, layer type)
        napari layer data tuples (``layer.as_layer_data_tuple()``) of ``"image"`` or
        ``"labels"`` layers. Images are written as float32, labels as the smallest unsigned
        integer type that holds them. ``scale`` becomes the OME PhysicalSize (in the
        layer's ``units`` when they are lengths, else ``pixel``).
    roi_rows : sequence of dict, optional
        Per-region statistics; written to ``roi_table.csv`` with the provenance columns.

    Returns
    -------
    list of Path
        The files written: one ``<layer name>.ome.tif`` per layer, ``roi_table.csv`` when
        rows were given, and ``provenance.json`` (how the results were made, per layer,
        with each layer's scale and translate). A slide layer (:func:`slide_file`) gets no
        file: its ``provenance.json`` entry names the slide, which the folder's reader opens
        again.
    """
    if not layer_data:
        raise ValueError("Nothing to save: give at least one image or labels layer.")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    entries: list[dict[str, Any]] = []
    used: set[str] = set()
    # every layer checked and converted before any file is written: all or nothing; a
    # slide's pixels stay in its file (gigabytes as float32), the record names the file
    arrays = [None if slide_file(attrs, layer_type) else _ome_array(data, attrs, layer_type)
              for data, attrs, layer_type in layer_data]
    for array, (data, attrs, layer_type) in zip(arrays, layer_data):
        if array is None:  # the slide's record (its file, level, channel ...): JSON values
            record = {k: v for k, v in dict(attrs["metadata"]["slide"]).items()
                      if isinstance(v, (str, int, float, bool)) or v is None}
            entries.append({**_layer_entry(None, data, attrs, layer_type), "slide": record})
            continue
        path = folder / _unique_name(str(attrs.get("name") or layer_type), used)
        written.append(_write_array(path, array, attrs, layer_type))
        entries.append(_layer_entry(path.name, data, attrs, layer_type))
    if roi_rows:
        written.append(write_table_csv(folder / ROI_TABLE_FILE, roi_rows, _run(entries)))
    written.append(_write_record(folder / PROVENANCE_FILE, entries,
                                 ROI_TABLE_FILE if roi_rows else None))
    return written


def save_layer(path: str | Path, layer: LayerData) -> list[Path]:
    """One layer as ``<name>.ome.tif`` plus ``<name>.provenance.json`` beside it (the folder
    is created if needed)."""
    data, attrs, layer_type = layer
    path = Path(path)
    lower = path.name.lower()
    suffix = next((s for s in OME_SUFFIXES if lower.endswith(s)), None)
    if suffix is None:
        raise ValueError(f"Save one layer under an OME-TIFF name (*.ome.tif), not {path.name}.")
    from napari_attnreg.core.run.lazy import MAX_UNTILED_PIXELS  # torch: only when saving

    slide = slide_file(attrs, layer_type)
    if slide is not None and _pixels(data, attrs) > MAX_UNTILED_PIXELS:
        raise ValueError(
            f"{attrs.get('name')!r} is a whole-slide image whose pixels are in {slide}; one "
            f"OME-TIFF of them ({_pixels(data, attrs):,} pixels as float32) is not written. "
            "Save it with other layers into a folder (the folder refers to the slide file), "
            "or save the result layers alone.")
    path.parent.mkdir(parents=True, exist_ok=True)
    tiff = write_ome_tiff(path, data, attrs, layer_type)
    sidecar = path.with_name(path.name[: -len(suffix)] + ".provenance.json")
    return [tiff, _write_record(sidecar, [_layer_entry(path.name, data, attrs, layer_type)])]


def slide_file(attrs: Mapping[str, Any], layer_type: str) -> str | None:
    """The slide file an image layer shows (the plugin's slide reader records it in
    ``metadata["slide"]``), or None: its pixels are that file's, so a saved folder refers to
    the file instead of copying them."""
    metadata = attrs.get("metadata") or {}
    slide = metadata.get("slide") if isinstance(metadata, Mapping) else None
    path = slide.get("path") if isinstance(slide, Mapping) else None
    return str(path) if layer_type == "image" and path else None


def _pixels(data: Any, attrs: Mapping[str, Any]) -> int:
    shape = np.shape(data[0] if attrs.get("multiscale") else data)
    return int(np.prod(shape[:2])) if len(shape) >= 2 else 0


def _write_record(path: Path, entries: list[dict[str, Any]], roi_table: str | None = None) -> Path:
    """``provenance.json``: the run (from the first of our layers) and every file's geometry."""
    record = {"saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "saved_with": _installed_version(),
              "provenance": _run(entries),
              "layers": entries, "roi_table": roi_table}
    return write_text_atomic(path, json.dumps(record, indent=2, default=_json_default))


def write_ome_tiff(path: str | Path, data: Any, attrs: Mapping[str, Any],
                   layer_type: str) -> Path:
    """One layer as OME-TIFF: float32 maps or unsigned labels, ``scale`` as PhysicalSize (in
    the layer's unit), and the whole napari placement in a MapAnnotation (namespace
    :data:`LAYER_NAMESPACE`: name, layer type, shape, scale, translate, units, rotate,
    shear, affine, our metadata) that :func:`~napari_attnreg.io.ometiff.read_ome_tiff_layers`
    puts back, so a reopened layer lies exactly where it was."""
    return _write_array(Path(path), _ome_array(data, attrs, layer_type), attrs, layer_type)


def _ome_array(data: Any, attrs: Mapping[str, Any], layer_type: str) -> np.ndarray:
    """The array a layer is saved as, or the reason it cannot be (before anything is written)."""
    if layer_type not in ("image", "labels"):
        raise ValueError(f"Only image and labels layers are saved as OME-TIFF, not {layer_type}.")
    array = np.asarray(data[0] if attrs.get("multiscale") else data)
    array = _labels_dtype(array, str(attrs.get("name") or "labels")) if layer_type == "labels" \
        else array.astype(np.float32)
    spatial_ndim = array.ndim - (1 if bool(attrs.get("rgb")) and layer_type == "image" else 0)
    if spatial_ndim not in _OME_AXES:
        raise ValueError(f"OME-TIFF holds 2 to 5 axes; this layer has {spatial_ndim}. Save a "
                         "slice or a projection of it.")
    return array


def _write_array(path: Path, array: np.ndarray, attrs: Mapping[str, Any],
                 layer_type: str) -> Path:
    import tifffile

    rgb = bool(attrs.get("rgb")) and layer_type == "image"
    spatial_ndim = array.ndim - (1 if rgb else 0)
    axes = _OME_AXES[spatial_ndim] + ("S" if rgb else "")
    metadata: dict[str, Any] = {"axes": axes, "Name": str(attrs.get("name", ""))}
    scale = list(attrs.get("scale") or [1.0] * spatial_ndim)[-spatial_ndim:]
    units = _ome_units(attrs.get("units"), spatial_ndim)
    for axis, size, unit in zip(_OME_AXES[spatial_ndim], scale, units):
        if axis in "XYZ":
            metadata[f"PhysicalSize{axis}"] = float(size)
            if unit:
                metadata[f"PhysicalSize{axis}Unit"] = unit
    metadata["MapAnnotation"] = {"Namespace": LAYER_NAMESPACE,
                                 "Value": _placement(array.shape, attrs, layer_type)}
    path = Path(path)
    with atomic_write(path) as tmp:  # a full disk must not destroy the file being replaced
        tifffile.imwrite(tmp, array, ome=True, metadata=metadata,
                         photometric="rgb" if rgb else None, compression="zlib")
    return path


def _placement(shape: tuple[int, ...], attrs: Mapping[str, Any],
               layer_type: str) -> dict[str, str]:
    """The MapAnnotation of one layer: each value JSON (read back by ``io.ometiff``)."""
    metadata = attrs.get("metadata") or {}
    ours = metadata.get(META_KEY) if isinstance(metadata, Mapping) else None
    affine = attrs.get("affine")
    values = {
        "layer_type": layer_type, "name": str(attrs.get("name", "")),
        "shape": [int(n) for n in shape], "rgb": bool(attrs.get("rgb")),
        **{key: np.asarray(attrs[key], dtype=float).tolist()
           for key in ("scale", "translate", "rotate", "shear") if attrs.get(key) is not None},
        "affine": np.asarray(getattr(affine, "affine_matrix", affine), dtype=float).tolist()
        if affine is not None else None,
        "units": [str(u) for u in attrs["units"]] if attrs.get("units") else None,
        "contrast_limits": [float(v) for v in attrs["contrast_limits"]]
        if layer_type == "image" and attrs.get("contrast_limits") is not None else None,
        "metadata": {META_KEY: ours} if isinstance(ours, Mapping) else None,
    }
    return {key: json.dumps(value, default=_json_default) for key, value in values.items()
            if value is not None}


def write_table_csv(path: str | Path, rows: Sequence[Mapping[str, Any]],
                    run_provenance: Mapping[str, Any] | None = None) -> Path:
    """A CSV of ``rows`` with the provenance (:func:`provenance`) repeated as extra columns.

    Repeating the run on every row keeps the table self-describing after rows are filtered
    or tables of several runs are concatenated. Columns already in the rows win.
    """
    rows = [dict(r) for r in rows]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    extra = {k: v for k, v in (run_provenance or {}).items() if k not in columns}
    path = Path(path)
    with atomic_write(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns + list(extra))
        writer.writeheader()
        for row in rows:
            writer.writerow({**{k: _plain(v) for k, v in row.items()}, **extra})
    return path


def saved_provenance(layer_data: Sequence[LayerData]) -> dict[str, Any] | None:
    """The run's provenance as :func:`save_outputs` states it in ``provenance.json`` for these
    layers (None when none is an output layer): a table saved beside them (the ROI table)
    takes this record, so the two files never disagree."""
    return _run([_layer_entry("", data, attrs, kind) for data, attrs, kind in layer_data])


def _run(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's provenance: from a threshold-dependent layer when there is one.

    Moving a threshold slider updates only the regularized and significant layers, so their
    metadata holds the thresholds in force; the other maps keep those of the run.
    """
    ours = [e for e in entries if e["provenance"]]
    live = [e for e in ours if e["kind"] in ("significant", "regularized")]
    return (live or ours or [{"provenance": None}])[0]["provenance"]


def _labels_dtype(array: np.ndarray, name: str = "labels") -> np.ndarray:
    """The smallest integer type OME-TIFF knows that holds every label exactly.

    OME pixel types stop at 32 bits; a larger label is refused rather than wrapped (2**32
    would become 0, background). Labels stored as floats are saved as integers only when
    every value is a whole number; 2.5 is no label, and truncating it would be silent.
    """
    if array.dtype.kind == "f":
        whole = np.isfinite(array) & (array == np.round(array))
        if not whole.all():
            bad = array[~whole].flat[0]
            raise ValueError(f"The labels layer '{name}' holds values that are not whole "
                             f"numbers (e.g. {bad}); labels must be integers. Round them "
                             "(np.rint) or save the layer as an image.")
    elif array.dtype.kind not in "biu":
        raise ValueError(f"The labels layer '{name}' holds {array.dtype} values, not integers.")
    low = int(array.min()) if array.size else 0
    top = int(array.max()) if array.size else 0
    for dtype in ((np.int32,) if low < 0 else (np.uint8, np.uint16, np.uint32)):
        if np.iinfo(dtype).min <= low and top <= np.iinfo(dtype).max:
            return array.astype(dtype)
    raise ValueError(f"The labels layer '{name}' has labels from {low} to {top}, which do not "
                     "fit the 32-bit integers of OME-TIFF; "
                     "relabel the layer (e.g. skimage.segmentation.relabel_sequential) before "
                     "saving.")


def _ome_units(units: Any, ndim: int) -> list[str | None]:
    if not units:
        return [None] * ndim
    names = [str(u) for u in units][-ndim:]
    return [_OME_UNITS.get(name, name if name in _OME_UNITS.values() else None) for name in names]


def _unique_name(name: str, used: set[str]) -> str:
    """A file name from a layer name ("cell · −log10 p" → "cell_-log10_p.ome.tif"), unique."""
    stem = re.sub(r"[^\w.+-]+", "_", name.replace("−", "-"), flags=re.ASCII).strip("._") \
        or "layer"
    candidate, n = stem, 1
    while candidate.lower() in used:
        n += 1
        candidate = f"{stem}_{n}"
    used.add(candidate.lower())
    return candidate + ".ome.tif"


def _layer_entry(file: str | None, data: Any, attrs: Mapping[str, Any],
                 layer_type: str) -> dict[str, Any]:
    metadata = attrs.get("metadata") or {}
    ours = isinstance(metadata, Mapping) and isinstance(metadata.get(META_KEY), Mapping)
    shape = np.shape(data[0] if attrs.get("multiscale") else data)
    return {
        "file": file,
        "name": attrs.get("name"),
        "layer_type": layer_type,
        "kind": metadata[META_KEY].get("kind") if ours else None,
        "shape": [int(n) for n in shape],
        "scale": [float(v) for v in attrs.get("scale") or [1.0] * len(shape)],
        "translate": [float(v) for v in attrs.get("translate") or [0.0] * len(shape)],
        "units": [str(u) for u in attrs.get("units") or []] or None,
        "provenance": _layer_provenance(metadata[META_KEY]) if ours else None,
        "metadata": metadata[META_KEY] if ours else None,
    }


def _layer_provenance(meta: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`provenance` of an output layer, and its run id (the ROI table's last column)."""
    record = provenance(meta)
    if meta.get("run_id") is not None:
        record["run_id"] = str(meta["run_id"])
    return record


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)
