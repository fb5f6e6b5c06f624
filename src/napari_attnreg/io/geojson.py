"""GeoJSON exchange with QuPath and other slide tools: significant regions out, ROIs in.

Coordinates are image pixels, ``(x, y)`` with the image's top-left corner at ``(0, 0)``
(QuPath's convention); for a slide read at a coarser level or resolution, its full-resolution
(level 0) pixels, as QuPath places annotations on any slide. Each significant region is one
``Feature`` whose ``Polygon`` covers exactly its patches
(:mod:`napari_attnreg.core.results.outline`), classified ``"significant"`` and carrying its
statistics as QuPath ``measurements``. Annotations read back become an ROI label image (one
label per feature, in file order), or a run's tissue mask (:func:`geojson_tissue_mask`: the
tissue a pathologist outlined in QuPath, in the slide's full-resolution pixels, placed on
whatever level or resolution the run analyses).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import shapely
import shapely.errors
from shapely.affinity import scale
from shapely.geometry import mapping, shape

from napari_attnreg.core.results.display import SIGNIFICANT_RGB
from napari_attnreg.core.results.meaning import result_meaning
from napari_attnreg.core.results.outline import mask_regions, to_pixels
from napari_attnreg.core.results.result import slide_downsample

GEOJSON_SUFFIXES = (".geojson",)
#: Pixels of a tissue mask rasterized from polygons (about 2048², the automatic mask's
#: thumbnail): fine enough for tiles of a few hundred pixels, small on any slide.
MASK_PIXELS = 1 << 22
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
    return slide_downsample(result.metadata)


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
    return [geom for geom, _ in read_geojson_annotations(path)]


def read_geojson_annotations(path: str | Path) -> list[tuple[Any, dict[str, Any]]]:
    """Each polygon feature of a GeoJSON file with what QuPath says of it.

    Returns
    -------
    list of (geometry, dict)
        The shapely ``Polygon`` or ``MultiPolygon`` (holes kept) in image pixels, and
        ``name``, ``classification`` (QuPath's class name, "" without one), ``color``
        (its class colour as ``(r, g, b)`` 0–255, or None) and ``object_type``
        (``"annotation"``, ``"detection"``, ...; "" when the file does not say), in file
        order; points and lines are skipped.

    Raises
    ------
    ValueError
        Unreadable file, a malformed geometry (which feature), or no polygon at all.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path} is not a readable GeoJSON file ({err}).") from None
    items = data.get("features", [data]) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a GeoJSON FeatureCollection, Feature or geometry.")
    found = []
    for number, item in enumerate(items, start=1):
        geometry = item.get("geometry", item) if isinstance(item, dict) else None
        if not isinstance(geometry, dict) or "type" not in geometry:
            continue
        try:
            geom = shape(geometry)
        except (TypeError, KeyError, IndexError, AttributeError, ValueError,
                shapely.errors.ShapelyError) as err:
            # shapely's own words (a TypeError of an int, a missing key) said nothing of the
            # file, and the command line printed them as a traceback
            raise ValueError(
                f"{path.name}: feature {number} holds a malformed GeoJSON geometry "
                f"({type(err).__name__}: {err}); a polygon's coordinates are rings of [x, y] "
                "pixels, as QuPath's 'Export objects as GeoJSON' writes them.") from None
        if geom.geom_type in ("Polygon", "MultiPolygon") and not geom.is_empty:
            properties = item.get("properties") if "geometry" in item else None
            found.append((geom, _qupath_properties(properties)))
    if not found:
        raise ValueError(f"{path.name} holds no polygon (points and lines outline no region).")
    return found


def _qupath_properties(properties: Any) -> dict[str, Any]:
    """Name, class, class colour and object type of a QuPath feature (any may be absent)."""
    properties = properties if isinstance(properties, dict) else {}
    classification = properties.get("classification")
    if isinstance(classification, str):  # a bare class name (other tools)
        classification = {"name": classification}
    classification = classification if isinstance(classification, dict) else {}
    color = classification.get("color", properties.get("color"))
    rgb = None
    if isinstance(color, (list, tuple)) and len(color) >= 3 and \
            all(isinstance(c, (int, float)) for c in color[:3]):
        rgb = tuple(int(min(max(c, 0), 255)) for c in color[:3])
    elif isinstance(color, int) and not isinstance(color, bool):  # QuPath 0.2's packed ARGB
        rgb = ((color >> 16) & 255, (color >> 8) & 255, color & 255)
    names = classification.get("names")  # QuPath's derived classes: ["Tumor", "Positive"]
    if isinstance(names, list) and not classification.get("name"):
        classification = {**classification, "name": ": ".join(str(n) for n in names)}
    return {"name": str(properties.get("name") or ""),
            "classification": str(classification.get("name") or ""),
            "color": rgb,
            "object_type": str(properties.get("objectType") or "")}


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


def is_geojson_path(value: Any) -> bool:
    """A file name (str or path) ending in ``.geojson``: a tissue mask drawn in QuPath."""
    from os import PathLike

    return isinstance(value, (str, PathLike)) and str(value).strip().lower().endswith(
        GEOJSON_SUFFIXES)


def geojson_tissue_mask(path: str | Path, shape: tuple[int, int],
                        full_per_pixel: float = 1.0, slide: bool | None = None) -> Any:
    """The polygons of a GeoJSON file as the tissue mask of an analysed image.

    QuPath (and this package's own export) writes coordinates in the slide's full-resolution
    (level 0) pixels whatever level is shown, so a run at a coarser level or resolution
    divides them by ``full_per_pixel`` (the result's ``slide_downsample``); holes (interior
    rings) are not tissue. The mask has at most :data:`MASK_PIXELS` pixels and covers the
    whole image, as any mask file.

    Parameters
    ----------
    path : str or Path
    shape : (int, int)
        ``(H, W)`` of the image the run analyses (a slide: its level read, resampled).
    full_per_pixel : float
        Full-resolution pixels per analysed pixel (1 for other images).
    slide : bool, optional
        Whether the image is a slide (default: when ``full_per_pixel`` > 1). A slide's
        outline that lies wholly in the top-left quarter gets a warning: coordinates of a
        coarser level, read as full-resolution pixels, land there.

    Returns
    -------
    NamedMask
        The boolean mask, named after the file (the result records it).

    Raises
    ------
    ValueError
        The file is unreadable, holds no polygon, or its polygons lie outside the image
        (the message gives both frames: coordinates at a coarser level's scale, say).
    """
    from napari_attnreg.core.run.tissue import NamedMask

    path = Path(path)
    try:
        polygons = read_geojson_polygons(path)
    except ValueError as err:
        raise ValueError(f"tissue_mask: {err} A GeoJSON tissue mask holds the tissue's "
                         "outline as polygons (QuPath: export the annotations as GeoJSON); or "
                         "give 'auto', 'none' or a mask image.") from None
    region = shapely.union_all([shapely.make_valid(p) for p in polygons])
    h, w = (int(n) for n in shape)
    f = float(full_per_pixel)
    if not region.intersects(shapely.box(0, 0, w * f, h * f)):
        x0, y0, x1, y1 = (round(v) for v in region.bounds)
        raise ValueError(
            f"tissue_mask: the polygons of {path.name} (x {x0}–{x1}, y {y0}–{y1}) lie outside "
            f"the image, which is {round(w * f)}x{round(h * f)} full-resolution pixels; "
            "GeoJSON coordinates are read as full-resolution (level 0) pixels, as QuPath "
            "exports them, whatever level or resolution is analysed.")
    x1, y1 = region.bounds[2:]
    if (f > 1 if slide is None else slide) and 2 * x1 <= w * f and 2 * y1 <= h * f:
        # an outline drawn on a coarser level, in its pixels, lies in the top-left
        # 1/downsample of the slide: the run tested a few tiles, with no word of why
        warnings.warn(
            f"tissue_mask: every polygon of {path.name} lies in the top-left quarter of the "
            f"slide (x ≤ {x1:.0f}, y ≤ {y1:.0f} of {round(w * f)}x{round(h * f)} "
            "full-resolution pixels). GeoJSON coordinates are read as full-resolution "
            "pixels, as QuPath exports them; an outline drawn in a coarser level's pixels "
            "must be multiplied by that level's downsample.", UserWarning, stacklevel=2)
    step = max(1.0, float(np.sqrt(h * w / MASK_PIXELS)))
    mh, mw = max(1, round(h / step)), max(1, round(w / step))
    # full-resolution pixels -> mask pixels; a mask pixel is tissue when its centre is inside
    placed = scale(region, mw / (w * f), mh / (h * f), origin=(0, 0))
    rows, cols = np.mgrid[0:mh, 0:mw]
    mask = shapely.contains_xy(placed, cols + 0.5, rows + 0.5)
    return NamedMask(mask, f"file {path.name} (GeoJSON polygons, full-resolution pixels)")


def tissue_mask_for_run(value: Any, shape: tuple[int, int],
                        extra: Mapping[str, Any] | None = None) -> Any:
    """The ``tissue_mask`` option as the core takes it: a GeoJSON file's polygons
    rasterized over the analysed image (:func:`geojson_tissue_mask`; ``extra`` is what the
    run records of the file, whose ``slide_downsample`` places full-resolution coordinates);
    any other value as given."""
    if not is_geojson_path(value):
        return value
    extra = extra or {}
    return geojson_tissue_mask(str(value).strip(), shape, slide_downsample(extra),
                               slide=extra.get("slide_level") is not None)
