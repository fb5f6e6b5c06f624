"""The image being analysed: a 2D image or an nD stack, the plane on screen and its sliders."""

from __future__ import annotations

from typing import Any

import ipywidgets as W
import numpy as np

from napari_attnreg.core.run.images import scale_intensity, to_channels_last
from napari_attnreg.core.run.planes import PlaneStack
from napari_attnreg.notebook import render
from napari_attnreg.notebook.state import ExplorerState


def check_max_display(max_display: Any) -> int:
    """``max_display`` as a positive int, else a ValueError that says what to pass."""
    if isinstance(max_display, bool) or not isinstance(max_display, (int, np.integer)) \
            or max_display < 1:
        raise ValueError(f"max_display must be a whole number of pixels ≥ 1 (e.g. 768, the "
                         f"long side of the displayed image), got {max_display!r}.")
    return int(max_display)


def plane_stack(image: Any, channel_axis: int | None, rgb: bool | None) -> PlaneStack:
    """The image as a :class:`PlaneStack`: leading axes are planes (one slider each).

    As documented for the explorer, a trailing axis of length 3 or 4 is taken as colour
    unless ``rgb=False`` or a ``channel_axis`` says otherwise.
    """
    shape = np.shape(image)
    if rgb is None and channel_axis is None:
        rgb = len(shape) >= 3 and shape[-1] in (3, 4)
    return PlaneStack.from_array(image, channel_axis=channel_axis, rgb=rgb or None, stack=True)


class ImagePanel(W.HBox):
    """One slider per leading axis of a stack; holds the display image of the chosen plane.

    The sliders move ``state.slice_index``; the explorer re-renders when it changes.
    """

    def __init__(self, state: ExplorerState, *, max_display: int, run_options: dict) -> None:
        super().__init__(layout=W.Layout(display="none"))
        self.state = state
        self.max_display = check_max_display(max_display)
        self._display_options = {k: run_options.get(k) for k in ("channels", "merge")}
        self.stack: PlaneStack | None = None
        self.sliders: list[W.IntSlider] = []

    def load(self, image: Any, *, channel_axis: int | None, rgb: bool | None) -> tuple[int, ...]:
        """Take a new image (all checks first: a bad one leaves the current one); returns the
        stack shape (``()`` for a 2D image).

        Raises
        ------
        ValueError
            An empty, NaN/Inf, constant or wrongly shaped image (the core's messages).
        """
        stack = plane_stack(image, channel_axis, rgb)
        first = stack.planes()[0]
        base = self.display_image(*stack.read(first))
        self.stack = stack
        self.plane_shape = stack.plane_shape
        self.grid = render.DisplayGrid.for_shape(self.plane_shape, self.max_display)
        self.base = self.grid.sample(base)
        self._build_sliders(stack.stack_shape)
        return stack.stack_shape

    def display_image(self, plane: np.ndarray, channel_axis: int | None) -> np.ndarray:
        """The plane as float [0, 1] grey or RGB, as the model's input preparation scales it."""
        arr = to_channels_last(plane, channel_axis=channel_axis, **self._display_options)
        shown = scale_intensity(arr)
        if shown.ndim == 3 and shown.shape[-1] == 2:  # two channels: red/green like a microscope
            shown = np.concatenate([shown, np.zeros_like(shown[..., :1])], axis=-1)
        return shown

    def show_plane(self) -> None:
        """Recompute the display image of the plane on screen (ValueError: it stays as it was)."""
        self.base = self.grid.sample(self.display_image(*self.stack.read(self.state.slice_index)))

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
