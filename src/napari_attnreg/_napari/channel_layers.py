"""Fluorescence channels that napari shows as separate layers, analysed together.

napari opens a multichannel file as one layer per channel (DAPI, GFP, mCherry), and so does
this plugin's OME-TIFF reader. The dock analyses channels along an axis of one layer, so it
offers to join same-size layers into one: napari's own "Merge to Stack", except that the
analyst's layers are kept as they are (napari's action removes them) and the joined layer is
added hidden, so the picture on screen does not change.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from napari_attnreg._napari.geometry import named_axes
from napari_attnreg._napari.layers import META_KEY

#: The name the joined layer gives its new first axis (the dock lists it as "axis 0 · c").
CHANNEL_AXIS_LABEL = "c"


def _joinable(layer: Any) -> bool:
    from napari.layers import Image

    metadata = layer.metadata if isinstance(layer.metadata, dict) else {}
    return isinstance(layer, Image) and not layer.rgb and not layer.multiscale \
        and META_KEY not in metadata  # never an output layer of this plugin


def _same_place(a: Any, b: Any) -> bool:
    return tuple(a.data.shape) == tuple(b.data.shape) \
        and np.allclose(a.scale, b.scale) and np.allclose(a.translate, b.translate) \
        and np.allclose(a.affine.affine_matrix, b.affine.affine_matrix) \
        and np.allclose(a.rotate, b.rotate)


def channel_siblings(viewer: Any, layer: Any) -> list[Any]:
    """The image layers that can be channels of one image together with ``layer``.

    Parameters
    ----------
    viewer : napari.Viewer
    layer : napari.layers.Image
        The image chosen in the dock.

    Returns
    -------
    list of napari.layers.Image
        ``layer`` and the grey (not RGB), single-scale image layers of its size placed where it
        is, in layer-list order; the layers selected in the layer list instead when ``layer``
        is one of two or more selected. Fewer than two: nothing to join.
    """
    if layer is None or not _joinable(layer):
        return []
    selected = [lyr for lyr in viewer.layers if lyr in viewer.layers.selection]
    pool = selected if layer in selected and len(selected) > 1 else list(viewer.layers)
    found = [lyr for lyr in pool
             if lyr is layer or (_joinable(lyr) and _same_place(lyr, layer))]
    return found if len(found) > 1 else []


def joined_name(layers: list[Any]) -> str:
    """``"cells · DAPI + GFP"`` for layers named ``"cells · DAPI"`` and ``"cells · GFP"``."""
    names = [str(layer.name) for layer in layers]
    common = os.path.commonprefix(names)
    head = common[: common.rfind(" · ") + 3] if " · " in common else ""
    return head + " + ".join(name[len(head):] for name in names)


def join_channel_layers(viewer: Any, layers: list[Any]) -> Any:
    """Add one hidden image layer holding ``layers`` as channels along a new first axis.

    The analyst's layers stay in the viewer, untouched; the new layer takes the first one's
    scale, units, axis names and metadata (its pixel size), with the channel axis in front.

    Parameters
    ----------
    viewer : napari.Viewer
    layers : list of napari.layers.Image
        Two or more grey image layers of one size, as :func:`channel_siblings` gives them.

    Returns
    -------
    napari.layers.Image
        The layer added.
    """
    from napari.layers.utils.stack_utils import images_to_stack

    if len(layers) < 2:
        raise ValueError("Choose two or more image layers of the same size to join as channels.")
    first = layers[0]
    for other in layers[1:]:
        if not (_joinable(other) and _same_place(other, first)):
            raise ValueError(f"{other.name!r} is not a grey image of {first.name!r}'s size and "
                             "place; only such layers can be channels of one image.")
    names = named_axes(first.axis_labels)
    extra: dict[str, Any] = {"name": joined_name(layers), "visible": False,
                             "metadata": {**(first.metadata if isinstance(first.metadata, dict)
                                             else {}),
                                          "channel_layers": [str(lyr.name) for lyr in layers]}}
    joined = images_to_stack(list(layers), axis=0, **extra)
    if names:  # the file named the axes: name the new one too ("axis 0 · c", not "-3")
        joined.axis_labels = (CHANNEL_AXIS_LABEL, *names)
    for layer in layers:  # the joined layer holds a copy: a later edit of a channel makes it stale
        layer.events.data.connect(_marks_stale(joined, layer))
    viewer.add_layer(joined)
    return joined


def _marks_stale(joined: Any, layer: Any) -> Any:
    def mark(event: Any = None) -> None:
        joined.metadata[STALE_KEY] = str(layer.name)
    return mark


#: Metadata key of a joined layer one of whose channel layers changed after the join.
STALE_KEY = "channel_layer_changed"


def check_not_stale(layer: Any) -> None:
    """Refuse a joined layer whose channel layers changed since they were joined (its copy
    would be analysed, not what the analyst now sees)."""
    metadata = layer.metadata if isinstance(layer.metadata, dict) else {}
    if STALE_KEY in metadata:
        raise ValueError(f"{metadata[STALE_KEY]!r} changed after {layer.name!r} was joined from "
                         "it; choose one of the channel layers and press 'Join layers as "
                         "channels' again.")
