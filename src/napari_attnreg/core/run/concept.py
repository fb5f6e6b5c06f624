"""Concepts for class maps on models without a classification head.

A concept is a vector of the model's width: the mean final-norm CLS token of a few example
images, or of crops around the regions of an image's mask (an analyst outlines a few nuclei;
the class map then shows which patches make an image look like them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy import ndimage

from napari_attnreg.core.models.backbones import Backbone, load_backbone
from napari_attnreg.core.models.scorers.target import final_cls
from napari_attnreg.core.run.images import prepare_image

#: Each crop around a mask region is its bounding box grown by this share of its side on
#: every side, so the CLS token sees the object with a little of its surroundings.
CROP_MARGIN = 0.25


def concept_from(examples: Any, model: Backbone | str = "demo", mask: Any = None, *,
                 channel_axis: int | None = None, channels: Sequence[int] | None = None,
                 merge: str | None = None) -> np.ndarray:
    """A concept: the mean final-norm CLS token of example images or of a mask's regions.

    Parameters
    ----------
    examples : array or sequence of arrays
        Example images of the concept (each prepared as a run prepares its image), or, with
        ``mask``, the one image whose regions show it.
    model : Backbone or str
        The model the concept is for (anything :func:`load_backbone` takes).
    mask : array, optional
        Boolean or label image of ``examples``' height and width; every connected region
        (every label) gives one crop around it.
    channel_axis, channels, merge : optional
        As in :func:`prepare_image` (give the run's ``channels``/``merge``, so the examples
        are seen as the run sees its image).

    Returns
    -------
    np.ndarray
        float32 vector of the model's width; pass it as ``target=`` of a class map.

    Examples
    --------
    >>> concept = concept_from([nucleus_a, nucleus_b], "demo")          # doctest: +SKIP
    >>> regularize(image, "demo", map="cdam", target=concept)           # doctest: +SKIP
    """
    backbone = model if isinstance(model, Backbone) else load_backbone(model)
    images = _crops(examples, mask, channel_axis) if mask is not None else _as_list(examples)
    tokens = []
    with torch.inference_mode():
        for image in images:
            prepared = prepare_image(image, patch_size=backbone.patch_size, mean=backbone.mean,
                                     std=backbone.std, default_size=backbone.input_size[1:],
                                     channel_axis=channel_axis, channels=channels, merge=merge)
            x = prepared.tensor[None].to(backbone.device)
            tokens.append(final_cls(backbone, x)[0].float().cpu())
    return torch.stack(tokens).mean(dim=0).numpy().astype(np.float32)


def _as_list(examples: Any) -> list[Any]:
    if isinstance(examples, (list, tuple)):
        if not examples:
            raise ValueError("concept_from needs at least one example image.")
        return list(examples)
    return [examples]


def region_count(mask: Any) -> int:
    """How many regions (crops) :func:`concept_from` takes from ``mask``: its labels, or the
    connected components of a boolean mask (front ends say "concept from N regions")."""
    labels = np.asarray(mask)
    if not labels.any():
        return 0
    if labels.dtype == bool or labels.max() <= 1:
        return int(ndimage.label(labels > 0)[1])
    return int(np.unique(labels[labels > 0]).size)


def _crops(image: Any, mask: Any, channel_axis: int | None) -> list[np.ndarray]:
    """One crop of ``image`` around every region of ``mask``."""
    arr = np.asarray(image)
    labels = np.asarray(mask)
    spatial = _spatial_shape(arr, channel_axis)
    if labels.shape != spatial:
        raise ValueError(f"mask has shape {labels.shape} but the image's height and width are "
                         f"{spatial}; draw the mask on this image.")
    if labels.dtype == bool or labels.max() <= 1:
        labels, _ = ndimage.label(labels > 0)
    boxes = [b for b in ndimage.find_objects(labels.astype(np.int64)) if b is not None]
    if not boxes:
        raise ValueError("mask has no regions; outline at least one example of the concept.")
    return [_crop(arr, _grown(box, spatial), channel_axis) for box in boxes]


def _spatial_shape(arr: np.ndarray, channel_axis: int | None) -> tuple[int, int]:
    if channel_axis is not None:
        return tuple(np.delete(arr.shape, channel_axis))  # type: ignore[return-value]
    return tuple(arr.shape[:2])  # type: ignore[return-value]


def _grown(box: Sequence[slice], shape: tuple[int, int], least: int = 32) -> tuple[slice, slice]:
    """``box`` grown by :data:`CROP_MARGIN` on each side (at least ``least`` px), in bounds."""
    out = []
    for s, size in zip(box, shape, strict=True):
        side = s.stop - s.start
        grow = max(int(np.ceil(CROP_MARGIN * side)), (least - side + 1) // 2, 0)
        out.append(slice(max(0, s.start - grow), min(size, s.stop + grow)))
    return out[0], out[1]


def _crop(arr: np.ndarray, box: tuple[slice, slice], channel_axis: int | None) -> np.ndarray:
    if channel_axis is None:
        return arr[box]
    moved = np.moveaxis(arr, channel_axis, -1)[box]
    return np.moveaxis(moved, -1, channel_axis)
