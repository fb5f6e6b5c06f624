"""Saved results that reopen as results the dock knows (thresholds, inspector, ROI table).

The writer saves a run's output layers as OME-TIFF maps, which cannot be thresholded again;
so beside them it saves the run's results themselves (one ``.attnreg.npz`` per plane, at the
thresholds in force), found by the run id the layers carry. The readers (a saved folder, a
result file) note those files in their layers' metadata (``result_files``), and a dock that
sees such layers arrive loads the files and registers them as if it had run them, on the
image layer they were made from (same name and shape). No Qt here.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from napari_attnreg.core.results.result import AttentionResult

LayerData = tuple[Any, dict[str, Any], str]
META_KEY = "attnreg"  # as napari_attnreg._napari.layers.META_KEY (no napari import here)
#: The metadata key (under ``META_KEY``) listing ``[plane, path]`` of a layer's result files.
RESULT_FILES_KEY = "result_files"

# the results of the runs whose layers are in a viewer, by (run id, plane); weak, so a
# replaced or removed result is not kept alive for a save that may never come
_LIVE: weakref.WeakValueDictionary[tuple[str, tuple[int, ...]], AttentionResult] = \
    weakref.WeakValueDictionary()


def remember(run_id: str, results: Mapping[tuple[int, ...], AttentionResult]) -> None:
    """Let the writer find the results of run ``run_id`` (while something else holds them)."""
    for plane, result in results.items():
        _LIVE[(str(run_id), tuple(plane))] = result


def result_file_name(plane: tuple[int, ...]) -> str:
    """``result.attnreg.npz`` for a 2D image, ``result_plane_3.attnreg.npz`` for a slice."""
    tail = "_plane_" + "-".join(str(i) for i in plane) if plane else ""
    return f"result{tail}.attnreg.npz"


def _run_meta(layer_data: Sequence[LayerData]) -> Mapping[str, Any] | None:
    """The output metadata to take the run from: a threshold-dependent layer's (it holds the
    thresholds in force), else any output layer's."""
    ours = [meta for _, kw, _ in layer_data if isinstance(meta := _ours(kw), Mapping)
            and meta.get("run_id")]
    live = [m for m in ours if m.get("kind") in ("significant", "regularized")]
    return (live or ours or [None])[0]


def _ours(kwargs: Mapping[str, Any]) -> Any:
    """The plugin's output metadata of a layer's kwargs (None for other layers, and for the
    channel layers of one file, whose ``metadata`` is a list, one per channel)."""
    metadata = kwargs.get("metadata")
    return metadata.get(META_KEY) if isinstance(metadata, Mapping) else None


def write_result_files(folder: str | Path, layer_data: Sequence[LayerData]) -> list[Path]:
    """Save the results of the run the layers show into ``folder`` (nothing when the layers
    are no run's, or its results are gone); returns the files written."""
    meta = _run_meta(layer_data)
    if meta is None:
        return []
    planes = [tuple(p) for p in meta.get("planes") or [[]]]
    found = {p: _LIVE.get((str(meta["run_id"]), p)) for p in planes}
    if any(r is None for r in found.values()):
        return []
    thresholds = {k: v for k, v in (meta.get("thresholds") or {}).items()}
    return [result.with_thresholds(**thresholds).save(Path(folder) / result_file_name(plane))
            for plane, result in found.items()]


def link_result_files(layers: list[LayerData], files: Mapping[tuple[int, ...], Path]
                      ) -> list[LayerData]:
    """Note ``files`` (by plane) in the metadata of the output layers among ``layers``."""
    if not files:
        return layers
    listed = [[list(p), str(f)] for p, f in files.items()]
    for _, kwargs, _ in layers:
        meta = _ours(kwargs)
        if isinstance(meta, dict):
            meta[RESULT_FILES_KEY] = listed
    return layers


def saved_result_files(folder: Path, layers: list[LayerData]) -> dict[tuple[int, ...], Path]:
    """The result files the writer left in ``folder`` for the planes these layers show."""
    meta = _run_meta(layers)
    if meta is None:
        return {}
    planes = [tuple(p) for p in meta.get("planes") or [[]]]
    files = {p: folder / result_file_name(p) for p in planes}
    return files if all(f.is_file() for f in files.values()) else {}


def load_linked(meta: Mapping[str, Any]) -> dict[tuple[int, ...], AttentionResult]:
    """The results an output layer's ``result_files`` name (ValueError: damaged files)."""
    return {tuple(plane): AttentionResult.load(path)
            for plane, path in meta.get(RESULT_FILES_KEY) or []}
