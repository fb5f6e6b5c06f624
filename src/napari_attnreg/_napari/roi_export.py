"""ROI table export: the core's rows as CSV (each row stating what made it) and as the ROI
layer's ``features`` (napari's features table, the layer's status line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg.core.stats.roi import ROI_COLUMNS, object_size_advice

#: A Labels layer's features get one row per label value 0…max (napari's features table maps
#: row i to label i) unless the largest id is far beyond the number of ROIs.
DENSE_LABEL_ROWS = 10_000


def size_advice(rows: list[dict], record: RunRecord) -> str | None:
    """The core's object-size warning for the ROIs of one plane (the table's first)."""
    if not rows:
        return None
    plane = rows[0].get("plane")
    areas = {int(r["label"]): float(r["area_px"]) for r in rows if r.get("plane") == plane}
    result = record.any_result
    return object_size_advice(areas, result.token_scale, result.patch_size,
                              tiled=bool(result.metadata.get("tiled")),
                              tile_scale=float(record.params.get("tile_scale") or 1.0))


def roi_features(layer: Any, rows: list[dict], plane: list[int] | None = None) -> Any:
    """``layer.features`` with the ROI statistics of ``plane`` (default: the first) merged in.

    Shapes: row i is shape i (ROI id i + 1). Labels: row i is label i with an ``index`` column
    (napari's convention), or only the labels present when the ids are sparse. Columns the
    analyst or another plugin put there are kept; ROIs without a row get NaN.
    """
    import pandas as pd
    from napari.layers import Labels

    planes = [r.get("plane") for r in rows]
    chosen = plane if plane in planes else (planes[0] if planes else None)
    by_label = {int(r["label"]): r for r in rows if r.get("plane") == chosen}
    if isinstance(layer, Labels):
        top = max(by_label, default=0)
        ids = np.arange(top + 1) if top <= max(DENSE_LABEL_ROWS, 10 * len(by_label)) \
            else np.array(sorted(by_label))
    else:
        ids = np.arange(1, len(layer.data) + 1)
    keys = (["plane"] if chosen is not None else []) + list(ROI_COLUMNS)
    ours = pd.DataFrame({key: [_cell(by_label.get(int(i)), key) for i in ids] for key in keys})
    ours["label"] = ids  # every row names its ROI, measured or not
    if isinstance(layer, Labels):
        ours.insert(0, "index", ids)
    kept = layer.features
    if len(kept) == len(ours):
        kept = kept.drop(columns=[c for c in kept.columns if c in ours.columns])
        return pd.concat([kept.reset_index(drop=True), ours], axis=1)
    return ours


def with_layer_names(rows: list[dict], layer: Any) -> list[dict]:
    """``rows`` with the ROI layer's own text columns (QuPath's ``name`` and
    ``classification`` of an opened GeoJSON, a class the analyst typed) after ``label``.

    The CSV had the statistics by ROI number only: matching a row to the annotation it
    measures meant counting shapes in the layer list. Row ``label`` i is shape i − 1 of a
    Shapes layer, the row whose ``index`` is i of a Labels layer's features.
    """
    features = getattr(layer, "features", None)
    if features is None or not len(features) or not rows:
        return rows
    ours = {"plane", "label", "index", *ROI_COLUMNS}
    from napari.layers import Labels
    from pandas.api.types import is_object_dtype, is_string_dtype

    # text only (names, classes; pandas 3 calls them "str"): numbers another plugin put
    # there could be taken for our statistics
    text = [c for c in features.columns if c not in ours
            and (is_string_dtype(features[c]) or is_object_dtype(features[c])
                 or str(features[c].dtype) == "category")]
    if not text:
        return rows

    if isinstance(layer, Labels) and "index" in features.columns:
        lookup = {int(i): k for k, i in enumerate(features["index"])}
    else:
        lookup = {k + 1: k for k in range(len(features))}
    named = []
    for row in rows:
        k = lookup.get(int(row["label"]))
        extra = {c: ("" if k is None or _missing(features[c].iloc[k]) else str(features[c].iloc[k]))
                 for c in text}
        before = {key: value for key, value in row.items() if key in ("plane", "label")}
        named.append({**before, **extra, **row})
    return named


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def _cell(row: dict | None, key: str) -> Any:
    if row is None:
        return np.nan
    value = row.get(key)
    return str(value) if isinstance(value, list) else value


def run_provenance(record: RunRecord) -> dict:
    """What made the table: :func:`napari_attnreg.io.export.provenance` of the run (the
    values it resolved and used), with the thresholds in force now (they move live after the
    run) and the run id. The output layers carry the same record, so every file saved from
    the run states one provenance."""
    from napari_attnreg.io.export import provenance

    source = record.params.get("source_path") or record.source_name
    prov = provenance(record.any_result.metadata, source=source,
                      thresholds=dict(record.thresholds))
    return {**prov, "run_id": record.run_id}


def write_roi_csv(rows: list[dict], path: str | Path, record: RunRecord | None) -> Path:
    """The rows as CSV, each with the run's provenance columns (see ``io.export``)."""
    from napari_attnreg.io.export import write_table_csv

    return write_table_csv(path, rows, run_provenance(record) if record is not None else None)


def roi_geojson(layer: Any, record: RunRecord, rows: list[dict],
                plane: list[int] | None = None) -> dict:
    """An ROI layer's regions on ``plane`` (default: the first computed) as GeoJSON annotations
    QuPath imports where they were drawn, each with its row's statistics as ``measurements``.

    Coordinates are the image's pixels with its top-left corner at (0, 0) (QuPath's frame; a
    slide's full-resolution pixels), the frame the GeoJSON reader takes back: an ROI
    exported and opened again lies where it was. Names and classes the layer's features hold
    (an annotation read from QuPath) go back as its ``name`` and ``classification``.

    Raises
    ------
    ValueError
        No region on the plane, or a line or path (no area).
    """
    from shapely.geometry import mapping

    from napari_attnreg.io.geojson import full_resolution_factor

    planes = sorted(record.results)
    chosen = tuple(plane) if plane is not None and tuple(plane) in record.results else planes[0]
    factor = full_resolution_factor(record.shown(chosen))
    regions = _regions(layer, record, chosen, factor)
    if not regions:
        raise ValueError(f"No ROI of {layer.name!r} lies on this image"
                         f"{' plane' if chosen else ''}: draw one over it first.")
    by_label = {int(r["label"]): r for r in rows if r.get("plane", list(chosen)) == list(chosen)}
    named = {int(r["label"]): r for r in with_layer_names(
        [{"label": i} for i, _ in regions], layer)}
    features = []
    for label, geom in regions:
        about = named.get(label, {})
        row = by_label.get(label, {})
        properties: dict[str, Any] = {
            "objectType": "annotation",
            "name": about.get("name") or f"ROI {label}",
            "measurements": {k: float(v) for k, v in row.items() if k != "label"
                             and isinstance(v, (int, float)) and not isinstance(v, bool)
                             and np.isfinite(v)},
        }
        if about.get("classification"):
            properties["classification"] = {"name": about["classification"]}
        features.append({"type": "Feature", "geometry": mapping(geom),
                         "properties": properties})
    return {"type": "FeatureCollection", "features": features,
            "properties": {"source": record.source_name, "plane": list(chosen),
                           "full_resolution_per_pixel": factor}}


def _regions(layer: Any, record: RunRecord, plane: tuple[int, ...], factor: float
             ) -> list[tuple[int, Any]]:
    """Each ROI's id and shapely geometry in QuPath's frame (pixel corners at whole numbers;
    ``factor`` full-resolution pixels per pixel of the result): a Shapes layer's shapes, or
    the exact outline of each label's pixels of a Labels layer (holes kept)."""
    import shapely
    from napari.layers import Shapes
    from shapely.affinity import scale, translate
    from shapely.geometry import Polygon

    from napari_attnreg._napari.roi_geometry import labels_roi_on_image, shapes_roi_polygons
    from napari_attnreg.core.results.outline import mask_regions

    found = []
    if not isinstance(layer, Shapes):
        labels = labels_roi_on_image(layer, record.geometry, plane)
        for label in np.unique(labels[labels > 0]):
            # mask_regions puts pixel (r, c) at [c - 0.5, c + 0.5]: QuPath's corner is at 0
            region = translate(shapely.union_all(mask_regions(labels == label)), 0.5, 0.5)
            found.append((int(label), scale(region, factor, factor, origin=(0, 0))))
        return found
    polygons, ids = shapes_roi_polygons(layer, record.geometry, plane)
    for verts, label in sorted(zip(polygons, ids), key=lambda item: item[1]):
        # (row, col) with pixel centres at whole numbers -> (x, y) from the pixels' corner
        xy = (np.asarray(verts, dtype=float)[:, ::-1] + 0.5) * factor
        # an annotation read with holes is one ring walked through them (napari's way):
        # QuPath wants the holes as rings of their own
        area = shapely.make_valid(Polygon(xy))
        parts = [g for g in getattr(area, "geoms", [area]) if g.geom_type in
                 ("Polygon", "MultiPolygon") and not g.is_empty]
        if parts:
            found.append((label, shapely.union_all(parts)))
    return found


def write_roi_geojson(layer: Any, record: RunRecord, rows: list[dict], path: str | Path,
                      plane: list[int] | None = None) -> Path:
    """:func:`roi_geojson` written to ``path`` (``.geojson`` added to another ending)."""
    import json

    from napari_attnreg.core.files import atomic_write
    from napari_attnreg.io.geojson import GEOJSON_SUFFIXES

    path = Path(path)
    if path.suffix.lower() not in GEOJSON_SUFFIXES:
        path = path.with_name(path.name + ".geojson")
    text = json.dumps(roi_geojson(layer, record, rows, plane), indent=1)
    with atomic_write(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
    return path
