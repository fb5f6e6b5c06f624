"""Where the input image sits: its axes and transform, and the transform of token-grid layers.

Captured on the GUI thread from the source layer; no Qt in here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from napari_attnreg.core.results.result import AttentionResult

PlaneIndex = tuple[int, ...]


def named_axes(labels: Any) -> tuple[str, ...]:
    """A layer's ``axis_labels`` when a file named them (``("z", "y", "x")``); empty for
    napari's placeholders (``"-3"``, ``"0"``), which name no axis."""
    labels = tuple(str(a) for a in labels or ())
    return labels if any(not is_placeholder(a) for a in labels) else ()


def is_placeholder(label: str) -> bool:
    """napari's name for an axis nobody named (``"-3"``); its own Merge to Stack puts one in
    front of named axes (``("-3", "y", "x")``)."""
    return bool(re.fullmatch(r"-?\d+", label))


@dataclass(frozen=True)
class SourceGeometry:
    """Axes and transform of the input image layer, captured on the GUI thread.

    Attributes
    ----------
    shape : tuple of int
        Layer shape without the RGB axis (``len == layer.ndim``).
    rgb : bool
    channel_axis : int, optional
        Layer axis holding fluorescence channels.
    scale, translate : tuple of float
    rotate, shear : np.ndarray
        As napari stores them; kept so output layers follow a rotated image too.
    affine : np.ndarray
        The layer's extra ``affine`` (physical → world).
    units : tuple of str
        The layer's ``units`` (``"millimeter"``, ``"pixel"``, ...), one per axis; output
        layers take them, so the viewer's axes and scale bar stay in the source's unit.
    axis_labels : tuple of str
        The axis names a file gave (``("t", "y", "x")``; empty: none): output layers take
        them and the dock names planes by them ("z = 3", not "axis 0 = 3").
    """

    shape: tuple[int, ...]
    rgb: bool
    channel_axis: int | None
    scale: tuple[float, ...]
    translate: tuple[float, ...]
    rotate: np.ndarray = field(compare=False)
    shear: np.ndarray = field(compare=False)
    affine: np.ndarray = field(compare=False)
    units: tuple[str, ...] = ()
    axis_labels: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_layer(cls, layer: Any, channel_axis: int | None = None) -> SourceGeometry:
        shape = tuple(int(s) for s in layer.data.shape[: layer.ndim]) if not layer.multiscale else \
            tuple(int(s) for s in layer.data[0].shape[: layer.ndim])
        if channel_axis is not None and not 0 <= channel_axis < layer.ndim - 2:
            raise ValueError(f"Channel axis {channel_axis} must be one of the non-image axes "
                             f"0–{layer.ndim - 3} of this {layer.ndim}D layer.")
        return cls(
            shape=shape, rgb=bool(layer.rgb), channel_axis=channel_axis,
            scale=tuple(float(v) for v in layer.scale),
            translate=tuple(float(v) for v in layer.translate),
            rotate=np.asarray(layer.rotate, dtype=float),
            shear=np.asarray(layer.shear, dtype=float),
            affine=np.asarray(layer.affine.affine_matrix, dtype=float),
            units=tuple(str(u) for u in layer.units),
            axis_labels=named_axes(getattr(layer, "axis_labels", ())),
        )

    def axis_name(self, axis: int) -> str:
        """``"z"`` where the file named the axis, ``"axis 0"`` where it did not."""
        named = len(self.axis_labels) == self.ndim and not is_placeholder(self.axis_labels[axis])
        return self.axis_labels[axis] if named else f"axis {axis}"

    def plane_name(self, plane: PlaneIndex) -> str:
        """``"z = 3"`` (``"axis 0 = 3"`` where the axis has no name); ``", "`` between axes."""
        return ", ".join(f"{self.axis_name(a)} = {i}" for a, i in zip(self.stack_axes, plane))

    def spatial(self) -> dict[str, list]:
        """Where the image plane lies (its last two axes): the record a result keeps as
        ``metadata["spatial"]``, so a result file reopens in the same units and place."""
        units = list(self.units[-2:]) if len(self.units) >= 2 else ["pixel", "pixel"]
        return {"scale": list(self.scale[-2:]), "translate": list(self.translate[-2:]),
                "units": units}

    @classmethod
    def of_image(cls, shape: tuple[int, int], scale: tuple[float, float] = (1.0, 1.0),
                 translate: tuple[float, float] = (0.0, 0.0),
                 units: tuple[str, str] = ("pixel", "pixel")) -> SourceGeometry:
        """A 2D image placed by ``scale``/``translate`` alone (no layer: a saved result)."""
        return cls(shape=tuple(int(n) for n in shape), rgb=False, channel_axis=None,
                   scale=tuple(float(v) for v in scale),
                   translate=tuple(float(v) for v in translate),
                   rotate=np.eye(2), shear=np.zeros(1), affine=np.eye(3),
                   units=tuple(str(u) for u in units))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def image_shape(self) -> tuple[int, int]:
        return self.shape[-2], self.shape[-1]

    @property
    def stack_axes(self) -> tuple[int, ...]:
        """Axes in front of the image that are not channels: one run per index along them."""
        return tuple(a for a in range(self.ndim - 2) if a != self.channel_axis)

    @property
    def stack_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[a] for a in self.stack_axes)

    def planes(self) -> list[PlaneIndex]:
        return [tuple(int(i) for i in idx) for idx in np.ndindex(self.stack_shape)] \
            if self.stack_axes else [()]

    def same_grid(self, other: SourceGeometry) -> bool:
        return self == other and np.allclose(self.rotate, other.rotate) and \
            np.allclose(self.shear, other.shear) and np.allclose(self.affine, other.affine)

    def linear_matrix(self) -> np.ndarray:
        from napari.utils.transforms import Affine

        return Affine(scale=self.scale, rotate=self.rotate, shear=self.shear).linear_matrix


def token_transform(geometry: SourceGeometry, result: AttentionResult,
                    supersample: int = 1) -> dict[str, Any]:
    """napari transform kwargs of a token-grid output layer over ``geometry``.

    In the input layer's data coordinates a token-grid index ``i`` sits at ``d·i + e``
    (``d = token_scale``, ``e = token_translate = (d − 1)/2`` on the image axes; ``d = C`` and
    ``e = (C − 1)/2`` on a channel axis, so one output plane spans every channel). napari
    applies ``rotate·shear·scale`` then ``translate``, hence ``scale' = scale·d`` and
    ``translate' = translate + (rotate·shear·scale)·e``; rotate, shear, affine and units carry
    over. With ``supersample = k`` each token is k×k cells: ``d = token_scale / k``, same
    rule for e.
    """
    d = np.ones(geometry.ndim)
    e = np.zeros(geometry.ndim)
    d[-2:] = np.asarray(result.token_scale) / supersample
    e[-2:] = (d[-2:] - 1) / 2
    if geometry.channel_axis is not None:
        n_ch = geometry.shape[geometry.channel_axis]
        d[geometry.channel_axis] = n_ch
        e[geometry.channel_axis] = (n_ch - 1) / 2
    scale = np.asarray(geometry.scale) * d
    translate = np.asarray(geometry.translate) + geometry.linear_matrix() @ e
    transform = {"scale": tuple(scale), "translate": tuple(translate),
                 "rotate": geometry.rotate, "shear": geometry.shear, "affine": geometry.affine}
    if geometry.units:
        transform["units"] = geometry.units
    if len(geometry.axis_labels) == geometry.ndim:
        transform["axis_labels"] = geometry.axis_labels
    return transform


@dataclass(frozen=True)
class AnalysedGrid:
    """The pixels a run analysed, where they are not the source layer's own: a slide read at
    another pyramid level or resolution than the level its layer shows.

    Analysed pixel ``i`` covers layer pixels ``[f·i, f·(i + 1))`` (``f = factor``), so its
    centre sits at layer pixel ``f·i + (f − 1)/2``; output layers are placed by that rule,
    exactly as a token covers its patch's pixels (:func:`token_transform`).

    Attributes
    ----------
    shape : (int, int)
        ``(H, W)`` of the analysed image.
    factor : (float, float)
        Layer pixels per analysed pixel along rows and columns (above 1: coarser).
    slide : dict
        ``path``, ``level`` and ``mpp`` of the slide read, so a figure can read the same
        pixels again.
    """

    shape: tuple[int, int]
    factor: tuple[float, float]
    slide: dict[str, Any] = field(default_factory=dict, compare=False)

    def place(self, geometry: SourceGeometry) -> SourceGeometry:
        """The analysed image's geometry on a layer placed by ``geometry``."""
        f = np.ones(geometry.ndim)
        f[-2:] = self.factor
        offset = np.zeros(geometry.ndim)
        offset[-2:] = (f[-2:] - 1) / 2
        return SourceGeometry(
            shape=(*geometry.shape[:-2], *self.shape), rgb=geometry.rgb,
            channel_axis=geometry.channel_axis,
            scale=tuple(float(v) for v in np.asarray(geometry.scale) * f),
            translate=tuple(float(v) for v in np.asarray(geometry.translate)
                            + geometry.linear_matrix() @ offset),
            rotate=geometry.rotate, shear=geometry.shear, affine=geometry.affine,
            units=geometry.units, axis_labels=geometry.axis_labels)
