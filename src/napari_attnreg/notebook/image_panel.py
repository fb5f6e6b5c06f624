"""The image being analysed: a 2D image or an nD stack, the plane on screen and its sliders."""

from __future__ import annotations

from typing import Any

import ipywidgets as W
import numpy as np

from ..core.images import _check_values, scale_intensity, to_channels_last
from . import render
from .state import ExplorerState


def check_max_display(max_display: Any) -> int:
    """``max_display`` as a positive int, else a ValueError that says what to pass."""
    if isinstance(max_display, bool) or not isinstance(max_display, (int, np.integer)) \
            or max_display < 1:
        raise ValueError(f"max_display must be a whole number of pixels ≥ 1 (e.g. 768, the "
                         f"long side of the displayed image), got {max_display!r}.")
    return int(max_display)


def split_stack(image: Any, channel_axis: int | None,
                rgb: bool | None) -> tuple[np.ndarray, bool, bool]:
    """``(stack, channel_last, channel_explicit)``: the array with any channel axis moved last."""
    arr = np.asarray(image)
    if arr.ndim < 2:
        raise ValueError(f"Expected an image with at least 2 dimensions, got shape {arr.shape}.")
    if channel_axis is not None:
        if arr.ndim < 3:
            raise ValueError("channel_axis needs an image with a channel axis (3D or more).")
        arr, channel_last, explicit = np.moveaxis(arr, channel_axis, -1), True, True
    else:
        if rgb is None:
            rgb = arr.ndim >= 3 and arr.shape[-1] in (3, 4)
        if rgb and (arr.ndim < 3 or arr.shape[-1] not in (3, 4)):
            raise ValueError(f"rgb=True needs a last axis of length 3 or 4, got shape {arr.shape}.")
        channel_last, explicit = bool(rgb), False
    if 0 in arr.shape:
        raise ValueError(f"The image is empty (shape {np.shape(image)}); give the explorer an "
                         "image with at least one pixel along every axis.")
    return arr, channel_last, explicit


class ImagePanel(W.HBox):
    """One slider per leading axis of a stack; holds the display image of the chosen plane.

    The sliders move ``state.slice_index``; the explorer re-renders when it changes.
    """

    def __init__(self, state: ExplorerState, *, max_display: int, run_options: dict) -> None:
        super().__init__(layout=W.Layout(display="none"))
        self.state = state
        self.max_display = check_max_display(max_display)
        self._display_options = {k: run_options.get(k) for k in ("channels", "merge")}
        self.stack: np.ndarray | None = None
        self.channel_explicit = False
        self.sliders: list[W.IntSlider] = []

    def load(self, image: Any, *, channel_axis: int | None, rgb: bool | None) -> tuple[int, ...]:
        """Take a new image (all checks first: a bad one leaves the current one); returns the
        stack shape (``()`` for a 2D image).

        Raises
        ------
        ValueError
            An empty, NaN/Inf, constant or wrongly shaped image (the core's messages).
        """
        stack, channel_last, explicit = split_stack(image, channel_axis, rgb)
        lead = stack.shape[: stack.ndim - (3 if channel_last else 2)]
        first = stack[(0,) * len(lead)]
        base = self.display_image(first, explicit)
        self.stack, self.channel_explicit = stack, explicit
        self.plane_shape = tuple(int(v) for v in first.shape[:2])
        self.grid = render.DisplayGrid.for_shape(self.plane_shape, self.max_display)
        self.base = self.grid.sample(base)
        self._build_sliders(lead)
        return tuple(lead)

    def display_image(self, plane: np.ndarray, explicit: bool) -> np.ndarray:
        """The plane as float [0, 1] grey or RGB, as the model's input preparation scales it."""
        _check_values(np.asarray(plane))  # NaN/Inf/empty: the core's message, not "constant"
        arr = to_channels_last(plane, channel_axis=-1 if explicit else None,
                               **self._display_options)
        shown = scale_intensity(arr)
        if shown.ndim == 3 and shown.shape[-1] == 2:  # two channels: red/green like a microscope
            shown = np.concatenate([shown, np.zeros_like(shown[..., :1])], axis=-1)
        return shown

    def plane(self) -> np.ndarray:
        """The plane on screen (the whole array for a 2D image)."""
        index = tuple(self.state.slice_index)
        return self.stack[index] if index else self.stack

    def show_plane(self) -> None:
        """Recompute the display image of the plane on screen (ValueError: it stays as it was)."""
        self.base = self.grid.sample(self.display_image(self.plane(), self.channel_explicit))

    def _build_sliders(self, lead: tuple[int, ...]) -> None:
        self.sliders = [
            W.IntSlider(value=0, min=0, max=n - 1, description=f"axis {i}",
                        continuous_update=False, layout=W.Layout(width="360px"),
                        tooltip=f"Plane along axis {i} to show and analyse.")
            for i, n in enumerate(lead)
        ]
        for slider in self.sliders:
            slider.observe(self._from_sliders, "value")
        self.children = tuple(self.sliders)
        self.layout.display = "flex" if lead else "none"
        self.state.slice_index = tuple(0 for _ in lead)

    def _from_sliders(self, _change: dict) -> None:
        self.state.slice_index = tuple(s.value for s in self.sliders)
