"""The significant outline: thin closed paths around the significant regions (a Shapes layer).

napari draws a Labels layer's ``contour`` in data cells, so on a token grid it was a quarter
patch thick on each side and hid small regions. The outline here is the boundary of the
regions (:mod:`napari_attnreg.core.results.outline`), drawn as paths whose width follows the
camera's zoom so it stays :data:`OUTLINE_PX` screen pixels wide at any zoom. It is derived
from the significant Labels layer (the data, which the analyst may paint), and redrawn when
that layer changes. Functions that take a ``viewer`` run on the GUI thread.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from napari_attnreg.core.results.display import SIGNIFICANT_COLOR
from napari_attnreg.core.results.outline import outline_rings

#: Width of the outline on screen, in canvas pixels, at every zoom.
OUTLINE_PX = 1.5
#: ``kind`` in the outline layer's metadata (beside the output kinds).
OUTLINE_KIND = "outline"
#: Width in data units before a camera was read (a reader's layer): half a cell.
DEFAULT_WIDTH = 0.5
#: Layer attributes that place the outline where its labels are.
PLACEMENT = ("scale", "translate", "rotate", "shear", "affine", "units", "axis_labels")
META_KEY = "attnreg"
OUTLINE_LEGEND = ("Outline of the significant patches (drawn from the significant labels "
                  "layer below it; paint or erase there to annotate).")
#: Outline layer of each significant labels layer, both held weakly.
_OUTLINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: Current data width of each outline layer (the width new paths get).
_WIDTHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def outline_paths(token_labels: np.ndarray, cells_per_token: int = 1) -> list[np.ndarray]:
    """Closed paths around the non-zero tokens of a ``(..., gh, gw)`` token-grid label array:
    one ``(n, ndim)`` vertex array per ring, leading coordinates the plane's index, in the
    coordinates of a layer with ``cells_per_token`` cells per token side."""
    labels = np.asarray(token_labels)
    k = cells_per_token
    paths = []
    for lead in np.ndindex(labels.shape[:-2]):
        for ring in outline_rings(labels[lead] > 0):
            head = np.broadcast_to(np.asarray(lead, dtype=float), (len(ring), len(lead)))
            # token t's centre is cell t·k + (k − 1)/2; its edges t ± 1/2 land on cell edges
            paths.append(np.hstack([head, ring * k + (k - 1) / 2]))
    return paths


def outline_layer_data(labels_data: np.ndarray, labels_kwargs: dict[str, Any]
                       ) -> tuple[list[np.ndarray], dict[str, Any], str]:
    """napari layer data of the outline of a significant labels layer given as layer data
    (its array and keyword arguments): placed as the labels are, named after them. No viewer
    needed (the readers return it beside the labels)."""
    meta = labels_kwargs.get("metadata", {}).get(META_KEY, {})
    meta = {**(meta if isinstance(meta, dict) else {}), "kind": OUTLINE_KIND,
            "legend": OUTLINE_LEGEND}
    k = int(meta.get("cells_per_token", 1))
    paths = outline_paths(token_cells(labels_data, k), k)
    kwargs = {"name": outline_name(labels_kwargs.get("name", "significant")),
              "metadata": {META_KEY: meta}, "ndim": np.ndim(labels_data),
              "shape_type": "path", "edge_color": SIGNIFICANT_COLOR, "edge_width": DEFAULT_WIDTH,
              "face_color": "transparent", "opacity": 1.0, "blending": "translucent_no_depth",
              **{key: labels_kwargs[key] for key in PLACEMENT if key in labels_kwargs}}
    return paths, kwargs, "shapes"


def sync_outline(viewer: Any, labels: Any) -> Any:
    """Draw (or redraw) the outline of the significant ``labels`` layer just above it, placed
    as it is; the outline follows the labels' later edits, name and placement."""
    outline = _OUTLINES.get(labels)
    if outline is not None and outline not in viewer.layers:
        outline = None
    if outline is None:
        from napari.layers import Shapes

        data, kwargs, _ = outline_layer_data(labels.data, _as_kwargs(labels))
        outline = viewer.add_layer(Shapes(data or None, **kwargs))
        outline.current_edge_color = SIGNIFICANT_COLOR
        viewer.layers.move(viewer.layers.index(outline), viewer.layers.index(labels) + 1)
        adopt_outline(viewer, labels, outline)
    else:
        _copy_placement(labels, outline)
        set_paths(outline, _token_labels(labels), _cells(labels))
    return outline


def outline_of(labels: Any) -> Any | None:
    """The outline layer drawn for ``labels`` (None before :func:`sync_outline`)."""
    return _OUTLINES.get(labels)


def token_cells(data: np.ndarray, cells_per_token: int) -> np.ndarray:
    """A labels array with ``cells_per_token`` cells per token side back on the token grid."""
    k = cells_per_token
    return np.asarray(data)[..., k // 2::k, k // 2::k]


def _token_labels(labels: Any) -> np.ndarray:
    return token_cells(labels.data, _cells(labels))


def _cells(labels: Any) -> int:
    meta = labels.metadata.get(META_KEY, {}) if isinstance(labels.metadata, dict) else {}
    return int(meta.get("cells_per_token", 1)) if isinstance(meta, dict) else 1


def _as_kwargs(labels: Any) -> dict[str, Any]:
    placed = {key: getattr(labels, key) for key in ("scale", "translate", "rotate", "shear")}
    return {"name": labels.name, "metadata": labels.metadata, **placed,
            "affine": labels.affine.affine_matrix, "units": labels.units,
            "axis_labels": labels.axis_labels}


def adopt_outline(viewer: Any, labels: Any, outline: Any) -> None:
    """Tie ``outline`` to ``labels``: redrawn when they are painted, renamed with them, removed
    with them, and kept :data:`OUTLINE_PX` wide on screen (also a reader's outline, once a
    dock is open)."""
    from qtpy.QtCore import QTimer

    _OUTLINES[labels] = outline
    follow_zoom(viewer, outline)
    labels_ref, outline_ref = weakref.ref(labels), weakref.ref(outline)

    def redraw() -> None:
        lab, out = labels_ref(), outline_ref()
        if lab is not None and out is not None:
            set_paths(out, _token_labels(lab), _cells(lab))

    def redraw_later(event: Any = None) -> None:
        # napari emits ``paint`` as it records the undo step, before the new values are written
        QTimer.singleShot(0, redraw)

    def rename(event: Any = None) -> None:
        lab, out = labels_ref(), outline_ref()
        if lab is not None and out is not None:
            out.name = outline_name(lab.name)

    def drop(event: Any) -> None:  # the outline goes with its labels layer
        out = outline_ref()
        if event.value is labels_ref() and out is not None and out in viewer.layers:
            viewer.layers.remove(out)

    labels.events.paint.connect(redraw_later)
    labels.events.name.connect(rename)
    viewer.layers.events.removed.connect(drop)


def adopt_read_outlines(viewer: Any) -> None:
    """Tie every outline layer a reader opened to its significant labels (same run)."""
    for layer in list(viewer.layers):
        if not is_outline(layer) or any(out is layer for out in _OUTLINES.values()):
            continue
        run = layer.metadata[META_KEY].get("run_id")
        partner = next((lab for lab in viewer.layers if lab.__class__.__name__ == "Labels"
                        and isinstance(lab.metadata.get(META_KEY), dict)
                        and lab.metadata[META_KEY].get("kind") == "significant"
                        and lab.metadata[META_KEY].get("run_id") == run
                        and lab not in _OUTLINES), None)
        if partner is not None:
            adopt_outline(viewer, partner, layer)


def _copy_placement(labels: Any, outline: Any) -> None:
    for key in ("scale", "translate", "rotate", "shear"):
        if not np.allclose(getattr(outline, key), getattr(labels, key)):
            setattr(outline, key, getattr(labels, key))
    if not np.allclose(outline.affine.affine_matrix, labels.affine.affine_matrix):
        outline.affine = labels.affine.affine_matrix


def outline_name(labels_name: str) -> str:
    return f"{labels_name} outline"


def set_paths(layer: Any, token_labels: np.ndarray, cells_per_token: int = 1) -> None:
    """Replace the outline's paths by those of ``token_labels`` (keeping its screen width)."""
    width = _WIDTHS.get(layer, DEFAULT_WIDTH)
    paths = outline_paths(token_labels, cells_per_token)
    layer.data = []
    if paths:
        layer.add_paths(paths, edge_width=width, edge_color=SIGNIFICANT_COLOR)


def data_width(layer: Any, zoom: float) -> float:
    """The edge width, in the layer's data units, that is :data:`OUTLINE_PX` on screen."""
    step = float(np.min(np.abs(np.asarray(layer.scale)[-2:])))
    return OUTLINE_PX / max(zoom * step, 1e-12)


def follow_zoom(viewer: Any, layer: Any) -> None:
    """Keep ``layer``'s paths :data:`OUTLINE_PX` wide on screen as the camera zooms."""
    layer_ref = weakref.ref(layer)
    camera = camera_of(viewer)

    def update(event: Any = None) -> None:
        target = layer_ref()
        if target is None:
            camera.events.zoom.disconnect(update)
            return
        width = data_width(target, camera.zoom)
        _WIDTHS[target] = width
        if len(target.data) and not np.allclose(target.edge_width, width):
            target.edge_width = [width] * len(target.data)
        target.current_edge_width = width

    camera.events.zoom.connect(update)
    update()


def camera_of(viewer: Any) -> Any:
    """The viewer's camera (``viewer.scene.camera`` since napari 0.9, ``viewer.camera`` before)."""
    scene = getattr(viewer, "scene", None)
    return scene.camera if scene is not None else viewer.camera


def is_outline(layer: Any) -> bool:
    meta = layer.metadata.get(META_KEY) if isinstance(layer.metadata, dict) else None
    return isinstance(meta, dict) and meta.get("kind") == OUTLINE_KIND
