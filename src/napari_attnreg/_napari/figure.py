"""'Export figure…': the chosen image's result as a publication figure (core.results.figure).

The figure is drawn with matplotlib from the result itself, not a screenshot of the canvas:
the image cropped to its extent at its own resolution (or better), the map on top in the
viewer (regularized when none is shown) with its colour bar, the significant outline and
its key beside it, and a scale bar in physical units when the image has them. Only this
result's layers are in it, whatever else the viewer shows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from qtpy.QtWidgets import QPushButton, QWidget

from napari_attnreg._napari.dialogs import save_in_background, save_through_dialog
from napari_attnreg._napari.layers import CONTINUOUS_KINDS
from napari_attnreg._napari.slice_cue import shown_plane
from napari_attnreg.core.results.figure import publication_figure
from napari_attnreg.core.run.images import scale_intensity, to_channels_last


def figure_map(viewer: Any, record: Any) -> str:
    """The map the figure draws: the topmost visible map of ``record``, else regularized."""
    shown = [kind for kind in CONTINUOUS_KINDS
             if (layer := record.outputs.get(kind)) is not None and layer in viewer.layers
             and layer.visible]
    if not shown:
        return "regularized"
    return max(shown, key=lambda kind: viewer.layers.index(record.outputs[kind]))


def plane_image(source: Any, record: Any, plane: tuple[int, ...]) -> np.ndarray:
    """The source layer's image of ``plane``: ``(H, W)``, or ``(H, W, C)`` for colour.

    A slide run at another level than its layer shows draws the pixels it analysed, read
    again from the slide.
    """
    geometry = record.geometry
    if getattr(record, "grid", None) is not None:
        return analysed_pixels(record.grid, source)
    data = source.data[0] if getattr(source, "multiscale", False) else source.data
    if getattr(source, "multiscale", False):  # a pyramid's full resolution: gigabytes
        _check_drawable(tuple(int(n) for n in data.shape[:2]))
    index: list[Any] = [slice(None)] * geometry.ndim
    for axis, i in zip(geometry.stack_axes, plane):
        index[axis] = i
    image = np.asarray(data[tuple(index)])
    if geometry.channel_axis is not None:  # the channel axis is the only one left in front
        # the channels the run analysed, chosen and merged as it did, each scaled to [0, 1]:
        # raw 16-bit channels drawn as RGB were black, and two channels showed the first only
        made = record.results[plane].metadata if plane in record.results else {}
        image = scale_intensity(to_channels_last(image, channel_axis=0,
                                                 channels=made.get("channels"),
                                                 merge=made.get("merge"),
                                                 max_channels=max(3, image.shape[0])))
    return image


def _check_drawable(shape: tuple[int, int]) -> None:
    """Refuse a figure of more pixels than the untiled budget, before they are read."""
    from napari_attnreg.core.run.lazy import MAX_UNTILED_PIXELS

    h, w = shape
    if h * w > MAX_UNTILED_PIXELS:
        raise ValueError(f"A figure draws the image at the resolution analysed, {h}x{w} pixels "
                         f"here, above the {MAX_UNTILED_PIXELS:,} a figure can hold; run at a "
                         "coarser Slide level or Slide resolution for a figure.")


def analysed_pixels(grid: Any, source: Any) -> np.ndarray:
    """The slide's pixels a run analysed (``grid.shape``), for its figure.

    Raises
    ------
    ValueError
        Above the untiled pixel budget (a figure at the resolution analysed could not be
        held), or the slide file is gone.
    """
    from napari_attnreg.io.readers import open_for_run

    _check_drawable(grid.shape)
    path = Path(str(grid.slide.get("path", "")))
    if not path.exists():  # a file, or a DICOM slide's folder
        raise ValueError(f"The slide file {path} of {source.name!r} is no longer there; open "
                         "it again to export this figure.")
    stack, _info = open_for_run(path, {"tiled": False, "level": grid.slide.get("level"),
                                       "mpp": grid.slide.get("mpp"),  # one of the two
                                       "channel": grid.slide.get("channel")})
    return np.asarray(stack.data)


def export_figure(viewer: Any, record: Any, source: Any, path: str | Path, *,
                  map_key: str | None = None, scale: int | None = None) -> Path:
    """Write the figure of ``record`` (the plane in view) to ``path`` (PNG); returns it."""
    return figure_job(viewer, record, source, path, map_key=map_key, scale=scale)()


def figure_job(viewer: Any, record: Any, source: Any, path: str | Path, *,
               map_key: str | None = None, scale: int | None = None) -> Callable[[], Path]:
    """:func:`export_figure` in two steps: what the viewer shows is read now (GUI thread),
    and the returned call reads the pixels and draws and writes the PNG (any thread: a
    slide's figure at level 0 takes half a minute)."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        path = path.with_name(path.name + ".png")
    plane = shown_plane(record.geometry, viewer.dims.point) or ()
    if plane not in record.results:
        plane = sorted(record.results)[0]
    result = record.shown(plane)
    key = map_key or figure_map(viewer, record)

    def write() -> Path:
        return publication_figure(result, plane_image(source, record, plane), path,
                                  map_key=key, scale=scale)

    return write


class FigureButton(QPushButton):
    """'Export figure…' (a file dialog, then :func:`export_figure`)."""

    def __init__(self, viewer: Any, current_record: Callable[[], Any],
                 source_of: Callable[[Any], Any], parent: QWidget | None = None) -> None:
        super().__init__("Export figure…", parent)
        self._viewer = viewer
        self._current_record = current_record
        self._source_of = source_of
        self.worker: Any = None  # the figure being written, if any (save_in_background)
        self.setToolTip("Save the chosen image's result as a PNG for publication: the image at "
                        "its own resolution with the map on top in the viewer, its colour bar, "
                        "the significant outline and its key, and a scale bar where the image "
                        "has a physical pixel size. Only this result's layers are drawn.")
        self.clicked.connect(self._on_clicked)

    def _on_clicked(self) -> None:
        from napari.utils.notifications import show_warning

        record = self._current_record()
        source = None if record is None else self._source_of(record)
        if record is None or source is None:
            show_warning("Run the chosen image first: the figure shows its result.")
            return
        self.worker = save_in_background(
            self, "Export figure", "attention_figure.png", "PNG (*.png)",
            lambda path: figure_job(self._viewer, record, source, path),
            lambda written: f"Figure written to {written}", "Exporting figure…")


def export_geojson(viewer: Any, record: Any, path: str | Path) -> Path:
    """Write the significant regions of ``record`` (the plane in view) as GeoJSON polygons
    in image pixels, the file QuPath opens (:mod:`napari_attnreg.io.geojson`)."""
    from napari_attnreg.io.geojson import write_geojson

    plane = shown_plane(record.geometry, viewer.dims.point) or ()
    if plane not in record.results:
        plane = sorted(record.results)[0]
    return write_geojson(path, record.shown(plane))


class GeoJsonButton(QPushButton):
    """'Export GeoJSON…': the chosen result's significant regions for QuPath."""

    def __init__(self, viewer: Any, current_record: Callable[[], Any],
                 parent: QWidget | None = None) -> None:
        super().__init__("Export GeoJSON…", parent)
        self._viewer = viewer
        self._current_record = current_record
        self.setToolTip("Save the chosen image's significant regions as GeoJSON polygons in "
                        "image pixels (QuPath: File ▸ Import objects), each with its patches, "
                        "area, mean attention and mean evidence. Open a .geojson file in "
                        "napari to use its polygons as ROIs.")
        self.clicked.connect(self._on_clicked)

    def _on_clicked(self) -> None:
        from napari.utils.notifications import show_warning

        record = self._current_record()
        if record is None:
            show_warning("Run the chosen image first: the file holds its significant regions.")
            return
        save_through_dialog(self, "Export GeoJSON", "significant.geojson",
                            "GeoJSON (*.geojson)",
                            lambda path: export_geojson(self._viewer, record, path),
                            lambda written: f"Significant regions written to {written}")
