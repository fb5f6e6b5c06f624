"""npe2 reader and writer adapters over :mod:`napari_attnreg.io` (no Qt here).

The reader takes DICOM (a folder of ``.dcm`` files, one file, a multi-frame file) and
OME-TIFF, and declines everything else (returns None) so napari's other readers get it. The
writer saves image/labels layers as OME-TIFF with their scale plus ``provenance.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from napari_attnreg.io.dicom import looks_like_dicom
from napari_attnreg.io.export import OME_SUFFIXES, save_layer, save_outputs
from napari_attnreg.io.ometiff import is_ome_tiff

LayerData = tuple[Any, dict[str, Any], str]
ReaderFunction = Callable[[Any], list[LayerData]]


def get_reader(path: str | list[str]) -> ReaderFunction | None:
    """npe2 reader: a function for a DICOM or OME-TIFF path, None for anything else."""
    if isinstance(path, list):  # napari passes a list when several files are dropped
        if len(path) != 1:
            return None if not all(_is_dicom(p) for p in path) else read_dicom_files
        path = path[0]
    if is_ome_tiff(path):
        return read_ome_tiff_layers
    if _is_dicom(path):
        return read_dicom_layers
    return None


def _is_dicom(path: str) -> bool:
    return Path(path).suffix.lower() in (".dcm", ".dicom") or looks_like_dicom(path)


def read_dicom_layers(path: str | list[str]) -> list[LayerData]:
    """Read a DICOM series (pydicom needed: the ``[dicom]`` extra)."""
    from napari_attnreg.io.dicom import read_dicom

    path = path[0] if isinstance(path, list) else path
    return [(data, kwargs, "image") for data, kwargs in read_dicom(path)]


def read_dicom_files(paths: list[str]) -> list[LayerData]:
    """Several DICOM files dropped together: read as the series of their common folder."""
    folders = {str(Path(p).parent) for p in paths}
    if len(folders) != 1:
        raise ValueError("Drop DICOM files of one folder at a time, or drop the folder itself.")
    return read_dicom_layers(folders.pop())


def read_ome_tiff_layers(path: str | list[str]) -> list[LayerData]:
    """Read an OME-TIFF with its physical scale and channels."""
    from napari_attnreg.io.ometiff import read_ome_tiff

    path = path[0] if isinstance(path, list) else path
    return [(data, kwargs, "image") for data, kwargs in read_ome_tiff(path)]


def write_outputs(path: str, layer_data: list[LayerData]) -> list[str]:
    """npe2 writer: one layer to ``*.ome.tif``, or several layers into a folder.

    A single layer saved under an OME-TIFF name is that one file plus
    ``<name>.provenance.json`` beside it; otherwise ``path`` (without an OME-TIFF suffix) is
    a folder with one OME-TIFF per layer and ``provenance.json``.
    """
    lower = path.lower()
    suffix = next((s for s in OME_SUFFIXES if lower.endswith(s)), None)
    if suffix and len(layer_data) == 1:
        return [str(p) for p in save_layer(path, layer_data[0])]
    folder = path[: -len(suffix)] if suffix else path
    return [str(p) for p in save_outputs(folder, layer_data)]
