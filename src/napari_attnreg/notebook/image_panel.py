"""The image being analysed: a 2D image, an nD stack or a slide, the plane on screen and its
sliders.

What the image is (an array, a file read into memory, a slide left on disk) is its
:mod:`~.sources` object; this panel draws it on a :class:`~.render.DisplayGrid` of at most
``max_display`` pixels a side: a plane subsampled, a slide from its overview.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as W
import numpy as np

from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.images import IntensityScaling, scale_intensity, to_channels_last
from napari_attnreg.core.run.options import validate_options
from napari_attnreg.io.geojson import full_resolution_factor
from napari_attnreg.notebook import render
from napari_attnreg.notebook.sources import DiskSource, MemorySource, open_source
from napari_attnreg.notebook.state import ExplorerState

#: Overview pixels read per display pixel: twice the display's resolution a side, so the
#: nearest-pixel sampling onto the display grid picks from a finer image than it shows.
OVERVIEW_PER_DISPLAY = 4


def check_max_display(max_display: Any) -> int:
    """``max_display`` as a positive int, else a ValueError that says what to pass."""
    if isinstance(max_display, bool) or not isinstance(max_display, (int, np.integer)) \
            or max_display < 1:
        raise ValueError(f"max_display must be a whole number of pixels ≥ 1 (e.g. 768, the "
                         f"long side of the displayed image), got {max_display!r}.")
    return int(max_display)


class ImagePanel(W.HBox):
    """One slider per leading axis of a stack; holds the display image of the chosen plane.

    The sliders move ``state.slice_index``; the explorer re-renders when it changes.
    """

    def __init__(self, state: ExplorerState, *, max_display: int, run_options: dict) -> None:
        super().__init__(layout=W.Layout(display="none"))
        self.state = state
        self.max_display = check_max_display(max_display)
        self._display_options = {k: run_options.get(k) for k in ("channels", "merge")}
        self._window = run_options.get("intensity_window")
        self.source: MemorySource | DiskSource | None = None
        self.sliders: list[W.IntSlider] = []
        self._following = False  # sliders being set from the state: nothing to push back
        # explorer.slice_index = (3,) in code moves the sliders too, or they read another
        # plane than the one shown and analysed
        state.observe(self._to_sliders, "slice_index")

    def load(self, image: Any, *, channel_axis: int | None, rgb: bool | None) -> tuple[int, ...]:
        """Take a new image, array, file or slide (all checks first: a bad one leaves the
        current one); returns the stack shape (``()`` for a 2D image).

        Raises
        ------
        ValueError
            An empty, NaN/Inf, constant or wrongly shaped image, or an unreadable file (the
            core's and the readers' messages).
        """
        source = open_source(image, channel_axis=channel_axis, rgb=rgb)
        grid = render.DisplayGrid.for_shape(source.plane_shape, self.max_display)
        base = self._base(source, grid, tuple(0 for _ in source.stack_shape))
        self.source, self.grid, self.base = source, grid, base
        self.plane_shape = source.plane_shape
        self._build_sliders(source.stack_shape)
        return source.stack_shape

    def _base(self, source: MemorySource | DiskSource, grid: render.DisplayGrid,
              plane: tuple[int, ...]) -> np.ndarray:
        """The display image of ``plane`` on ``grid``: a plane subsampled, or a slide's
        overview (another pixel grid over the same picture)."""
        hd, wd = grid.shape
        pixels = self.display_image(*source.display_pixels(plane, OVERVIEW_PER_DISPLAY * hd * wd),
                                    source=source)
        if pixels.shape[:2] != grid.image_shape:
            grid = grid.over(pixels.shape[:2])
        return grid.sample(pixels)

    def display_image(self, plane: np.ndarray, channel_axis: int | None,
                      source: MemorySource | DiskSource | None = None) -> np.ndarray:
        """The plane as float [0, 1] grey or RGB, as the model's input preparation scales it
        (``source``: the image it comes from, default the one loaded)."""
        arr = to_channels_last(plane, channel_axis=channel_axis, **self._display_options)
        shown = scale_intensity(arr, window=self._scaling_window(source or self.source))
        if shown.ndim == 3 and shown.shape[-1] == 2:  # two channels: red/green like a microscope
            shown = np.concatenate([shown, np.zeros_like(shown[..., :1])], axis=-1)
        return shown

    def _scaling_window(self, source: Any) -> tuple[float, float] | None:
        """The intensity window a run of this image uses (a DICOM's stored one by default),
        so the picture is what the model sees; None: percentiles. A window the image cannot
        give ('stored 3' of a file with two) is the run's to refuse; shown by percentiles."""
        extra = getattr(source, "extra", None) or {}
        try:
            return IntensityScaling.of(validate_options(
                {"intensity_window": self._window or "auto"})["intensity_window"], extra).window
        except ValueError:
            return None

    def show_plane(self) -> None:
        """Recompute the display image of the plane on screen (ValueError: it stays as it was)."""
        self.base = self._base(self.source, self.grid, tuple(self.state.slice_index))

    def _ratio(self, result: AttentionResult) -> float:
        # result pixels per picture pixel: a slide shown at level 0 with a level-1 result, 0.5
        return self.source.downsample / full_resolution_factor(result)

    def grid_for(self, result: AttentionResult) -> render.DisplayGrid:
        """The display grid over ``result``'s pixels: :attr:`grid` itself, or, for a result
        of another slide level than the picture's (the overview stays the picture), the same
        display pixels over the result's grid."""
        ratio = self._ratio(result)
        if ratio == 1 and tuple(result.image_shape) == self.grid.image_shape:
            return self.grid
        return self.grid.over(result.image_shape, (ratio, ratio))

    def on_result(self, result: AttentionResult, row: float, col: float) -> tuple[float, float]:
        """A point of the picture (pixel centres at whole numbers) in ``result``'s pixels."""
        ratio = self._ratio(result)
        return (row + 0.5) * ratio - 0.5, (col + 0.5) * ratio - 0.5

    def _build_sliders(self, lead: tuple[int, ...]) -> None:
        # named as the file names the axis (an ImageJ hyperstack's "Z", "T"), else "axis i"
        stack_axes = self.source.stack.stack_axes if self.source.stack is not None else ()
        labels = [self.source.axis_label(axis) for axis in stack_axes]
        self.sliders = [
            W.IntSlider(value=0, min=0, max=n - 1, description=short,
                        continuous_update=False, layout=W.Layout(width="360px"),
                        tooltip=f"Plane along {long} to show and analyse.")
            for (short, long), n in zip(labels, lead)
        ]
        for slider in self.sliders:
            slider.observe(self._from_sliders, "value")
        self.children = tuple(self.sliders)
        self.layout.display = "flex" if lead else "none"
        self.state.slice_index = tuple(0 for _ in lead)

    def _from_sliders(self, _change: dict) -> None:
        if not self._following:
            self.state.slice_index = tuple(s.value for s in self.sliders)

    def _to_sliders(self, change: dict) -> None:
        plane = tuple(change["new"])
        if len(plane) != len(self.sliders):  # a plane not in the stack: the status says so
            return
        self._following = True
        try:
            for slider, index in zip(self.sliders, plane):
                if slider.min <= index <= slider.max:
                    slider.value = index
        finally:
            self._following = False
