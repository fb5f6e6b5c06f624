"""Saving results with their scale and provenance (OME-TIFF, CSV, JSON).

:func:`provenance` is the one record of how a result was made; the napari ROI table, the
notebook CSV, the command line's summary and :func:`save_outputs` all write it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

#: Key of our metadata on napari output layers (the layer's ``metadata[META_KEY]``).
META_KEY = "attnreg"
THRESHOLD_KEYS = ("rule", "z_th", "p_th", "l_th", "q_th")
#: Columns of :func:`provenance`, in order (CSV headers use these names).
PROVENANCE_FIELDS = (
    "source_image", "model", "model_domain", "weights", "weights_sha256", "preset",
    *THRESHOLD_KEYS, "n_boot", "seed", "method", "null", "null_pool", "p_method",
    "alternative", "pi0_method", "device", "precision", "package_version",
)
_BUNDLED_MODELS = Path(__file__).resolve().parents[1] / "models"


def provenance(result_metadata: Mapping[str, Any], *, source: str | None = None,
               thresholds: Mapping[str, Any] | None = None) -> dict[str, Any]:
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

    Returns
    -------
    dict
        One value per name in :data:`PROVENANCE_FIELDS` (None where the metadata does not
        say); ``weights_sha256`` is computed when the weights are a file that still exists.

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
    if record["weights_sha256"] is None:
        weights_file = _weights_file(record["weights"], record["model"])
        record["weights_sha256"] = file_sha256(weights_file) if weights_file else None
    if record["package_version"] is None:
        record["package_version"] = _installed_version()
    return record


def _flatten(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Engine metadata is flat; a napari layer nests the run options under ``run``."""
    meta = metadata.get(META_KEY, metadata)
    if not isinstance(meta, Mapping):
        raise ValueError("provenance() needs a result's or an output layer's metadata dict, "
                         f"got {type(meta).__name__} under {META_KEY!r}.")
    if "run" not in meta:
        flat = dict(meta)
    else:
        flat = {**meta.get("run", {}), **meta.get("thresholds", {})}
        flat.update({k: v for k, v in meta.items()
                     if k in PROVENANCE_FIELDS and k not in flat})
        flat.setdefault("source_image", meta.get("source_path") or meta.get("source"))
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


def _weights_file(weights: Any, model: Any) -> Path | None:
    if not isinstance(weights, str) or weights in ("pretrained", "random-init", "given module"):
        return None
    candidates = [Path(weights)]
    if model == "demo":  # the bundled model records only its file name
        candidates.append(_BUNDLED_MODELS / weights)
    return next((p for p in candidates if p.is_file()), None)


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file (weights), read in 1 MiB blocks; cached by path, size and mtime."""
    p = Path(path).resolve()
    stat = p.stat()
    return _sha256_cached(str(p), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=32)
def _sha256_cached(path: str, _size: int, _mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _installed_version() -> str:
    from .. import __version__

    return str(__version__)
