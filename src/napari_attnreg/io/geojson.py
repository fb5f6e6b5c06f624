"""GeoJSON exchange with QuPath and other slide tools: significant regions out, ROIs in.

Coordinates are image pixels, ``(x, y)`` with the image's top-left corner at ``(0, 0)``
(QuPath's convention); for a slide read at a coarser level or resolution, its full-resolution
(level 0) pixels, as QuPath places annotations on any slide. Each significant region is one
``Feature`` whose ``Polygon`` covers exactly its patches
(:mod:`napari_attnreg.core.results.outline`), classified ``"significant"`` and carrying its
statistics as QuPath ``measurements``. Annotations read back become an ROI label image (one
label per feature, in file order).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import shapely
from shapely.affinity import scale
from shapely.geometry import mapping, shape

from napari_attnreg.core.results.display import SIGNIFICANT_RGB
from napari_attnreg.core.results.meaning import result_meaning
from napari_attnreg.core.results.outline import mask_regions, to_pixels

GEOJSON_SUFFIXES = (".geojson",)
#: Result files of the command line (``AttentionResult.save``).
RESULT_SUFFIX = ".attnreg.npz"


def significant_features(result: Any, thresholds: Mapping[str, Any] | None = None
                         ) -> dict[str, Any]:
    """The significant regions of ``result`` as a GeoJSON ``FeatureCollection`` (a dict).

    Each region's properties: QuPath's ``objectType``/``classification`` and
    ``measurements`` (patches, area in pixels, mean attention, mean evidence); the
    collection's ``properties`` say what "significant" means for the run.
    """
    from napari_attnreg.core.results.display import rule_text, with_thresholds

    shown = with_thresholds(result, dict(thresholds) if thresholds is not None else None)
    mask = shown.significant()
    frame = full_resolution_factor(shown)
    features = []
    for region in mask_regions(mask):
        tokens = _tokens_inside(region, mask.shape)
        placed = scale(to_pixels(region, shown.token_scale), frame, frame, origin=(0, 0))
        features.append({
            "type": "Feature",
            "geometry": mapping(placed),
            "properties": {
                "objectType": "annotation",
                "name": "significant",
                "classification": {"name": "significant", "color": list(SIGNIFICANT_RGB)},
                "measurements": {
                    "patches": int(tokens.sum()),
                    "area_px": float(placed.area),
                    "mean_attention": float(shown.attention[tokens].mean()),
                    "mean_evidence": float(shown.evidence[tokens].mean()),
                },
            },
        })
    return {"type": "FeatureCollection", "features": features,
            "properties": {"preset": shown.preset, "rule": rule_text(shown.thresholds_used),
                           "meaning": result_meaning(shown.preset, shown.metadata),
                           "image_shape": list(shown.image_shape),
                           # pixels of the frame per analysed pixel (a slide: its level 0)
                           "full_resolution_per_pixel": frame}}


def full_resolution_factor(result: Any) -> float:
    """Full-resolution (level 0) pixels per analysed pixel of a slide's result (1 for
    other images, and for results made before the slide's downsample was recorded)."""
    value = result.metadata.get("slide_downsample")
    try:
        factor = float(value)
    except (TypeError, ValueError):
        return 1.0
    return factor if np.isfinite(factor) and factor > 0 else 1.0


def _tokens_inside(region: Any, grid: tuple[int, int]) -> np.ndarray:
    rows, cols = np.mgrid[0:grid[0], 0:grid[1]]
    return shapely.contains_xy(region, cols, rows)


def write_geojson(path: str | Path, result: Any,
                  thresholds: Mapping[str, Any] | None = None) -> Path:
    """Write :func:`significant_features` of ``result`` to ``path`` (``.geojson``)."""
    from napari_attnreg.core.files import atomic_write

    path = Path(path)
    if path.suffix.lower() not in GEOJSON_SUFFIXES:
        path = path.with_name(path.name + ".geojson")
    text = json.dumps(significant_features(result, thresholds), indent=1)
    with atomic_write(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
    return path


def write_geojson_beside(result_files: Iterable[Any]) -> list[Path]:
    """``NAME.geojson`` beside every ``NAME.attnreg.npz`` of ``result_files`` (other entries,
    e.g. the empty output of a failed image, are skipped); returns the files written."""
    from napari_attnreg.core.results.result import AttentionResult

    written = []
    for entry in result_files:
        path = Path(str(entry or ""))
        if not path.name.endswith(RESULT_SUFFIX) or not path.is_file():
            continue
        target = path.with_name(path.name[: -len(RESULT_SUFFIX)] + ".geojson")
        written.append(write_geojson(target, AttentionResult.load(path)))
    return written


def read_geojson_polygons(path: str | Path) -> list[Any]:
    """The polygons of a GeoJSON file (FeatureCollection, Feature or bare geometry), as
    shapely geometries in image pixels; points and lines are skipped."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path} is not a readable GeoJSON file ({err}).") from None
    items = data.get("features", [data]) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a GeoJSON FeatureCollection, Feature or geometry.")
    polygons = []
    for item in items:
        geometry = item.get("geometry", item) if isinstance(item, dict) else None
        if not isinstance(geometry, dict) or "type" not in geometry:
            continue
        geom = shape(geometry)
        if geom.geom_type in ("Polygon", "MultiPolygon") and not geom.is_empty:
            polygons.append(geom)
    if not polygons:
        raise ValueError(f"{path} holds no polygon annotations to use as ROIs.")
    return polygons


def polygons_to_labels(polygons: Sequence[Any], image_shape: tuple[int, int]) -> np.ndarray:
    """An ROI label image: pixels whose centre lies in polygon ``i`` get label ``i + 1``
    (a later polygon wins where they overlap)."""
    h, w = image_shape
    rows, cols = np.mgrid[0:h, 0:w]
    labels = np.zeros((h, w), dtype=np.int32)
    for i, geom in enumerate(polygons, start=1):
        labels[shapely.contains_xy(geom, cols + 0.5, rows + 0.5)] = i
    return labels


def read_geojson_rois(path: str | Path, image_shape: tuple[int, int]) -> np.ndarray:
    """The polygon annotations of a GeoJSON file (QuPath's export) as an ROI label image."""
    return polygons_to_labels(read_geojson_polygons(path), image_shape)
