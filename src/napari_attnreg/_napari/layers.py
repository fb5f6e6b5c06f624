"""Output layers: maps on the token grid, colormaps, in-place updates tracked by run id.

All maps stay on the token grid (a few thousand values per plane), placed on the image by
:func:`.geometry.token_transform`. A run's output layers are the objects its
:class:`RunRecord` holds (``record.outputs``), never "the first layer whose metadata
matches": napari's Duplicate Layer copies metadata, run id included, and such a copy is
the analyst's, never updated or renamed here. Functions that take a ``viewer`` run on
the GUI thread.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from napari_attnreg._napari.geometry import SourceGeometry, token_transform
from napari_attnreg._napari.outline import outline_layer_data, sync_outline
from napari_attnreg._napari.roi_export import run_provenance
from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg.core.results.display import (
    MAPS_BY_KEY,
    SIGNED_COLORMAP,
    SIGNIFICANT_COLOR,
    MapInfo,
    map_display,
)
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.planes import PlaneIndex
from napari_attnreg.core.stats.presets import DEFAULT_PRESET
from napari_attnreg.session import Session

#: Output kinds in the order they are stacked above the image (last = top).
KINDS = ("attention", "pvalue", "posterior", "regularized", "significant")
#: Kinds shown as continuous maps (with a colorbar); "significant" is an editable Labels layer.
CONTINUOUS_KINDS = KINDS[:-1]
#: Cells per token side of the significant Labels layer: the analyst paints or erases it at a
#: quarter token. It is drawn as a thin outline layer above it (:mod:`.outline`).
OUTLINE_SUPERSAMPLE = 4
#: Shown on the first run; hidden layers are one click away in the layer list.
VISIBLE = {"attention": False, "pvalue": False, "posterior": False, "regularized": True,
           "significant": True}
META_KEY = "attnreg"
#: ``(data, layer keyword arguments, layer type)``, as napari readers return layers.
LayerData = tuple[Any, dict[str, Any], str]
#: Layer attributes that place an output layer on its source (:func:`.geometry.token_transform`).
TRANSFORM_KEYS = ("scale", "translate", "rotate", "shear", "affine", "units", "axis_labels")


def layer_name(source_name: str, kind: str, preset: str = DEFAULT_PRESET,
               label: str | None = None) -> str:
    """``'cell · −log10 p, above null'`` etc.: the map's title (core.display) for the preset,
    after the tested map's caption when that is not the default attention (``'cell · CDAM
    for concept · significant'``; its raw map is ``'… · raw map'``).

    The regularized layer keeps a name without its thresholds, so moving a slider does not
    rename a layer (its rule is in the metadata and the widget's status line).
    """
    if kind == "significant":
        title = "significant"
    elif kind == "attention" and label:
        title = "raw map"
    else:
        title = MAPS_BY_KEY[kind].title(preset)
    return f"{source_name} · {label} · {title}" if label else f"{source_name} · {title}"


def map_label(record: RunRecord) -> str | None:
    """The caption of the map a record's results test (``'CDAM for concept'``), None for the
    default map."""
    info = MapInfo.of(record.any_result)
    return None if info.is_default else info.caption()


def legend(kind: str, preset: str, result: AttentionResult | None = None) -> str:
    """How to read an output layer (stored in its metadata, shown in the widget); with
    ``result``, in the words of its tested map."""
    if kind == "significant":
        text = ("The patches the rule calls significant (label 1), drawn by the thin outline "
                "layer above; show this layer to paint or erase them as an annotation.")
        info = None if result is None else MapInfo.of(result)
        return text if info is None or info.is_default else f"Tested map: {info.caption()}. {text}"
    return map_display(kind, result).legend(preset)


# ---- map values ------------------------------------------------------------------------------
def plane_maps(shown: AttentionResult) -> dict[str, np.ndarray]:
    """Every output map of one plane on its token grid, as core.display defines them.

    ``shown`` applies the thresholds chosen for its image (``RunRecord.shown``).
    """
    maps = {kind: MAPS_BY_KEY[kind].values(shown, shown.thresholds) for kind in CONTINUOUS_KINDS}
    maps["significant"] = shown.significant()
    return maps


def stacked_maps(record: RunRecord, kinds: tuple[str, ...] = KINDS) -> dict[str, np.ndarray]:
    """Output arrays of a record: planes never computed are NaN (drawn transparent, and no
    value a reader could take for a result); labels there stay 0.

    Significant tokens are label 1 on every plane: one class, drawn in one colour, which the
    analyst can paint or erase as an annotation.
    """
    out = {k: np.zeros(record.output_shape(_supersample(k)), dtype=np.int32) if k == "significant"
           else np.full(record.output_shape(), np.nan, dtype=np.float32) for k in kinds}
    for plane in sorted(record.results):
        maps = plane_maps(record.shown(plane))
        slot = record.plane_slot(plane)
        for kind in kinds:
            k = _supersample(kind)
            out[kind][slot] = np.kron(maps[kind], np.ones((k, k), dtype=np.int32)) if k > 1 \
                else maps[kind]
    if "significant" in out:
        close_outline(out["significant"])
    return out


def close_outline(labels: np.ndarray) -> np.ndarray:
    """Clear the outermost ring of cells of every plane (in place), so the outline closes.

    napari's contour is drawn where a label meets another value, and the image edge is not
    one: with most patches significant, only the holes were outlined, which read as the
    significant regions. With the ring at 0 the regions touching the edge are outlined there
    too. The ring is a quarter token wide; token values are read at token centres
    (:func:`token_grid`), which it never touches.
    """
    for edge in (np.s_[..., 0, :], np.s_[..., -1, :], np.s_[..., :, 0], np.s_[..., :, -1]):
        labels[edge] = 0
    return labels


def _supersample(kind: str) -> int:
    return OUTLINE_SUPERSAMPLE if kind == "significant" else 1


def token_grid(labels: np.ndarray) -> np.ndarray:
    """The significant layer's data back on the token grid (one cell per token)."""
    k = OUTLINE_SUPERSAMPLE
    return np.asarray(labels)[..., k // 2::k, k // 2::k]


def contrast_limits(record: RunRecord, kind: str) -> tuple[float, float]:
    """The layer's contrast limits: the map's raw values, never rescaled per image; a
    signed map's raw and regularized layers are centred at 0 (``(−m, m)``)."""
    if kind in ("posterior", "pvalue"):
        his = [MAPS_BY_KEY[kind].limits(r)[1] for r in record.results.values()]
        return (0.0, max(his))
    # attention and regularized share limits so the two maps compare at a glance; the 99.5th
    # percentile keeps one outlier token (a common ViT artefact) from darkening the rest
    values = np.concatenate([r.attention.ravel() for r in record.results.values()])
    if MapInfo.of(record.any_result).signed:
        top = float(np.percentile(np.abs(values), 99.5)) or float(np.abs(values).max()) or 1.0
        return (-top, top)
    hi = float(np.percentile(values, 99.5))
    return (0.0, hi if hi > 0 else float(values.max()) or 1.0)


# ---- colormaps ---------------------------------------------------------------------------
def overlay_colormap(kind: str, signed: bool = False):
    """The map's colormap (core.display) with an alpha ramp from 0, so zeros vanish.

    ``signed``: the raw and regularized layers of a signed map are drawn in the diverging
    :data:`SIGNED_COLORMAP`, transparent at its centre (0) and opaque towards both ends.
    """
    from napari.utils.colormaps import Colormap, ensure_colormap

    diverging = signed and kind in ("attention", "regularized")
    name = SIGNED_COLORMAP if diverging else MAPS_BY_KEY[kind].colormap
    colors = np.array(ensure_colormap(name).colors, dtype=float)  # 256 RGBA entries
    ramp = np.linspace(0.0, 1.0, len(colors))
    if diverging:
        ramp = np.abs(2.0 * ramp - 1.0)  # 0 at the centre: "neither for nor against" vanishes
    colors[:, 3] = np.clip(ramp * 2.5, 0.0, 1.0)
    suffix = "transparent at 0" if diverging else "transparent low"
    return Colormap(colors=colors, name=f"attnreg {name} ({suffix})")


def significant_colormap():
    """Every non-zero label in SIGNIFICANT_COLOR (also labels the analyst paints), 0 clear."""
    from napari.utils.colormaps import DirectLabelColormap

    return DirectLabelColormap(color_dict={None: SIGNIFICANT_COLOR, 0: "transparent",
                                           1: SIGNIFICANT_COLOR})


# ---- viewer side (GUI thread only) ------------------------------------------------------------
def find_output(viewer: Any, record: RunRecord, kind: str) -> Any | None:
    """The output layer of ``kind`` of ``record``, if it is still in the viewer.

    Only the tracked object counts: a layer with the same run id in its metadata that is
    not that object is a copy the analyst made (Duplicate Layer), and is left alone.
    """
    layer = record.outputs.get(kind)
    return layer if layer is not None and layer in viewer.layers else None


def is_user_copy(layer: Any, records: Any) -> bool:
    """A layer carrying a run's id in its metadata that is not that run's own layer."""
    meta = layer.metadata.get(META_KEY) if isinstance(layer.metadata, dict) else None
    if not meta:
        return False
    return not any(layer is out for record in records for out in record.outputs.values()
                   if record.run_id == meta.get("run_id"))


def _metadata(record: RunRecord, kind: str, made: Mapping[str, Any] | None = None
              ) -> dict[str, Any]:
    """The layer's ``metadata``; ``provenance`` is the run's resolved record (what it used, the
    thresholds in force), the one every saved file and table of this run states."""
    result = record.any_result
    return {META_KEY: {
        "provenance": dict(made if made is not None else run_provenance(record)),
        "kind": kind,
        "run_id": record.run_id,
        "preset": record.preset,
        "legend": legend(kind, record.preset, result),
        "map": MapInfo.of(result).caption(),
        "map_signed": MapInfo.of(result).signed,
        "source": record.source_name,
        "source_id": str(record.source_id),
        "planes": [list(p) for p in sorted(record.results)],
        "run": dict(record.params),
        "thresholds": dict(record.thresholds),
        "pi0": {str(list(p)): float(r.pi0) for p, r in record.results.items()},
        "token_scale": list(result.token_scale),
        "token_translate": list(result.token_translate),
        "cells_per_token": _supersample(kind),
    }}


#: The name the dock last gave each output layer (weakly): one the analyst changed is theirs.
_NAMES_GIVEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def give_name(layer: Any, name: str) -> None:
    """Name an output layer as the dock does (renamed since, it is the analyst's)."""
    layer.name = name
    _NAMES_GIVEN[layer] = layer.name  # as napari kept it (it numbers a name already taken)


def renamed_by_analyst(layer: Any) -> bool:
    """Whether the analyst renamed this output layer since the dock named it."""
    return _NAMES_GIVEN.get(layer, layer.name) != layer.name


def upsert_outputs(viewer: Any, record: RunRecord,
                   kinds: tuple[str, ...] = KINDS, new_run: bool = False) -> dict[str, Any]:
    """Add the output layers of ``record`` or update those of an earlier run in place.

    Layers are the ones ``record.outputs`` tracks (metadata may have been edited or copied);
    an existing layer keeps its place, visibility, opacity, colormap and the contrast
    limits the analyst set. One the analyst renamed keeps its name; with ``new_run`` (the
    maps of another run, not new thresholds) it keeps its maps too, and a new layer takes
    its place in the tracking: renamed to keep a result, it was overwritten by the next run.
    """
    maps = stacked_maps(record, kinds)
    made = run_provenance(record)
    layers: dict[str, Any] = {}
    for kind in kinds:
        data, kwargs, _ = output_layer_data(record, kind, maps[kind], made)
        transform = {k: kwargs[k] for k in TRANSFORM_KEYS if k in kwargs}
        name, meta = kwargs["name"], kwargs["metadata"]
        layer = find_output(viewer, record, kind)
        if layer is not None and new_run and renamed_by_analyst(layer):
            layer = None  # the analyst's now, with the maps it was named for
        if layer is not None and layer.ndim != maps[kind].ndim:
            index = viewer.layers.index(layer)
            viewer.layers.remove(layer)
            layer = None
        else:
            index = None
        if layer is None:
            layer = _add_output(viewer, kind, data, kwargs)
            if index is not None:
                viewer.layers.move(viewer.layers.index(layer), index)
        else:
            # transform first so the new data never renders for a frame at the old extent
            _set_transform(layer, transform)
            layer.data = maps[kind]
            layer.metadata = meta
            if not renamed_by_analyst(layer):
                give_name(layer, name)
            if kind != "significant":
                _follow_colormap(layer, kwargs["colormap"])
                _follow_limits(layer, kwargs["contrast_limits"])
        _NAMES_GIVEN.setdefault(layer, layer.name)
        if kind == "significant":
            sync_outline(viewer, layer)
        layers[kind] = layer
        record.outputs[kind] = layer
    return layers


def _follow_colormap(layer: Any, colormap: Any) -> None:
    """A re-run with another kind of map (signed or not) brings its colormap, unless the
    analyst chose one of their own."""
    current = layer.colormap.name
    if current.startswith("attnreg ") and current != colormap.name:
        layer.colormap = colormap


#: The contrast limits the dock last gave each output layer (weakly: a closed layer goes).
_LIMITS_SET: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _follow_limits(layer: Any, limits: tuple[float, float]) -> None:
    """A re-run brings its maps' contrast limits, unless the analyst set their own: each
    threshold move set them back to the automatic ones (which a move does not change)."""
    last = _LIMITS_SET.get(layer)
    if last is None or np.allclose(layer.contrast_limits, last):
        layer.contrast_limits = limits
        _LIMITS_SET[layer] = tuple(layer.contrast_limits)


def place_outputs(viewer: Any, record: RunRecord) -> None:
    """Move the tracked output layers onto ``record.geometry`` (after the source moved)."""
    for kind in KINDS:
        layer = find_output(viewer, record, kind)
        if layer is None:
            continue
        _set_transform(layer, token_transform(record.geometry, record.any_result,
                                              _supersample(kind)))
        if kind == "significant":
            sync_outline(viewer, layer)


def _set_transform(layer: Any, transform: dict[str, Any]) -> None:
    # only what changed: each assignment re-slices the layer and re-checks the dims
    for key, value in transform.items():
        if key in ("units", "axis_labels"):
            if tuple(str(u) for u in getattr(layer, key)) != tuple(value):
                setattr(layer, key, value)
            continue
        current = getattr(layer, key)
        current = current.affine_matrix if key == "affine" else current
        if np.shape(current) != np.shape(value) or not np.allclose(current, value):
            setattr(layer, key, value)


def output_style(kind: str, limits: tuple[float, float] | None = None,
                 outlined: bool = True, signed: bool = False) -> dict[str, Any]:
    """How an output layer of ``kind`` is drawn (colormap, blending, opacity, visibility):
    the dock's new layers and the layers the readers reopen look alike.

    ``outlined``: the significant labels will be drawn by a thin outline layer above them
    (:func:`.outline.sync_outline`), so they start hidden; without one (a reader alone) their
    filled patches are shown half transparent. ``signed``: a signed map's (diverging
    colormap, see :func:`overlay_colormap`).
    """
    if kind == "significant":
        # one colour, where random colours per region suggested classes that do not exist
        return {"opacity": 0.5, "colormap": significant_colormap(),
                "visible": VISIBLE[kind] and not outlined}
    style = {"colormap": overlay_colormap(kind, signed), "blending": "translucent",
             "opacity": 0.85 if kind != "attention" else 0.75, "visible": VISIBLE[kind],
             "interpolation2d": "nearest"}
    if limits is not None:
        style["contrast_limits"] = tuple(limits)
    return style


def output_layer_data(record: RunRecord, kind: str, data: np.ndarray,
                      made: Mapping[str, Any] | None = None, outlined: bool = True
                      ) -> LayerData:
    """One output layer of ``record`` as napari layer data: the map on the token grid, placed
    on the source (scale, translate, units, rotate, shear, affine), its name, metadata
    (``made``: the run's provenance) and style. The dock adds these layers; the result-file
    reader returns them (:func:`result_layers`)."""
    limits = None if kind == "significant" else contrast_limits(record, kind)
    signed = MapInfo.of(record.any_result).signed
    kwargs = {"name": layer_name(record.source_name, kind, record.preset, map_label(record)),
              "metadata": _metadata(record, kind, made),
              **token_transform(record.geometry, record.any_result, _supersample(kind)),
              **output_style(kind, limits, outlined, signed)}
    return data, kwargs, "labels" if kind == "significant" else "image"


def result_layers(results: Mapping[PlaneIndex, AttentionResult], source_name: str,
                  geometry: SourceGeometry,
                  params: Mapping[str, Any] | None = None) -> list[LayerData]:
    """The output layers of saved ``results`` (by plane) over a source at ``geometry``, as
    the dock makes them (:func:`output_layer_data`), the significant outline last, with no
    viewer and no dock."""
    session = Session()
    session.add(source_name, results, params=params)
    record = RunRecord(session, source_name, source_name, geometry)
    maps = stacked_maps(record)
    made = run_provenance(record)
    layers = [output_layer_data(record, kind, maps[kind], made) for kind in KINDS]
    data, kwargs, _ = layers[-1]
    return [*layers, outline_layer_data(data, kwargs)]


def _add_output(viewer: Any, kind: str, data: np.ndarray, kwargs: dict[str, Any]) -> Any:
    if kind == "significant":
        layer = viewer.add_labels(data, **kwargs)
        layer.selected_label = 1  # painting adds to the significant class
        return layer
    layer = viewer.add_image(data, **kwargs)
    _LIMITS_SET[layer] = tuple(layer.contrast_limits)
    layer.colorbar.visible = True  # drawn only while the layer itself is visible
    title_colorbar(layer)
    return layer


def title_colorbar(layer: Any) -> None:
    """Name the layer's colorbar: napari's per-layer name overlay, tiled beside the bar.

    Without it two visible maps showed two anonymous bars. napari < 0.9 has no per-layer
    name overlay: the bar stays untitled there.
    """
    overlay = getattr(layer, "name_overlay", None)
    if overlay is None:
        return
    overlay.position = layer.colorbar.position
    overlay.font_size = layer.colorbar.font_size
    overlay.visible = True


def show_colorbars_of(viewer: Any, records: Sequence[RunRecord], shown: RunRecord) -> None:
    """Colour bars (and their titles) for the maps of ``shown`` only.

    napari draws every visible layer's bar in the same canvas corner, so with two images'
    results on screen their bars lay over each other; the chosen image's bars are the ones
    its thresholds, inspector and ROI table speak about.
    """
    for record in records:
        for kind in CONTINUOUS_KINDS:
            layer = find_output(viewer, record, kind)
            if layer is None:
                continue
            layer.colorbar.visible = record is shown
            overlay = getattr(layer, "name_overlay", None)
            if overlay is not None:
                overlay.visible = record is shown


def refresh_thresholds(viewer: Any, record: RunRecord) -> dict[str, Any]:
    """Recompute only the threshold-dependent layers (regularized, significant) in place."""
    return upsert_outputs(viewer, record, kinds=("regularized", "significant"))
